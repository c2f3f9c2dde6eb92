"""Does a checkpoint, restore, open or refresh of `tensor_history.ray` grow with the shared
repository? The flow of examples/python/ray_pbt.py in one process, without Ray's
scheduler: 8 trials of its MLP (0.85 MiB of model and AdamW state), each checkpointing
with `tensor_history.ray.checkpoint` on its branch `trials/t<i>` of one repository every
iteration (2 optimizer steps), and every 3 iterations every trial restarted as synchronous
PBT does (a new tracker, `tensor_history.ray.restore`: a `Store.open`), the last two from
another trial's checkpoint (an exploit). No gc: every version is kept.

    python bindings/python/benches/shared_repo_growth.py [--iterations 12,120]

For each length it prints the median time of a checkpoint in the first and the last three
iterations, of a restore in the first and the last restart round, then of `Store.open`
and of a refresh that takes in 8 new versions at the end, with the repository's index
files, version objects and ref log entries; then `Store.open` of the final repository as
saved beside a copy whose index files a gc merged into one (`MERGE_INDEXES_ABOVE`), run
alternately. Times move with the machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

import torch  # noqa: E402

import ray_pbt as rp  # noqa: E402
import tensor_history as th  # noqa: E402
import tensor_history.ray as thr  # noqa: E402
import tensor_history.torch  # noqa: E402,F401

TRIALS = 8


def files(repo: str, sub: str) -> int:
    return sum(len(f) for _, _, f in os.walk(os.path.join(repo, sub)))


def ms(xs: List[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.2f} ms"


def run(repo: str, iterations: int) -> None:
    data = rp.batches()

    def fresh(t: int) -> Tuple[Any, Any, Any]:
        model, opt = rp.make_model({"hidden": 256, "seed": t, "finetune": False, "lr": 1e-3})
        return model, opt, th.torch.track(model, opt)

    state = {t: fresh(t) for t in range(TRIALS)}
    ckpts: Dict[int, Any] = {}  # the latest checkpoint of each trial (its directory lives)
    ckpt_s: Dict[int, List[float]] = {}
    restore_s: Dict[int, List[float]] = {}
    for it in range(iterations):
        for t in range(TRIALS):
            if it > 0 and it % 3 == 0:
                donor = t if t < TRIALS - 2 else t - (TRIALS - 2)
                state[t] = fresh(t)
                t0 = time.perf_counter()
                thr.restore(state[t][2], ckpts[donor], branch=f"trials/t{t}")
                restore_s.setdefault(it, []).append(time.perf_counter() - t0)
            model, opt, tracker = state[t]
            rp.train_steps(model, opt, data, 2)
            t0 = time.perf_counter()
            ckpts[t] = thr.checkpoint(tracker, repo, branch=f"trials/t{t}", iteration=it + 1)
            ckpt_s.setdefault(it, []).append(time.perf_counter() - t0)
    its = sorted(ckpt_s)
    first = [x for i in its[:3] for x in ckpt_s[i]]
    last = [x for i in its[-3:] for x in ckpt_s[i]]
    rounds = sorted(restore_s)
    opens = []
    for _ in range(7):
        t0 = time.perf_counter()
        s = th.Store.open(repo, create=False)
        opens.append(time.perf_counter() - t0)
        s.close()
    reader = th.Store.open(repo, create=False)
    refreshes = []
    for _ in range(5):
        for t in range(TRIALS):
            model, opt, tracker = state[t]
            rp.train_steps(model, opt, data, 1)
            ckpts[t] = thr.checkpoint(tracker, repo, branch=f"trials/t{t}")
        t0 = time.perf_counter()
        reader.refresh()
        refreshes.append(time.perf_counter() - t0)
    reader.close()
    print(f"{iterations:4d} iterations ({files(repo, 'versions')} versions, "
          f"{files(repo, 'index')} index files, {files(repo, 'refs')} ref entries): "
          f"checkpoint first {ms(first)} last {ms(last)}; restore first {ms(restore_s[rounds[0]])} "
          f"last {ms(restore_s[rounds[-1]])}; open {ms(opens)}; refresh of 8 {ms(refreshes)}",
          flush=True)


def open_merged(repo: str) -> None:
    merged = repo + "-merged"
    shutil.copytree(repo, merged)
    s = th.Store.open(merged, create=False)
    for _ in range(2):
        s.gc(grace=0)  # merges the index files (and trims the ref logs)
    s.close()
    a: List[float] = []
    b: List[float] = []
    for _ in range(15):
        for path, out in ((repo, a), (merged, b)):
            t0 = time.perf_counter()
            s = th.Store.open(path, create=False)
            out.append(time.perf_counter() - t0)
            s.close()
    print(f"open as saved ({files(repo, 'index')} index files, {files(repo, 'refs')} ref "
          f"entries) {ms(a)}; after a gc merged them ({files(merged, 'index')}, "
          f"{files(merged, 'refs')}) {ms(b)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", default="12,120", help="comma-separated lengths")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    work = tempfile.mkdtemp(prefix="shared_repo_growth_")
    try:
        repo = ""
        for n in (int(x) for x in args.iterations.split(",")):
            repo = os.path.join(work, f"repo-{n}")
            run(repo, n)
        open_merged(repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
