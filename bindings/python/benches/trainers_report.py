"""Side-by-side report: tensor-history under the trainers people use, against the
trainers' own checkpoint storage. Same tab-separated columns as `report.py` and the Rust
`bench_report` (ratio = baseline / store, above 1 the store wins); machine facts go to
stderr. Each trainer's part is a function of its own (`--only lightning`).

    python bindings/python/benches/trainers_report.py --only lightning [--quick]
    python bindings/python/benches/trainers_report.py --only ray [--reps 3] [--quick]

Lightning (baseline: `TorchCheckpointIO`, Lightning's default, on the same disk):
a LightningModule of about 100 MB of float32 parameters (an embedding table and an MLP)
trained with AdamW under `Trainer(accelerator="cpu")`, torch on 1 thread;
`ModelCheckpoint(every_n_train_steps=N, save_top_k=3, monitor="train_loss",
save_last=True)` until 20 checkpoints were taken; the same seeds for both runs.

  <scenario>_disk_after_20      bytes under the checkpoint directory (and, for the
                                store, the repository after `Store.gc(grace=0)` twice)
  <scenario>_save_ms            median time of one `save_checkpoint` call (the store's
                                is durable: fsynced; `torch.save` is not)
  <scenario>_resume_ms          median time of `load_checkpoint(last.ckpt)`

Scenarios: `dense` trains every parameter; `finetune` freezes the embedding table
(90% of the parameters, as when fine-tuning a pretrained backbone), so each checkpoint
changes only the head and its optimizer state (AdamW keeps no state for frozen
parameters).

Ray Tune (`--only ray`; examples/python/ray_pbt.py is the run): PBT over learning rates,
8 trials of a small torch MLP (AdamW, 2 x 256 hidden; 0.85 MiB of model and optimizer
state), 12 iterations with a checkpoint each, an exploit round every 3 iterations
(synchronous PBT), Ray with 2 CPUs. Baseline: Ray's default, the trainable writing
`torch.save` of the model and optimizer into the checkpoint directory, every checkpoint
kept (Ray's default `num_to_keep=None`). Store: `tensor_history.ray.checkpoint` into
one repository (a pointer in the directory).
  pbt8_keepall_{disk,wall}    every checkpoint kept by both: bytes under storage_path
                              plus the repository at the end; wall time of `fit()`
  pbt8_keep4_{disk,wall}      both with num_to_keep=4 (above the perturbation interval,
                              as PBT needs), the store's run with gc_callback (every 16
                              checkpoints, grace 5 s) and a last gc after `fit()`
                              (grace 0, no trial running; not in the wall time)
  pbt8_{keepall,keep4}_trials_done
                              from `fit()`'s start to the last trial's completion (a
                              driver callback): the wall time without the end of
                              `fit()`, where Tune waits for trial actors it started and
                              no longer needs; such an actor's start (about 3.5 s here)
                              decides some runs of either mode
  pbt8_finetune_keepall_disk  the backbone frozen and shared by every trial (PBT
                              fine-tuning of a pretrained model: the head is tuned)
Runs alternate; times and bytes are medians of `--reps` runs (bytes move with PBT's
random choices and with how far gc got); the fine-tuning row is one run each.

`--floor` adds, for the baseline's own checkpoints (the Lightning runs' kept `.ckpt`
files; the checkpoints of one Ray default run keeping all and one keeping 4 per trial,
and nothing else of Ray), the
rows `<scenario>_disk_floor_{h0,h1}`: the baseline's bytes against the floors of
`_floor.py` (each tensor coded whole or as a difference against any earlier checkpoint,
under an order-0 or a byte-context entropy model of its byte planes). Their ratio is the
most a store coding these tensors under that model could reach. For Ray it also adds
`pbt8_keep4_{wall,trials_done}_floor_durable`: the default against the default with
each checkpoint file and its directory fsynced after `torch.save` (`--reps` alternated
runs each), the least a store whose checkpoints survive a power loss adds to the run.
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
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import _floor  # noqa: E402
import tensor_history as th  # noqa: E402
from _report import Report, disk_bytes  # noqa: E402

CHECKPOINTS = 20


def lightning_part(report: Report, workdir: str, quick: bool, floor: bool = False) -> None:
    """The Lightning rows: `tensor_history.lightning.CheckpointIO` against
    `TorchCheckpointIO` in the same process, same disk, same seeds."""
    import lightning as L
    import torch
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as Base
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    import tensor_history.lightning as thl

    torch.set_num_threads(1)
    every = 2
    vocab, dim = (24_000, 256) if quick else (90_000, 256)  # 23.6 MB / 92 MB of embedding
    hidden = 512

    class Net(L.LightningModule):
        def __init__(self, frozen: bool) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, dim)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(),
                                           torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
                                           torch.nn.Linear(hidden, 1))
            if frozen:
                self.emb.weight.requires_grad_(False)

        def training_step(self, batch, _i):
            ids, y = batch
            loss = torch.nn.functional.mse_loss(self.mlp(self.emb(ids).mean(1)), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad],
                                     lr=1e-3)

    class Timed(Base):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner
            self.saves: list = []

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            t0 = time.perf_counter()
            self.inner.save_checkpoint(checkpoint, path, storage_options)
            self.saves.append(time.perf_counter() - t0)

        def load_checkpoint(self, path, map_location=None, weights_only=None):
            return self.inner.load_checkpoint(path, map_location=map_location,
                                              weights_only=weights_only)

        def remove_checkpoint(self, path):
            self.inner.remove_checkpoint(path)

        def teardown(self):
            self.inner.teardown()

    def data():
        g = torch.Generator().manual_seed(1)
        n = 64 * every * CHECKPOINTS
        ids = torch.randint(0, vocab, (n, 16), generator=g)
        y = torch.randn(n, 1, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, y),
                                           batch_size=64)

    def run(kind: str, frozen: bool, d: str):
        ckdir, repo = os.path.join(d, "ckpts"), os.path.join(d, "repo")
        inner = TorchCheckpointIO() if kind == "torch" else thl.CheckpointIO(repo)
        plugin = Timed(inner)
        L.seed_everything(0, verbose=False)
        cb = ModelCheckpoint(dirpath=ckdir, every_n_train_steps=every, save_top_k=3,
                             monitor="train_loss", save_last=True)
        tr = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                       enable_model_summary=False, max_steps=every * CHECKPOINTS,
                       callbacks=[cb], plugins=[plugin])
        tr.fit(Net(frozen), data())
        if kind == "th":
            with th.Store.open(repo, create=False) as s:
                s.gc(grace=0)
                s.gc(grace=0)
        loads = []
        last = os.path.join(ckdir, "last.ckpt")
        for _ in range(3):
            t0 = time.perf_counter()
            ck = inner.load_checkpoint(last)
            loads.append(time.perf_counter() - t0)
            del ck
        inner.teardown()
        if floor and kind == "torch":
            lightning_floor(report, f"lightning_{'finetune' if frozen else 'dense'}", ckdir)
        return disk_bytes(d), plugin.saves, statistics.median(loads), len(os.listdir(ckdir))

    for scenario, frozen in (("dense", False), ("finetune", True)):
        out = {}
        for kind in ("torch", "th"):
            d = os.path.join(workdir, f"{scenario}-{kind}")
            out[kind] = run(kind, frozen, d)
            disk, saves, load, files = out[kind]
            print(f"  {scenario}/{kind}: {len(saves)} saves, {files} files, disk {disk / 1e6:.1f} MB,"
                  f" save median {statistics.median(saves) * 1e3:.0f} ms, load {load * 1e3:.0f} ms",
                  file=sys.stderr, flush=True)
            shutil.rmtree(d)
        (dt, st, lt, _), (dh, sh, lh, _) = out["torch"], out["th"]
        assert len(st) == len(sh) >= CHECKPOINTS, (len(st), len(sh))
        name = f"lightning_{scenario}[TorchCheckpointIO]"
        report.add(f"{name}_disk_after_{CHECKPOINTS}", "MB", dt / 1e6, dh / 1e6)
        report.add(f"{name}_save_ms", "ms", statistics.median(st), statistics.median(sh))
        report.add(f"{name}_resume_ms", "ms", lt, lh)


def lightning_floor(report: Report, name: str, ckdir: str) -> None:
    """The floor rows of `_floor.py` for the checkpoints Lightning kept in `ckdir`
    (`torch.load`-ed, ordered by global step; each tensor against any earlier one)."""
    import torch

    files = [os.path.join(ckdir, f) for f in os.listdir(ckdir) if f.endswith(".ckpt")]
    cks = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    cks.sort(key=lambda c: c["global_step"])
    floor_rows(report, f"{name}[TorchCheckpointIO]", sum(os.path.getsize(f) for f in files),
               [_floor.flat_tensors(c) for c in cks])


def floor_rows(report: Report, name: str, baseline_bytes: int, cks: List[Any]) -> None:
    """Rows `<name>_disk_floor_{h0,h1}`: the baseline's bytes against each floor (the
    ratio is the most any store coding these tensors under that model could reach)."""
    f = _floor.floor_of(cks, _floor.earlier)
    print(f"  {name}: {len(cks)} checkpoints, {f['raw'] / 1e6:.1f} MB of tensors, floors "
          f"h0 {f['h0'] / 1e6:.1f} MB, h1 {f['h1'] / 1e6:.1f} MB", file=sys.stderr, flush=True)
    for model in ("h0", "h1"):
        report.add(f"{name}_disk_floor_{model}", "MB", baseline_bytes / 1e6, f[model] / 1e6)


def ray_report(report: Report, reps: int, quick: bool, floor: bool = False) -> None:
    """The Ray Tune rows (see the module docs)."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
    import ray
    import torch

    import ray_pbt

    print(f"ray {ray.__version__}, torch {torch.__version__}, 2 CPUs for Ray, "
          "torch 1 thread per trial; buffers not prefaulted", file=sys.stderr)
    iterations = 6 if quick else 12
    ray_pbt.init_ray(2)

    def one(mode: str, keep: Any, finetune: bool, inspect: Any = None,
            durable: bool = False) -> Any:
        root = tempfile.mkdtemp(prefix="trainers_report_")
        try:
            res = ray_pbt.run(mode, root, trials=8, iterations=iterations, interval=3,
                              keep=keep, finetune=finetune, durable=durable)
            if inspect is not None:
                inspect(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"  {mode}{' durable' if durable else ''} keep={keep} finetune={finetune}: "
              f"{res.total_bytes} B, "
              f"{res.wall_s:.1f} s (trials done at {res.trials_s:.1f} s), {res.exploits} "
              f"exploits, {res.gc_runs} gc runs",
              file=sys.stderr)
        return res

    def alternated(runs: Dict[Any, Any]) -> Dict[Any, List[Any]]:
        """`--reps` runs of each of the two calls in `runs` (key -> call), alternating
        which goes first."""
        a, b = runs
        out: Dict[Any, List[Any]] = {a: [], b: []}
        for r in range(reps):
            for k in ((a, b) if r % 2 == 0 else (b, a)):
                out[k].append(runs[k]())
        return out

    def add_medians(row: str, unit: str, attr: str, baseline: List[Any], store: List[Any],
                    scale: float = 1.0) -> None:
        report.add(row, unit, statistics.median(getattr(x, attr) for x in baseline) / scale,
                   statistics.median(getattr(x, attr) for x in store) / scale)

    def ray_floor(name: str, root: str) -> None:
        # Every torch.save file the default run kept, by iteration.
        found = []
        for d, _, files in os.walk(os.path.join(root, "ray-default")):
            for f in files:
                if f == "state.pt":
                    ck = torch.load(os.path.join(d, f), map_location="cpu")
                    found.append((ck["iteration"], d, os.path.getsize(os.path.join(d, f)), ck))
        found.sort(key=lambda x: (x[0], x[1]))
        floor_rows(report, name, sum(x[2] for x in found),
                   [_floor.flat_tensors(x[3]) for x in found])

    try:
        if floor:
            for keep, name in ((None, "pbt8_keepall"), (4, "pbt8_keep4")):
                one("default", keep, False, lambda root, n=name: ray_floor(n, root))
            # The wall time's floor for a durable store: the default with each file
            # fsynced (and its directory), against the default as it is.
            pair = alternated({d: lambda d=d: one("default", 4, False, durable=d)
                               for d in (False, True)})
            for row, attr in (("wall", "wall_s"), ("trials_done", "trials_s")):
                add_medians(f"pbt8_keep4_{row}_floor_durable", "s", attr, pair[False],
                            pair[True])
            return
        # Both keep every checkpoint (Ray's default), then both num_to_keep=4 (above the
        # perturbation interval: PBT's exploited checkpoint must outlive its restore).
        for keep, name in ((None, "pbt8_keepall"), (4, "pbt8_keep4")):
            runs = alternated({m: lambda m=m, k=keep: one(m, k, False)
                               for m in ("default", "th")})
            for row, unit, attr, scale in (("disk", "MiB", "total_bytes", 2**20),
                                           ("wall", "s", "wall_s", 1.0),
                                           ("trials_done", "s", "trials_s", 1.0)):
                add_medians(f"{name}_{row}", unit, attr, runs["default"], runs["th"], scale)
        ft_default = one("default", None, True)
        ft_th = one("th", None, True)
        report.add("pbt8_finetune_keepall_disk", "MiB", ft_default.total_bytes / 2**20,
                   ft_th.total_bytes / 2**20)
    finally:
        ray.shutdown()


#: Each trainer's part: (report, the parsed arguments, a scratch directory).
PARTS = {
    "lightning": lambda report, args, workdir: lightning_part(report, workdir, args.quick,
                                                              args.floor),
    "ray": lambda report, args, workdir: ray_report(report, args.reps, args.quick, args.floor),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(PARTS), action="append",
                    help="run only this trainer's part (repeatable; default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="a smaller model (lightning), 6 iterations (ray)")
    ap.add_argument("--reps", type=int, default=3, help="alternated runs of each (ray)")
    ap.add_argument("--floor", action="store_true",
                    help="also the floors of _floor.py for the baseline's checkpoints (ray: "
                         "only one default run for each retention and its floor)")
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python "
          f"{platform.python_version()}, tensor_history {th.__file__}", file=sys.stderr)
    workdir = tempfile.mkdtemp(prefix="trainers-report-", dir=args.dir)
    report = Report()
    try:
        for name in args.only or sorted(PARTS):
            PARTS[name](report, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.print()


if __name__ == "__main__":
    main()
