"""Side-by-side report: the TensorFlow/Keras and JAX trackers against what their users
write today. One process per framework (run with `--framework tf` or `--framework jax`;
the default runs both, each in a child process). Same tab-separated columns as
`report.py` and the Rust `bench_report` (ratio = baseline / store, above 1 the store
wins); machine facts go to stderr.

    python bindings/python/benches/frameworks_report.py            # 256 MiB models
    python bindings/python/benches/frameworks_report.py --quick    # 64 MiB, fewer runs

The model: 64 float32 variables (a Keras model of Dense layers for TensorFlow, a dict
pytree for JAX) of the given total size; chunks of 256 KiB.

TensorFlow / Keras (baseline in brackets):
  snapshot_unchanged[get_weights]   commit with nothing changed [model.get_weights()]
  snapshot_unchanged[numpy]         the same [[v.numpy() for v in model.variables]]
  trial_sparse_1pct[get/set_weights] change 1% of the chunks and take it back
                                    [get_weights, change, set_weights]
  trial_sparse_1pct[change alone]   the same trial [the change alone, no way back]:
                                    what the tracker adds to the step (below 1)
  trial_dense[get_weights]          change every variable, keep [get_weights, change]
  memory_100v_1pct[101 copies]      bytes held for 100 kept 1%-changes [101 get_weights]
  save_1pct_{time,disk}[tf.train.Checkpoint] save one kept 1%-change
                                    [Checkpoint.write of the model]
JAX:
  snapshot_unchanged[numpy]         commit of the same tree [NumPy copies of the leaves]
  trial_sparse_1pct[kept reference] a 1%-change, taken back [keep the old tree: free]
  memory_100v_1pct[kept references] 100 steps that make new arrays for every leaf (as a
                                    jitted step does), 1% of the chunks changed; 101
                                    trees kept by reference against 101 versions
  save_1pct_{time,disk}[orbax]      save one 1%-change [an Orbax StandardCheckpointer
                                    step checkpoint of the tree]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

for _k, _v in {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
               "TF_NUM_INTRAOP_THREADS": "2", "JAX_PLATFORMS": "cpu"}.items():
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

import tensor_history as th  # noqa: E402
from _report import Report, disk_bytes, median_pair  # noqa: E402

CHUNK = th.DEFAULT_CHUNK_BYTES
NVARS = 64


def sparse_slots(shapes: list, frac: float, seed: int) -> list:
    """(variable index, flat index): one element in `frac` of all chunks."""
    slots = []
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape))
        per = CHUNK // 4
        slots += [(i, c) for c in range(0, n, per)]
    rng = np.random.default_rng(seed)
    k = max(1, int(len(slots) * frac))
    return [slots[j] for j in rng.choice(len(slots), size=k, replace=False)]


# ---- TensorFlow / Keras ------------------------------------------------------------------


def run_tf(mib: int, reps: int, rep: Report) -> None:
    import tensorflow as tf

    import tensor_history.tf  # noqa: F401

    keras = tf.keras
    per = mib * (1 << 20) // NVARS // 4
    side = 512
    rows = per // side

    def build():
        keras.utils.set_random_seed(0)
        inp = keras.Input((side,))
        outs = [keras.layers.Dense(rows, use_bias=False)(inp) for _ in range(NVARS)]
        return keras.Model(inp, outs)

    mb, ms = build(), build()
    ms.set_weights(mb.get_weights())
    print(f"tf: {len(ms.variables)} variables, {mib} MiB, TensorFlow {tf.__version__}",
          file=sys.stderr)
    tr = th.tf.track(ms)
    label = f"keras_tf_{mib}mib"

    b, s = median_pair(lambda: mb.get_weights(), lambda: tr.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[get_weights]", "ms", b, s)
    b, s = median_pair(lambda: [v.numpy() for v in mb.variables], lambda: tr.commit("noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[numpy]", "ms", b, s)
    tr.store.prune(keep_last=1)

    shapes = [tuple(v.shape) for v in ms.variables]
    step = [0]

    def change_sparse(m, slots, k):
        by_var = {}
        for i, j in slots:
            by_var.setdefault(i, []).append(j)
        for i, js in by_var.items():
            v = m.variables[i]
            idx = [[j // rows, j % rows] for j in js]
            v.assign(tf.tensor_scatter_nd_add(v.value, idx, [1.0 + k] * len(js)))

    def change_dense(m, k):
        for v in m.variables:
            v.assign(v.value * 0.999 + 1e-4 * (k % 7 + 1))

    slots = sparse_slots(shapes, 0.01, 1)

    def base_sparse():
        step[0] += 1
        saved = mb.get_weights()
        change_sparse(mb, slots, step[0])
        mb.set_weights(saved)

    def store_sparse():
        step[0] += 1
        with tr.trial():
            change_sparse(ms, slots, step[0])

    b, s = median_pair(base_sparse, store_sparse, reps)
    rep.add(f"{label}/trial_sparse_1pct[get/set_weights]", "ms", b, s)

    def bare_sparse():
        step[0] += 1
        change_sparse(mb, slots, step[0])

    # The same trial against the change alone, with no way back: the tracker's own cost
    # (ratio below 1). The change (a tensor_scatter_nd_add and an assign per touched
    # variable) is on both sides of the row above, which caps its ratio at about
    # (get_weights + set_weights + change) / change whatever the tracker costs.
    b, s = median_pair(bare_sparse, store_sparse, reps)
    rep.add(f"{label}/trial_sparse_1pct[change alone]", "ms", b, s)

    def base_dense():
        step[0] += 1
        saved = mb.get_weights()  # noqa: F841 - what the baseline pays to be able to go back
        change_dense(mb, step[0])

    def store_dense():
        step[0] += 1
        with tr.trial() as t:
            change_dense(ms, step[0])
            t.keep()

    b, s = median_pair(base_dense, store_dense, reps, setup=lambda: tr.store.prune(keep_last=2))
    rep.add(f"{label}/trial_dense[get_weights]", "ms", b, s)

    size = sum(int(np.prod(sh)) * 4 for sh in shapes)
    tr.commit("start")
    tr.store.prune(keep_last=1)
    tr.store.release_pooled()
    for i in range(100):
        with tr.trial() as t:
            change_sparse(ms, sparse_slots(shapes, 0.01, 100 + i), i)
            t.keep()
    st = tr.stats()
    rep.add(f"{label}/memory_100v_1pct[101 copies]", "bytes", 101.0 * size, float(st.unique_bytes))

    tr.store.verify()
    # a saved history: one more kept 1%-change after the history is on disk
    tmp = tempfile.mkdtemp(prefix="th-bench-tf-")
    try:
        repo = os.path.join(tmp, "repo")
        tr.save(repo)
        ckpt = tf.train.Checkpoint(model=mb)
        ckpt.write(os.path.join(tmp, "ckpt", "warm"))
        tb, ts, db, ds = [], [], [], []
        for r in range(reps):
            with tr.trial() as t:
                change_sparse(ms, sparse_slots(shapes, 0.01, 500 + r), r)
                t.keep()
            change_sparse(mb, sparse_slots(shapes, 0.01, 500 + r), r)
            before = disk_bytes(repo)
            t0 = time.perf_counter()
            tr.save()
            ts.append(time.perf_counter() - t0)
            ds.append(disk_bytes(repo) - before)
            d = os.path.join(tmp, "ckpt", f"step{r}")
            t0 = time.perf_counter()
            ckpt.write(d)
            tb.append(time.perf_counter() - t0)
            db.append(sum(os.path.getsize(os.path.join(tmp, "ckpt", f))
                          for f in os.listdir(os.path.join(tmp, "ckpt"))
                          if f.startswith(f"step{r}")))
        rep.add(f"{label}/save_1pct_time[tf.train.Checkpoint]", "ms",
                float(np.median(tb)), float(np.median(ts)))
        rep.add(f"{label}/save_1pct_disk[tf.train.Checkpoint]", "bytes",
                float(np.median(db)), float(np.median(ds)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- JAX ---------------------------------------------------------------------------------


def run_jax(mib: int, reps: int, rep: Report) -> None:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import tensor_history.jax  # noqa: F401

    per = mib * (1 << 20) // NVARS // 4
    key = jax.random.key(0)
    tree = {f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (per,), jnp.float32)
            for i in range(NVARS)}
    jax.block_until_ready(tree)
    names = sorted(tree)
    shapes = [tree[n].shape for n in names]
    print(f"jax: {NVARS} leaves, {mib} MiB, JAX {jax.__version__}", file=sys.stderr)
    tr = th.jax.track(tree)
    label = f"jax_{mib}mib"

    b, s = median_pair(lambda: jax.tree.map(np.array, tree), lambda: tr.commit(tree, "noop"), reps)
    rep.add(f"{label}/snapshot_unchanged[numpy]", "ms", b, s)
    tr.store.prune(keep_last=1)

    @jax.jit
    def bump(x, idx, k):
        return x.at[idx].add(1.0 + k)

    def change_sparse(t, slots, k):
        by = {}
        for i, j in slots:
            by.setdefault(names[i], []).append(j)
        out = dict(t)
        for n, js in by.items():
            out[n] = bump(t[n], jnp.array(js), k)
        return jax.block_until_ready(out)

    slots = sparse_slots(shapes, 0.01, 1)
    state = [tree]

    def base_sparse():
        old = state[0]  # the baseline keeps the old tree by reference: free
        change_sparse(old, slots, 1.0)

    def store_sparse():
        with tr.trial(state[0]) as t:
            change_sparse(state[0], slots, 1.0)
        state[0] = t.result

    b, s = median_pair(base_sparse, store_sparse, reps)
    rep.add(f"{label}/trial_sparse_1pct[kept reference]", "ms", b, s)

    # 100 steps that make new arrays for every leaf (a jitted step over the whole tree)
    @jax.jit
    def step_all(t):
        return jax.tree.map(lambda x: x + 0.0, t)

    size = sum(int(np.prod(sh)) * 4 for sh in shapes)
    tr.commit(tree, "start")
    tr.store.prune(keep_last=1)
    tr.store.release_pooled()
    cur = tree
    for i in range(100):
        with tr.trial(cur) as t:
            new = change_sparse(step_all(cur), sparse_slots(shapes, 0.01, 100 + i), float(i))
            t.keep(new)
        cur = t.result
    st = tr.stats()
    rep.add(f"{label}/memory_100v_1pct[kept references]", "bytes", 101.0 * size,
            float(st.unique_bytes))

    tr.store.verify()
    tmp = tempfile.mkdtemp(prefix="th-bench-jax-")
    try:
        repo = os.path.join(tmp, "repo")
        tr.save(repo)
        ck = ocp.StandardCheckpointer()
        ck.save(os.path.join(tmp, "orbax", "warm"), cur)
        ck.wait_until_finished()
        tb, ts, db, ds = [], [], [], []
        for r in range(reps):
            cur = change_sparse(cur, sparse_slots(shapes, 0.01, 500 + r), float(r))
            tr.commit(cur, "one more")
            before = disk_bytes(repo)
            t0 = time.perf_counter()
            tr.save()
            ts.append(time.perf_counter() - t0)
            ds.append(disk_bytes(repo) - before)
            d = os.path.join(tmp, "orbax", f"step{r}")
            t0 = time.perf_counter()
            ck.save(d, cur)
            ck.wait_until_finished()
            tb.append(time.perf_counter() - t0)
            db.append(disk_bytes(d))
        rep.add(f"{label}/save_1pct_time[orbax]", "ms", float(np.median(tb)), float(np.median(ts)))
        rep.add(f"{label}/save_1pct_disk[orbax]", "bytes", float(np.median(db)), float(np.median(ds)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["tf", "jax", "all"], default="all")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size-mib", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    size = args.size_mib or (64 if args.quick else 256)
    reps = args.reps or (3 if args.quick else 5)
    if args.framework == "all":
        # one framework per process: TensorFlow and JAX each bring their own runtime
        print("scenario\tmetric\tbaseline\tstore\tratio")
        for fw in ("tf", "jax"):
            cmd = [sys.executable, __file__, "--framework", fw, "--size-mib", str(size),
                   "--reps", str(reps), "--no-header"]
            subprocess.run(cmd, check=True)
        return
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus, "
          f"chunk {CHUNK} B, {reps} runs per side (medians), load average "
          f"{os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    start = time.perf_counter()
    rep = Report()
    (run_tf if args.framework == "tf" else run_jax)(size, reps, rep)
    gc.collect()
    if args.no_header:
        for name, metric, b, s in rep.rows:
            from _report import fmt

            print(f"{name}\t{metric}\t{fmt(b)}\t{fmt(s)}\t{b / s:.2f}", flush=True)
    else:
        rep.print()
    print(f"total {time.perf_counter() - start:.1f} s, load average {os.getloadavg()[0]:.2f} "
          "at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
