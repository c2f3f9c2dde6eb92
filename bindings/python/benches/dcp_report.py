"""Side-by-side report: DCP saves and loads through a tensor-history repository
(`tensor_history.torch.dcp`) against DCP's own `FileSystemWriter` / `FileSystemReader`
on the same disk, in the same run. Same tab-separated columns as `report.py` (ratio =
baseline / store, above 1 the store wins); machine facts go to stderr.

    python bindings/python/benches/dcp_report.py            # 256 MiB, 20 saves
    python bindings/python/benches/dcp_report.py --quick    # 64 MiB, 10 saves
    python bindings/python/benches/dcp_report.py --compress # parts byte-plane coded
    python bindings/python/benches/dcp_report.py --s3       # the store on s3://$TH_S3_BUCKET
    python bindings/python/benches/dcp_report.py --location s3://bucket/prefix
    python bindings/python/benches/dcp_report.py --trust-versions  # unchanged tensors skipped

4 ranks (forked processes, gloo on CPU, one thread each); the model is 16 float32
matrices of 4096 columns sharded by rows over the ranks (DTensor, `Shard(0)`); the
repository's chunks are 256 KiB (16 rows). Each save of the baseline goes to a new
directory (one per step, as `FileSystemWriter` needs), each save of the store to the
same repository (one version per save on `main`).

  save_first[FileSystemWriter]        the first save, seconds (barrier to barrier)
  save_1pct[FileSystemWriter]         median save after ~1% of the chunks changed
                                      (rows spread over every rank's shards)
  written_1pct[FileSystemWriter]      bytes the median 1%-save added to the disk
  save_dense[FileSystemWriter]        median of 3 saves, each after every value changed
  load[FileSystemReader]              median load of the last save into the same shards
  disk_after_N_saves[FileSystemWriter] bytes on disk after the first save and N-1
                                      1%-saves (the baseline's directories are measured
                                      and deleted as it goes, to spare the disk)
  save_1pct[null writer floor]        the same 1%-saves through a storage writer that
                                      writes nothing (baseline column) against the
                                      store: what DCP itself costs (planning, its
                                      collectives, resolving the items); ratio = the
                                      floor's share of the store's save. The floor
                                      against FileSystemWriter, and the store's time per
                                      step (per rank: write_data's compare-and-hash and
                                      part write, the coordinator's finish), go to stderr.

On an object store (`--s3`, `--location s3://...`; the server and credentials from the
AWS_* variables, as for the Rust crate) the store's repository is there and the rows'
baseline is still `FileSystemWriter` on the local disk (DCP's fsspec writer on S3 needs
s3fs, which this report does not use): the rows are named `[FileSystemWriter, local
disk]`. The store's bytes on S3 are the bytes its saves wrote (the ranks' parts, summed
over ranks; the store deletes nothing without gc), not a listing of the bucket.
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
DENSE_SAVES = 3  # dense saves of each side (one model change before each pair)
N_TENSORS = 16


def disk(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def null_writer_class():
    """A DCP storage writer that writes nothing: every item resolved (as any writer must)
    and dropped. A save through it costs what DCP itself costs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class NullWriter(dcp.StorageWriter):
        def reset(self, checkpoint_id=None):
            pass

        def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
            pass

        def prepare_local_plan(self, plan):
            return plan

        def prepare_global_plan(self, plans):
            return plans

        def write_data(self, plan, planner):
            results = []
            for item in plan.items:
                planner.resolve_data(item)
                results.append(WriteResult(index=item.index, size_in_bytes=0,
                                           storage_data=None))
            fut = Future()
            fut.set_result(results)
            return fut

        def finish(self, metadata, results):
            pass

        def storage_meta(self):
            return None

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id):
            return True

    return NullWriter


