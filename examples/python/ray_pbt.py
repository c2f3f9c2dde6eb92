"""Population-based training with Ray Tune: 8 trials over learning rates, checkpointed
into one tensor-history repository, beside Ray's default checkpoints.

Each trial trains a small torch MLP (AdamW) on a fixed regression and reports a
checkpoint every iteration; PBT (synchronous, an exploit every few iterations) clones the
best trials' checkpoints into the worst and perturbs their learning rates. The same run
is made twice:

- Ray's default: the trainable writes ``torch.save`` of the model and optimizer into a
  checkpoint directory, which Ray copies under ``storage_path``;
- ``tensor_history.ray``: ``checkpoint(tracker, repo)`` commits and saves on the
  trial's branch ``trials/<id>`` of one shared repository (only the chunks it lacks) and
  gives Ray a directory holding one small pointer; an exploit is a branch reset that
  copies nothing, and ``gc_callback`` lets versions go once Ray dropped their
  directories (``--keep``, Ray's ``num_to_keep``, the same for both runs).

It prints the disk each run used (``storage_path``, plus the repository) and its wall
time. ``--finetune`` freezes a "pretrained" backbone shared by every trial and tunes the
head only, as PBT fine-tuning does.

    python examples/python/ray_pbt.py [--trials 8] [--iterations 12] [--keep 4] [--finetune]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import ray
import torch
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

import tensor_history as th
import tensor_history.ray as thr
import tensor_history.torch  # noqa: F401

LRS = [1e-4, 3e-4, 1e-3, 3e-3]


def make_model(config: Dict[str, Any]) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP: a backbone (two hidden layers) and a head; with ``finetune`` the backbone
    is the same "pretrained" weights in every trial and frozen."""
    hidden = int(config["hidden"])
    torch.manual_seed(0)  # the backbone every trial starts from
    backbone = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.GELU(),
                                   torch.nn.Linear(hidden, hidden), torch.nn.GELU())
    torch.manual_seed(int(config["seed"]))
    head = torch.nn.Linear(hidden, 1)
    model = torch.nn.Sequential(backbone, head)
    if config["finetune"]:
        backbone.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(params, lr=float(config["lr"]))


def batches() -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 32, generator=gen)
    y = torch.sin(x @ torch.randn(32, 1, generator=gen))
    return x, y


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer,
                data: Tuple[torch.Tensor, torch.Tensor], steps: int) -> float:
    x, y = data
    loss = torch.zeros(())
    for i in range(steps):
        sl = slice((i * 64) % 512, (i * 64) % 512 + 64)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[sl]), y[sl])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return float(loss)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr  # PBT's perturbed value, not the one of the checkpoint


def trainable_th(config: Dict[str, Any]) -> None:
    """Checkpoints through tensor_history.ray."""
    torch.set_num_threads(1)
    model, opt = make_model(config)
    tracker = th.torch.track(model, opt)
    v = thr.restore(tracker)  # tune.get_checkpoint(): a restart or a PBT exploit
    start = int(tracker.store.metadata(v)["iteration"]) if v is not None else 0
    set_lr(opt, float(config["lr"]))
    data = batches()
    for it in range(start, int(config["iterations"])):
        loss = train_steps(model, opt, data, int(config["steps"]))
        ckpt = thr.checkpoint(tracker, config["repo"], iteration=it + 1)
        tune.report({"loss": loss}, checkpoint=ckpt)


def trainable_default(config: Dict[str, Any]) -> None:
    """Ray's default: torch.save into the checkpoint directory (with ``durable``, the file
    and the directory fsynced after it)."""
    torch.set_num_threads(1)
    model, opt = make_model(config)
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["iteration"])
    set_lr(opt, float(config["lr"]))
    data = batches()
    for it in range(start, int(config["iterations"])):
        loss = train_steps(model, opt, data, int(config["steps"]))
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                        "iteration": it + 1}, os.path.join(d, "state.pt"))
            if config.get("durable"):
                for path in (os.path.join(d, "state.pt"), d):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            tune.report({"loss": loss}, checkpoint=tune.Checkpoint.from_directory(d))


