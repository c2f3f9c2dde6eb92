"""Side-by-side report: DCP saves and loads through a tensor-history repository
(`tensor_history.torch.dcp`) against DCP's own `FileSystemWriter` / `FileSystemReader`
on the same disk, in the same run. Same tab-separated columns as `report.py` (ratio =
baseline / store, above 1 the store wins); machine facts go to stderr.

    python bindings/python/benches/dcp_report.py            # 256 MiB, 20 saves
    python bindings/python/benches/dcp_report.py --quick    # 64 MiB, 10 saves
    python bindings/python/benches/dcp_report.py --compress # parts byte-plane coded

4 ranks (forked processes, gloo on CPU, one thread each); the model is 16 float32
matrices of 4096 columns sharded by rows over the ranks (DTensor, `Shard(0)`); the
repository's chunks are 256 KiB (16 rows). Each save of the baseline goes to a new
directory (one per step, as `FileSystemWriter` needs), each save of the store to the
same repository (one version per save on `main`).

  save_first[FileSystemWriter]        the first save, seconds (barrier to barrier)
  save_1pct[FileSystemWriter]         median save after ~1% of the chunks changed
                                      (rows spread over every rank's shards)
  written_1pct[FileSystemWriter]      bytes the median 1%-save added to the disk
  save_dense[FileSystemWriter]        a save after every value changed
  load[FileSystemReader]              median load of the last save into the same shards
  disk_after_N_saves[FileSystemWriter] bytes on disk after the first save and N-1
                                      1%-saves (the baseline's directories are measured
                                      and deleted as it goes, to spare the disk)
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from _report import Report  # noqa: E402

COLS = 4096
N_TENSORS = 16


def disk(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def child(rank, world, init, mib, saves, work, out, compress):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    from tensor_history.torch.dcp import StorageReader, StorageWriter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (world,))
    rows = mib * (1 << 20) // (N_TENSORS * COLS * 4)
    g = torch.Generator().manual_seed(rank)
    local = {f"layer{i}.weight": torch.randn(rows // world, COLS, generator=g)
             for i in range(N_TENSORS)}

    def state():
        return {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False)
                for k, v in local.items()}

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    repo = os.path.join(work, "repo")
    fs_disk_total = 0
    fs_last = None

    def save_fs(step):
        nonlocal fs_last
        d = os.path.join(work, f"fs-{step}")
        t = timed(lambda: dcp.save(state(), storage_writer=dcp.FileSystemWriter(d)))
        size = disk(d) if rank == 0 else 0
        dist.barrier()
        if rank == 0 and fs_last is not None:
            shutil.rmtree(fs_last)
        fs_last = d
        return t, size

    # one per run: it hashes only changed chunks
    writer = StorageWriter(repo, compress=compress)

    def save_store(step):
        before = disk(repo) if rank == 0 and os.path.exists(repo) else 0
        writer.meta = {"step": step}
        t = timed(lambda: dcp.save(state(), storage_writer=writer))
        after = disk(repo) if rank == 0 else 0
        return t, after - before

    results = {}
    # first save, alternating which goes first is moot here: each writes everything
    t_fs, b_fs = save_fs(0)
    t_st, b_st = save_store(0)
    fs_disk_total += b_fs
    results["save_first"] = (t_fs, t_st)
    results["written_first"] = (b_fs, b_st)

    chunks_per_rank = N_TENSORS * (rows // world) // 16
    per_step = max(1, chunks_per_rank // 100)
    rng = torch.Generator().manual_seed(1000 + rank)
    times_fs, times_st, bytes_fs, bytes_st = [], [], [], []
    for step in range(1, saves):
        for _ in range(per_step):
            i = int(torch.randint(N_TENSORS, (1,), generator=rng))
            r = int(torch.randint(rows // world, (1,), generator=rng))
            local[f"layer{i}.weight"][r] += 1.0
        order = [save_fs, save_store] if step % 2 else [save_store, save_fs]
        for fn in order:
            t, b = fn(step)
            if fn is save_fs:
                times_fs.append(t)
                bytes_fs.append(b)
                fs_disk_total += b
            else:
                times_st.append(t)
                bytes_st.append(b)
    results["save_1pct"] = (statistics.median(times_fs), statistics.median(times_st))
    results["written_1pct"] = (statistics.median(bytes_fs), statistics.median(bytes_st))
    results[f"disk_after_{saves}_saves"] = (fs_disk_total, disk(repo) if rank == 0 else 0)

    loads_fs, loads_st = [], []
    for r in range(3):
        target = {k: DTensor.from_local(torch.zeros_like(v), mesh, [Shard(0)], run_check=False)
                  for k, v in local.items()}
        pair = [("fs", lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(fs_last))),
                ("st", lambda: dcp.load(target, storage_reader=StorageReader(repo)))]
        if r % 2:
            pair.reverse()
        for name, fn in pair:
            (loads_fs if name == "fs" else loads_st).append(timed(fn))
        for k, v in local.items():
            assert torch.equal(target[k].to_local(), v), f"rank {rank}: {k} loaded wrong"
    results["load"] = (statistics.median(loads_fs), statistics.median(loads_st))

    for v in local.values():
        v += 1.0
    t_st, _ = save_store(saves)
    t_fs, _ = save_fs(saves)
    results["save_dense"] = (t_fs, t_st)
    if rank == 0:
        import json

        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mib", type=int)
    ap.add_argument("--saves", type=int)
    ap.add_argument("--dir", help="where to write (default: a temporary directory)")
    ap.add_argument("--compress", action="store_true",
                    help="the store's writer byte-plane codes its parts (StorageWriter(compress=True))")
    a = ap.parse_args()
    mib = a.mib or (64 if a.quick else 256)
    saves = a.saves or (10 if a.quick else 20)

    import json

    import torch
    import torch.multiprocessing as mp

    work = tempfile.mkdtemp(prefix="dcp-report-", dir=a.dir)
    out = os.path.join(work, "results.json")
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, 4 ranks (gloo), model {mib} MiB, "
          f"{saves} saves, in {work}, parts {'coded' if a.compress else 'raw'}", file=sys.stderr)
    try:
        init = f"file://{work}/pg-{uuid.uuid4().hex}"
        mp.start_processes(child, args=(4, init, mib, saves, work, out, a.compress), nprocs=4,
                           join=True,
                           start_method="fork")
        with open(out) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rep = Report()
    rep.add("save_first[FileSystemWriter]", "ms", *res["save_first"])
    rep.add("save_1pct[FileSystemWriter]", "ms", *res["save_1pct"])
    rep.add("written_1pct[FileSystemWriter]", "bytes", *res["written_1pct"])
    rep.add("save_dense[FileSystemWriter]", "ms", *res["save_dense"])
    rep.add("load[FileSystemReader]", "ms", *res["load"])
    key = f"disk_after_{saves}_saves"
    rep.add(f"{key}[FileSystemWriter]", "bytes", *res[key])
    rep.print()


if __name__ == "__main__":
    main()