def child(rank, world, init, mib, saves, work, out, compress, location, trust_versions):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    from tensor_history.torch.dcp import StorageReader, StorageWriter

    NullWriter = null_writer_class()

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

    local_repo = location is None
    repo = os.path.join(work, "repo") if local_repo else f"{location}/dcp-report-{uuid.uuid4().hex}"
    if not local_repo:
        box = [repo]
        dist.broadcast_object_list(box, src=0)
        repo = box[0]
    repo_total = 0  # on an object store: bytes every save's parts wrote, all ranks
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
    writer = StorageWriter(repo, compress=compress, trust_versions=trust_versions)

    store_times = []  # per 1%-save: this rank's writer.times

    def save_store(step):
        nonlocal repo_total
        before = disk(repo) if rank == 0 and local_repo and os.path.exists(repo) else 0
        writer.meta = {"step": step}
        t = timed(lambda: dcp.save(state(), storage_writer=writer))
        if local_repo:
            written = disk(repo) - before if rank == 0 else 0
        else:
            each = [None] * world
            dist.all_gather_object(each, writer.last_part.bytes_written)
            written = sum(each)
            repo_total += written
        return t, written

    null_writer = NullWriter()

    def save_null(step):
        return timed(lambda: dcp.save(state(), storage_writer=null_writer)), 0

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
    times_fs, times_st, times_null, bytes_fs, bytes_st = [], [], [], [], []
    for step in range(1, saves):
        for _ in range(per_step):
            i = int(torch.randint(N_TENSORS, (1,), generator=rng))
            r = int(torch.randint(rows // world, (1,), generator=rng))
            local[f"layer{i}.weight"][r] += 1.0
        order = [save_fs, save_store, save_null]
        k = step % 3
        for fn in order[k:] + order[:k]:
            t, b = fn(step)
            if fn is save_fs:
                times_fs.append(t)
                bytes_fs.append(b)
                fs_disk_total += b
            elif fn is save_store:
                times_st.append(t)
                bytes_st.append(b)
                store_times.append(dict(writer.times))
            else:
                times_null.append(t)
    results["save_1pct"] = (statistics.median(times_fs), statistics.median(times_st))
    results["save_1pct_null"] = (statistics.median(times_null), statistics.median(times_st))
    results["written_1pct"] = (statistics.median(bytes_fs), statistics.median(bytes_st))
    store_disk = (disk(repo) if rank == 0 else 0) if local_repo else repo_total
    results[f"disk_after_{saves}_saves"] = (fs_disk_total, store_disk)
    # the store's 1%-save per step: medians per rank (finish's only on the coordinator)
    steps = sorted({k for t in store_times for k in t})
    mine = {k: statistics.median(t[k] for t in store_times if k in t) for k in steps}
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)
    results["profile_1pct"] = per_rank

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

    # dense saves: every value changed before each pair, which goes first alternating
    dense_fs, dense_st = [], []
    for r in range(DENSE_SAVES):
        for v in local.values():
            v += 1.0
        pair = [save_store, save_fs] if r % 2 == 0 else [save_fs, save_store]
        for fn in pair:
            (dense_st if fn is save_store else dense_fs).append(fn(saves + r)[0])
    results["save_dense"] = (statistics.median(dense_fs), statistics.median(dense_st))
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
    ap.add_argument("--trust-versions", action="store_true",
                    help="StorageWriter(trust_versions=True): tensors whose in-place version "
                    "counter did not move since the last save are not compared")
    ap.add_argument("--location", help="the store's repository under this URL (s3://bucket/prefix; "
                    "credentials and endpoint from the AWS_* variables) instead of the local disk")
    ap.add_argument("--s3", action="store_true",
                    help="--location s3://$TH_S3_BUCKET (as .ci/s3-server.sh exports it)")
    a = ap.parse_args()
    mib = a.mib or (64 if a.quick else 256)
    saves = a.saves or (10 if a.quick else 20)
    location = a.location
    if a.s3:
        if location or not os.environ.get("TH_S3_BUCKET"):
            ap.error("--s3 needs TH_S3_BUCKET (source .ci/s3-server.sh; start_s3_server) "
                     "and no --location")
        location = f"s3://{os.environ['TH_S3_BUCKET']}"
    if location is not None and "://" not in location:
        ap.error(f"--location takes a URL (s3://bucket/prefix), not {location!r}")

    import json

    import torch
    import torch.multiprocessing as mp

    work = tempfile.mkdtemp(prefix="dcp-report-", dir=a.dir)
    out = os.path.join(work, "results.json")
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, 4 ranks (gloo), model {mib} MiB, "
          f"{saves} saves, in {work}, parts {'coded' if a.compress else 'raw'}"
          f"{', trust_versions' if a.trust_versions else ''}, store on "
          f"{location or 'the local disk'}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)
    if location is not None:
        try:
            import s3fs  # noqa: F401
            note = "s3fs is installed, but this report's baseline stays on the local disk"
        except ImportError:
            note = "s3fs is not installed (DCP's fsspec writer cannot reach S3)"
        print(f"baseline: FileSystemWriter on the local disk ({note})", file=sys.stderr)
    try:
        init = f"file://{work}/pg-{uuid.uuid4().hex}"
        mp.start_processes(child, args=(4, init, mib, saves, work, out, a.compress, location,
                                        a.trust_versions),
                           nprocs=4,
                           join=True,
                           start_method="fork")
        with open(out) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fs = "FileSystemWriter" if location is None else "FileSystemWriter, local disk"
    fr = "FileSystemReader" if location is None else "FileSystemReader, local disk"
    rep = Report()
    rep.add(f"save_first[{fs}]", "ms", *res["save_first"])
    rep.add(f"save_1pct[{fs}]", "ms", *res["save_1pct"])
    rep.add("save_1pct[null writer floor]", "ms", *res["save_1pct_null"])
    rep.add(f"written_1pct[{fs}]", "bytes", *res["written_1pct"])
    rep.add(f"save_dense[{fs}]", "ms", *res["save_dense"])
    rep.add(f"load[{fr}]", "ms", *res["load"])
    key = f"disk_after_{saves}_saves"
    rep.add(f"{key}[{fs}]", "bytes", *res[key])
    null, fs_1pct = res["save_1pct_null"][0], res["save_1pct"][0]
    print(f"1%-save: FileSystemWriter / null writer floor = {fs_1pct / null:.2f} (the most any "
          f"storage layer can gain over FileSystemWriter here)", file=sys.stderr)
    print("the store's 1%-save per step, median ms per rank (finish.*: the coordinator):",
          file=sys.stderr)
    for r, steps in enumerate(res["profile_1pct"]):
        print(f"  rank {r}: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items()),
              file=sys.stderr)
    rep.print()


if __name__ == "__main__":
    main()
