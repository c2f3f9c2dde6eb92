"""The pieces every side-by-side report here shares: alternating timed pairs, and the
tab-separated table of the Rust `bench_report` (`scenario`, `metric`, `baseline`, `store`,
`ratio` = baseline / store, above 1 means the store wins)."""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time


def median_pair(base_fn, store_fn, reps: int, setup=None) -> tuple[float, float]:
    """Median seconds of each, alternating which runs first, after one warm-up each."""
    tb, ts = [], []
    for r in range(reps + 1):
        order = [(base_fn, tb), (store_fn, ts)] if r % 2 == 0 else [(store_fn, ts), (base_fn, tb)]
        for fn, out in order:
            if setup is not None:
                setup()
            gc.collect()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r > 0:
                out.append(dt)
    return statistics.median(tb), statistics.median(ts)


def disk_bytes(path: str) -> int:
    """Bytes of every file under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, float]] = []

    def add(self, name: str, metric: str, base: float, store: float) -> None:
        if metric == "ms":
            base, store = base * 1e3, store * 1e3
        self.rows.append((name, metric, base, store))
        print(f"  {name:<44} baseline {fmt(base):>12} {metric}  store {fmt(store):>12} {metric}"
              f"  ratio {base / store:.2f}", file=sys.stderr, flush=True)

    def print(self) -> None:
        print("scenario\tmetric\tbaseline\tstore\tratio")
        for name, metric, b, s in self.rows:
            print(f"{name}\t{metric}\t{fmt(b)}\t{fmt(s)}\t{b / s:.2f}")


def fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"
