"""What undo and checkpoints cost a training loop on a GPU, side by side in one run.

    python bindings/python/benches/gpu_loop.py [--device cuda] [--small] [--steps N]
        [--reps N] [--dir DIR] [--threads N]

The model is a stack of 4096x4096 linear layers, about 1 GiB of float32 weights (16
layers; `--small`: 4 layers of 256x256, for a quick run on the CPU) with AdamW (so the
state is about three times the weights), batch 8. Each repetition runs every variant
from the same initial state and batches, in a rotated order; every third step is
rejected where a variant can undo. Variants (ms per step):

- `baseline`: no undo, no checkpoint;
- `deepcopy_device`: a clone of every parameter, buffer and optimizer tensor on the
  device before each step, copied back on a reject;
- `tracker_device_base`: ``track(..., trial_base="device")`` trials (the base on the
  device; kept versions reach the host store in the background);
- `tracker_host_background`: ``track(..., copy_in_background=True)`` trials, base on
  the host (a reject writes back host->device what the step changed);
- `ckpt_safetensors`: ``safetensors.torch.save_file`` of the whole state every step;
- `ckpt_dcp_async_save`: ``torch.distributed.checkpoint.async_save`` every step, waiting
  for the previous one first (skipped with the printed reason where it needs a process
  group).

Two more rows: `stage_to_host` times copying the whole state device->host through the
tracker's staging area (`--staging-mib`, default 256) against one pinned
``copy_(non_blocking=True)`` of the same bytes (baseline) per tensor; `revert_1pct`
times ``tracker.restore`` of a version that differs from the model in 1% of the
weight chunks against ``load_state_dict`` from CPU copies of the state (baseline).

On the CPU (`--device cpu`) the tracker variants use ``staged=True`` so that they run
the device path. Final states are compared bit for bit: `tracker_*` and
`deepcopy_device` against each other (the same decisions), `ckpt_*` against
`baseline`; a mismatch fails the run. Timing waits for the device
(``torch.cuda.synchronize()``) at the end of each loop only.

The tab-separated table on stdout has the columns of the other reports: `scenario`,
`metric`, `baseline`, `store` (the variant), `ratio` = baseline / store.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _report import Report  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.torch  # noqa: E402,F401
from tensor_history.torch import _device  # noqa: E402

REJECT_EVERY = 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Loop:
    def __init__(self, device: torch.device, layers: int, width: int) -> None:
        self.device = device
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            *[torch.nn.Linear(width, width, bias=True) for _ in range(layers)]).to(device)
        self.init = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        g = torch.Generator().manual_seed(1)
        self.batches = [torch.randn(8, width, generator=g).to(device) for _ in range(4)]

    def reset(self) -> torch.optim.Optimizer:
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.init[k])
        return torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self, opt: torch.optim.Optimizer, i: int) -> None:
        opt.zero_grad(set_to_none=True)
        self.model(self.batches[i % len(self.batches)]).pow(2).mean().backward()
        opt.step()

    def tensors(self, opt) -> list:
        out = list(self.model.state_dict().values())
        for st in opt.state.values():
            out += [v for v in st.values() if torch.is_tensor(v)]
        return out

    def final(self, opt) -> dict:
        sd = {f"m/{k}": v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        for i, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    sd[f"o/{i}/{k}"] = v.detach().cpu().clone()
        return sd


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a)


def variants(w: Loop, steps: int, tmp: Path, staged: bool) -> dict:
    def timed(setup, body, end=None):
        opt = w.reset()
        ctx = setup(opt)
        sync(w.device)
        t0 = time.perf_counter()
        for i in range(steps):
            body(ctx, opt, i)
        if end is not None:
            end(ctx)
        sync(w.device)
        return time.perf_counter() - t0, w.final(opt)

    def baseline():
        return timed(lambda opt: None, lambda c, opt, i: w.step(opt, i))

    def deepcopy_device():
        def body(c, opt, i):
            tensors = w.tensors(opt)
            saved = [t.detach().clone() for t in tensors]
            w.step(opt, i)
            if i % REJECT_EVERY == REJECT_EVERY - 1:
                now = w.tensors(opt)
                if len(now) != len(saved):  # the optimizer's state appeared: drop it
                    opt.state.clear()
                with torch.no_grad():
                    for t, s in zip(tensors, saved):
                        t.copy_(s)
        return timed(lambda opt: None, body)

    def tracker(**kw):
        def setup(opt):
            return th.torch.track(w.model, opt, staged=staged, memory_budget=None, **kw)

        def body(tr, opt, i):
            with tr.trial() as t:
                w.step(opt, i)
                if i % REJECT_EVERY != REJECT_EVERY - 1:
                    t.keep()

        def end(tr):
            tr.store.settle()
            print(f"    transfers {tr.transfers()}", file=sys.stderr)

        return timed(setup, body, end)

    def ckpt_safetensors():
        from safetensors.torch import save_file

        path = str(tmp / "state.safetensors")

        def body(c, opt, i):
            w.step(opt, i)
            state = {f"m/{k}": v.contiguous() for k, v in w.model.state_dict().items()}
            for j, st in opt.state_dict()["state"].items():
                for k, v in st.items():
                    if torch.is_tensor(v):
                        state[f"o/{j}/{k}"] = v.contiguous()
            save_file(state, path)
        return timed(lambda opt: None, body)

    def ckpt_dcp():
        import torch.distributed.checkpoint as dcp

        root = tmp / "dcp"

        def body(c, opt, i):
            w.step(opt, i)
            if c[0] is not None:
                c[0].result()
            c[0] = dcp.async_save({"model": w.model.state_dict(), "optim": opt.state_dict()},
                                  checkpoint_id=str(root / f"step-{i % 2}"))

        def end(c):
            if c[0] is not None:
                c[0].result()

        return timed(lambda opt: [None], body, end)

    return {
        "baseline": baseline,
        "deepcopy_device": deepcopy_device,
        "tracker_device_base": lambda: tracker(trial_base="device", copy_in_background=True),
        "tracker_host_background": lambda: tracker(copy_in_background=True),
        "ckpt_safetensors": ckpt_safetensors,
        "ckpt_dcp_async_save": ckpt_dcp,
    }


def loop_rows(w: Loop, steps: int, reps: int, rep: Report, tmp: Path, staged: bool) -> None:
    fns = variants(w, steps, tmp, staged)
    names = list(fns)
    try:
        fns["ckpt_dcp_async_save"]()
    except Exception as e:  # noqa: BLE001 - the reason is printed and the variant skipped
        print(f"  ckpt_dcp_async_save skipped: {type(e).__name__}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        names.remove("ckpt_dcp_async_save")
    times: dict = {n: [] for n in names}
    finals: dict = {}
    for r in range(reps + 1):  # repetition 0 warms up
        k = r % len(names)
        for n in names[k:] + names[:k]:
            print(f"  rep {r} {n}", file=sys.stderr, flush=True)
            dt, st = fns[n]()
            if r > 0:
                times[n].append(dt / steps)
            finals[n] = st
    undo = [n for n in names if n.startswith(("tracker_", "deepcopy_"))]
    for n in undo:
        if not same(finals[n], finals["deepcopy_device"]):
            raise SystemExit(f"{n}: final state differs from deepcopy_device")
    for n in names:
        if n.startswith("ckpt_") and not same(finals[n], finals["baseline"]):
            raise SystemExit(f"{n}: final state differs from baseline")
    base = statistics.median(times["baseline"])
    for n in names[1:]:
        rep.add(f"gpu_loop/{n}", "ms", base, statistics.median(times[n]))


def staging_rows(w: Loop, reps: int, rep: Report, staging: int, staged: bool) -> None:
    opt = w.reset()
    w.step(opt, 0)
    tensors = [t.detach() for t in w.tensors(opt) if t.device == w.device]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    pin = w.device.type == "cuda"
    dst = [torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, pin_memory=pin)
           for t in tensors]
    dev = _device.device_for(w.device, staging)

    def pinned():
        for t, d in zip(tensors, dst):
            d.copy_(_device.flat_bytes(t), non_blocking=True)
        sync(w.device)

    def staged_copy():
        ranges = [(k, 0, t.numel() * t.element_size()) for k, t in enumerate(tensors)]
        srcs = [_device.flat_bytes(t) for t in tensors]
        for batch in _device.pack(ranges, dev.capacity()):
            dev.staging(max(off + e - s for _, s, e, off in batch))
            dev.to_host([(srcs[k][s:e], off) for k, s, e, off in batch]).wait()

    tb, ts = [], []
    for r in range(reps + 1):
        for fn, out in ((pinned, tb), (staged_copy, ts)) if r % 2 == 0 else \
                ((staged_copy, ts), (pinned, tb)):
            t0 = time.perf_counter()
            fn()
            if r:
                out.append(time.perf_counter() - t0)
    print(f"  stage_to_host: {nbytes / 2**20:.0f} MiB, pinned "
          f"{nbytes / statistics.median(tb) / 1e9:.2f} GB/s, staged "
          f"{nbytes / statistics.median(ts) / 1e9:.2f} GB/s", file=sys.stderr)
    rep.add("gpu_loop/stage_to_host", "ms", statistics.median(tb), statistics.median(ts))

    # Revert of a 1% change: the tracker writes the changed chunks back; the baseline
    # loads CPU copies of the whole state.
    tr = th.torch.track(w.model, opt, staged=staged, staging_bytes=staging,
                        memory_budget=None)
    v0 = tr.store.head()
    cpu = {k: v.detach().cpu().clone() for k, v in w.model.state_dict().items()}
    chunk = tr.store.chunk_bytes

    def change():
        with torch.no_grad():
            for p in w.model.parameters():
                flat = p.detach().reshape(-1)
                per = max(1, chunk // p.element_size())
                for c in range(0, flat.numel(), per * 100):  # one chunk in a hundred
                    flat[c:c + per] += 1.0
        tr.commit("1%")

    tb, ts = [], []
    for r in range(reps + 1):
        change()
        sync(w.device)
        t0 = time.perf_counter()
        tr.restore(v0)
        sync(w.device)
        ts_r = time.perf_counter() - t0
        t0 = time.perf_counter()
        w.model.load_state_dict(cpu)
        sync(w.device)
        tb_r = time.perf_counter() - t0
        if r:
            tb.append(tb_r)
            ts.append(ts_r)
    print(f"  revert_1pct transfers {tr.transfers()}", file=sys.stderr)
    rep.add("gpu_loop/revert_1pct", "ms", statistics.median(tb), statistics.median(ts))
    tr.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="4 layers of 256x256 (quick)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--staging-mib", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False "
                         "(use --device cpu --small on a machine without a GPU)")
    layers, width = (4, 256) if a.small else (16, 4096)
    steps = a.steps or (6 if a.small else 12)
    reps = a.reps or (1 if a.small else 3)
    staged = device.type == "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="gpu-loop-", dir=a.dir))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device {device} ({name}), torch {torch.__version__}, threads {a.threads}, "
          f"load {os.getloadavg()[0]:.2f}, staging buffers allocated on first use "
          f"(not prefaulted)", file=sys.stderr)
    w = Loop(device, layers, width)
    print(f"model {layers}x{width}x{width}: "
          f"{sum(p.numel() * p.element_size() for p in w.model.parameters()) / 2**20:.0f} MiB "
          f"of weights, AdamW, {steps} steps, {reps} reps", file=sys.stderr)
    rep = Report()
    try:
        loop_rows(w, steps, reps, rep, tmp, staged)
        staging_rows(w, reps, rep, a.staging_mib << 20, staged)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep.print()


if __name__ == "__main__":
    main()
