"""Side-by-side report: the trainer integrations against the trainers' own checkpoints.
Same tab-separated columns as `report.py` and the Rust `bench_report` (ratio = baseline /
store, above 1 the store wins); machine facts go to stderr.

    python bindings/python/benches/trainers_report.py --only ray [--reps 3] [--quick]

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
  pbt8_finetune_keepall_disk  the backbone frozen and shared by every trial (PBT
                              fine-tuning of a pretrained model: the head is tuned)
Runs alternate; times and bytes are medians of `--reps` runs (bytes move with PBT's
random choices and with how far gc got); the fine-tuning row is one run each.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from _report import Report  # noqa: E402


def ray_report(report: Report, reps: int, quick: bool) -> None:
    """The Ray Tune rows (see the module docs)."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
    import ray
    import torch

    import ray_pbt

    print(f"ray {ray.__version__}, torch {torch.__version__}, 2 CPUs for Ray, "
          "torch 1 thread per trial; buffers not prefaulted", file=sys.stderr)
    iterations = 6 if quick else 12
    ray_pbt.init_ray(2)

    def one(mode: str, keep: Any, finetune: bool) -> Any:
        root = tempfile.mkdtemp(prefix="trainers_report_")
        try:
            res = ray_pbt.run(mode, root, trials=8, iterations=iterations, interval=3,
                              keep=keep, finetune=finetune)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"  {mode} keep={keep} finetune={finetune}: {res.total_bytes} B, "
              f"{res.wall_s:.1f} s, {res.exploits} exploits, {res.gc_runs} gc runs",
              file=sys.stderr)
        return res

    try:
        # Both keep every checkpoint (Ray's default), then both num_to_keep=4 (above the
        # perturbation interval: PBT's exploited checkpoint must outlive its restore).
        for keep, name in ((None, "pbt8_keepall"), (4, "pbt8_keep4")):
            runs: Dict[str, List[Any]] = {"default": [], "th": []}
            for r in range(reps):
                for mode in (("default", "th") if r % 2 == 0 else ("th", "default")):
                    runs[mode].append(one(mode, keep, False))
            report.add(f"{name}_disk", "MiB",
                       statistics.median(x.total_bytes for x in runs["default"]) / 2**20,
                       statistics.median(x.total_bytes for x in runs["th"]) / 2**20)
            report.add(f"{name}_wall", "s",
                       statistics.median(x.wall_s for x in runs["default"]),
                       statistics.median(x.wall_s for x in runs["th"]))
        ft_default = one("default", None, True)
        ft_th = one("th", None, True)
        report.add("pbt8_finetune_keepall_disk", "MiB", ft_default.total_bytes / 2**20,
                   ft_th.total_bytes / 2**20)
    finally:
        ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["ray"], default=None,
                    help="one trainer's rows (default: all that are here)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="6 iterations, for a smoke run")
    args = ap.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
          file=sys.stderr)
    report = Report()
    if args.only in (None, "ray"):
        ray_report(report, args.reps, args.quick)
    report.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