def disk_bytes(path: str) -> int:
    """Bytes of the files under `path` (0 when absent)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except FileNotFoundError:
                pass
    return total


class TrialsDone(tune.Callback):
    """Records when the last trial completed (``perf_counter``), in the driver."""

    def __init__(self) -> None:
        self.last = 0.0

    def on_trial_complete(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
        self.last = time.perf_counter()


@dataclass
class RunResult:
    mode: str
    storage_bytes: int  # under Ray's storage_path
    repo_bytes: int  # the tensor-history repository (0 for Ray's default)
    wall_s: float  # Tuner.fit()
    # From fit() to the last trial's completion: without the end of fit(), where Tune
    # waits for trial actors it started and no longer needs (up to one actor start).
    trials_s: float
    best_loss: float
    exploits: int
    gc_runs: int

    @property
    def total_bytes(self) -> int:
        return self.storage_bytes + self.repo_bytes


def run(mode: str, root: str, *, trials: int = 8, iterations: int = 12, interval: int = 3,
        steps: int = 20, hidden: int = 256, finetune: bool = False, keep: Optional[int] = 4,
        gc_every: int = 16, grace: float = 5.0, seed: int = 0,
        durable: bool = False) -> RunResult:
    """One PBT run of `trials` trials in `mode` (``"th"`` or ``"default"``) under `root`.
    `durable` (the default's mode): each checkpoint file fsynced with its directory, what
    a checkpoint that survives a power loss costs at least (the store's saves are
    durable)."""
    storage = os.path.join(root, f"ray-{mode}")
    repo = os.path.join(root, f"repo-{mode}")
    random.seed(seed)  # PBT's choices
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=interval,
        hyperparam_mutations={"lr": LRS}, quantile_fraction=0.25, synch=True,
        resample_probability=0.25)
    done = TrialsDone()
    callbacks: List[Any] = [done]
    gc_cb: Any = None
    if mode == "th" and keep is not None:
        gc_cb = thr.gc_callback(repo, storage, every=gc_every, grace=grace)
        callbacks.append(gc_cb)
    config = {"lr": tune.grid_search([LRS[i % len(LRS)] for i in range(trials)]),
              "seed": seed,
              "iterations": iterations, "steps": steps, "hidden": hidden,
              "finetune": finetune, "repo": repo, "durable": durable}
    tuner = tune.Tuner(
        trainable_th if mode == "th" else trainable_default,
        param_space=config,
        tune_config=tune.TuneConfig(scheduler=pbt, metric="loss", mode="min",
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name="pbt", storage_path=storage, verbose=0, callbacks=callbacks,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=keep)),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    errors = [grid[i].error for i in range(len(grid)) if grid[i].error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} trials failed: {errors[0]}")
    metrics = grid.get_best_result().metrics or {}
    if gc_cb is not None:
        # The experiment is over, no trial saves: a last collection need not wait for
        # the grace period (what the runs during training recorded is deleted now).
        for _ in range(2):
            thr.gc(repo, storage, grace=0)
    return RunResult(mode=mode, storage_bytes=disk_bytes(storage), repo_bytes=disk_bytes(repo),
                     wall_s=wall, trials_s=done.last - t0,
                     best_loss=float(metrics.get("loss", float("nan"))),
                     exploits=int(pbt._num_perturbations),
                     gc_runs=gc_cb.runs if gc_cb is not None else 0)


def init_ray(num_cpus: int) -> None:
    """Start Ray with this file's directory on the workers' path (they import the
    trainables from this module when it is imported by name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + ([old] if old else []))
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--interval", type=int, default=3, help="PBT perturbation interval")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per iteration")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--keep", type=int, default=4,
                    help="num_to_keep (0: keep all); above --interval, or PBT trials fail "
                         "when the checkpoint an exploit restores was deleted first")
    ap.add_argument("--finetune", action="store_true", help="freeze a shared backbone")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="ray_pbt_")
    keep = args.keep or None
    init_ray(args.cpus)
    try:
        results = [run(mode, root, trials=args.trials, iterations=args.iterations,
                       interval=args.interval, steps=args.steps, hidden=args.hidden,
                       finetune=args.finetune, keep=keep)
                   for mode in ("default", "th")]
    finally:
        ray.shutdown()
    default, ours = results
    print(f"PBT: {args.trials} trials x {args.iterations} iterations, num_to_keep={keep}, "
          f"{'fine-tuning a frozen backbone' if args.finetune else 'every weight trained'}")
    for r, name in ((default, "Ray default (torch.save)"), (ours, "tensor_history.ray")):
        print(f"  {name:26s} disk {mib(r.total_bytes):>11s} (storage_path "
              f"{mib(r.storage_bytes)}, repository {mib(r.repo_bytes)}), wall "
              f"{r.wall_s:6.1f} s (last trial done at {r.trials_s:.1f} s), best loss "
              f"{r.best_loss:.4f}, {r.exploits} exploits, "
              f"{r.gc_runs} gc runs")
    print(f"  disk {default.total_bytes / max(ours.total_bytes, 1):.2f}x smaller, "
          f"wall time ratio {ours.wall_s / default.wall_s:.2f}")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
