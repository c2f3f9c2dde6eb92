"""Side-by-side report: a saved history of dense training checkpoints on disk, against
safetensors files and Icechunk (Zarr 3 arrays in a versioned Icechunk repository). Same
tab-separated columns as `report.py` and the Rust `bench_report` (ratio = baseline /
store, above 1 the store wins); machine facts go to stderr.

    HF_HUB_OFFLINE=1 python bindings/python/benches/minilm_checkpoints.py CKPTS --steps 10
    python bindings/python/benches/dense_disk_report.py CKPTS [--every 1] [--count 10]

The checkpoints are all-MiniLM-L6-v2 fine-tuned with AdamW (parameters and both moments,
float32, about 260 MiB each; every element changes at every step), as
`minilm_checkpoints.py` writes them: `--every 1` takes steps 1..10, `--every 5` steps
5, 10, ... (run `minilm_checkpoints.py` with `--steps 50` for ten of those). Each sequence
is measured in float32 and in bfloat16 (the float32 values rounded to nearest).

Per sequence and dtype, the checkpoints are saved one after another into
- a tensor-history repository (`Store.sync` of every tensor, `commit`, `save`),
- a tensor-history repository written as DCP saves write it: each checkpoint as one part
  of a fresh writer (`Store.write_part`, whole chunks: a part has no parent to take
  deltas against) committed with `commit_parts`; then `gc(rebase=True, grace=0)`, which
  stores those chunks again as deltas against the previous checkpoint's
  (`disk_10v[parts, before gc rebase]` against the same repository after it; the gc's
  time on stderr),
- one safetensors file per checkpoint (the raw bytes; the baseline of `disk[safetensors]`),
- an Icechunk repository holding one Zarr array per tensor, chunks of the store's chunk
  size, one commit per checkpoint, compressed with Blosc (zstd level 3, byte shuffle) and,
  separately, with Zarr's default codec (zstd level 0),

and the rows are the bytes on disk after all of them (`disk_10v[...]`) and the total time
of the saves (`save_10v_time[...]`, each save's data already in memory, files fsynced by
each tool as it does by default; nothing prefaulted beyond the arrays being loaded once).
Icechunk and Zarr are optional (`pip install icechunk zarr`): without them those rows are
left out and stderr says so.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tensor_history as th
from _report import Report, disk_bytes

CHUNK = th.DEFAULT_CHUNK_BYTES


def load(path: Path, dtype: str) -> dict:
    from safetensors.numpy import load_file

    out = load_file(str(path))
    if dtype == "bf16":
        import ml_dtypes

        out = {k: v.astype(ml_dtypes.bfloat16) for k, v in out.items()}
    return out


def save_store(seq: list, repo: str) -> float:
    s = th.Store()
    took = 0.0
    for i, tensors in enumerate(seq):
        s.sync(tensors)
        s.commit(f"checkpoint {i}")
        t0 = time.perf_counter()
        if i == 0:
            s.save_as(repo)
        else:
            s.save()
        took += time.perf_counter() - t0
    s.close()
    return took


def save_parts(seq: list, repo: str) -> tuple[float, "th.Store"]:
    c = th.Store.open(repo)
    took = 0.0
    for i, tensors in enumerate(seq):
        w = th.Store()
        w.sync(tensors)
        t0 = time.perf_counter()
        part = w.write_part(repo)
        c.commit_parts("main", [part.items], f"checkpoint {i}")
        c.save()
        took += time.perf_counter() - t0
    return took, c


def save_safetensors(seq: list, out: str) -> float:
    from safetensors.numpy import save_file

    os.makedirs(out)
    took = 0.0
    for i, tensors in enumerate(seq):
        path = os.path.join(out, f"{i}.safetensors")
        t0 = time.perf_counter()
        save_file(tensors, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        took += time.perf_counter() - t0
    return took


def save_icechunk(seq: list, out: str, codec: str) -> float:
    import icechunk
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(out))
    took = 0.0
    for i, tensors in enumerate(seq):
        t0 = time.perf_counter()
        session = repo.writable_session("main")
        root = zarr.open_group(session.store, mode="a")
        for name, a in tensors.items():
            flat = a.reshape(-1)
            if flat.dtype.itemsize == 2 and flat.dtype.kind not in "iuf":
                flat = flat.view(np.uint16)  # bfloat16: the same bytes, a dtype Zarr knows
            key = name.replace("/", ".")
            if i == 0:
                compressors = (
                    [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle",
                                typesize=flat.dtype.itemsize)]
                    if codec == "blosc" else [ZstdCodec(level=0)])
                arr = root.create_array(key, shape=flat.shape, dtype=flat.dtype,
                                        chunks=(max(1, CHUNK // flat.dtype.itemsize),),
                                        compressors=compressors)
            else:
                arr = root[key]
            arr[...] = flat
        session.commit(f"checkpoint {i}")
        took += time.perf_counter() - t0
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", type=Path, help="directory minilm_checkpoints.py wrote")
    ap.add_argument("--every", type=int, default=1, help="steps between checkpoints (1 or 5)")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--tmp", default=None, help="where to write (default: the system's temp)")
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    steps = [args.every * (i + 1) for i in range(args.count)]
    paths = [args.checkpoints / f"step-{s:04d}.safetensors" for s in steps]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"missing checkpoints: {missing[:3]}; run minilm_checkpoints.py "
              f"--steps {steps[-1]}", file=sys.stderr)
        return 2
    try:
        import icechunk
        import zarr

        peers = ["blosc", "zarr-default"]
        print(f"icechunk {icechunk.__version__}, zarr {zarr.__version__}", file=sys.stderr)
    except ImportError as e:
        peers = []
        print(f"icechunk rows left out: {e}", file=sys.stderr)
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus, "
          f"chunk {CHUNK} B, load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    rep = Report()
    for dtype in args.dtypes.split(","):
        seq = [load(p, dtype) for p in paths]
        raw = sum(a.nbytes for t in seq for a in t.values())
        label = f"minilm_{dtype}_every{args.every}_{args.count}v"
        print(f"{label}: {len(seq[0])} tensors, {raw / len(seq) / 2**20:.1f} MiB each",
              file=sys.stderr)
        tmp = tempfile.mkdtemp(prefix="th-dense-disk-", dir=args.tmp)
        try:
            sides = {}
            t_store = save_store(seq, os.path.join(tmp, "th"))
            sides["store"] = (t_store, disk_bytes(os.path.join(tmp, "th")))
            t_st = save_safetensors(seq, os.path.join(tmp, "st"))
            sides["safetensors"] = (t_st, disk_bytes(os.path.join(tmp, "st")))
            for peer in peers:
                d = os.path.join(tmp, peer)
                t = save_icechunk(seq, d, "blosc" if peer == "blosc" else "zstd")
                sides[f"icechunk {peer}"] = (t, disk_bytes(d))
            parts_dir = os.path.join(tmp, "parts")
            t_parts, c = save_parts(seq, parts_dir)
            d_parts = disk_bytes(parts_dir)
            t0 = time.perf_counter()
            gst = c.gc(grace=0, rebase=True)
            t_gc = time.perf_counter() - t0
            d_rebased = disk_bytes(parts_dir)
            c.close()
            shutil.rmtree(parts_dir, ignore_errors=True)
            print(f"  parts: {d_parts} bytes ({raw / d_parts:.2f}x) in {t_parts:.1f} s; "
                  f"gc rebase {t_gc:.1f} s ({gst.chunks_rebased} chunks, "
                  f"{gst.packs_rewritten} packs): {d_rebased} bytes ({raw / d_rebased:.2f}x)",
                  file=sys.stderr)
            rep.add(f"{label}/disk[parts, before gc rebase]", "bytes", float(d_parts),
                    float(d_rebased))
            ts, ds = sides.pop("store")
            print(f"  raw {raw} bytes; tensor-history {ds} bytes ({raw / ds:.2f}x), "
                  f"{ts:.1f} s", file=sys.stderr)
            for name, (t, d) in sides.items():
                rep.add(f"{label}/disk[{name}]", "bytes", float(d), float(ds))
            for name, (t, d) in sides.items():
                rep.add(f"{label}/save_time[{name}]", "ms", t, ts)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.no_header:
        from _report import fmt

        for name, metric, b, s in rep.rows:
            print(f"{name}\t{metric}\t{fmt(b)}\t{fmt(s)}\t{b / s:.2f}", flush=True)
    else:
        rep.print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
