"""tensor_history.torch.dcp: a repository as a torch.distributed.checkpoint storage layer.

Ranks are forked processes joined by the gloo backend on CPU; the model is a state dict
of DTensors sharded over the ranks (a float32 matrix of 128 chunks, a bfloat16 one), a
replicated bias, a bool mask (a dtype the store keeps as raw bytes) and non-tensor
state (a bytes item). Every child checks what it loaded against the values the state
dict was built from, bit for bit; a failing child fails the test with its traceback.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import sys
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed or does not import: the DCP "
                            "tier did not run", exc_type=ImportError)
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available: the DCP tier did not run",
                allow_module_level=True)
try:
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as tmp_mp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh
except ImportError as e:  # pragma: no cover - depends on the torch build
    pytest.skip(f"torch.distributed.checkpoint or DTensor unavailable ({e}): the DCP tier "
                "did not run", allow_module_level=True)

import tensor_history as th
from tensor_history.torch.dcp import (
    METADATA_NAME,
    StorageReader,
    StorageWriter,
    VersionMismatch,
    export_safetensors,
    whole_tensors,
)

ROWS, COLS = 2048, 4096          # 32 MiB of float32: 128 chunks of 256 KiB
H_ROWS, H_COLS = 64, 32


def full_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(ROWS, COLS, generator=g),
        "h": torch.randn(H_ROWS, H_COLS, generator=g).to(torch.bfloat16),
        "b": torch.arange(64, dtype=torch.float32) + seed,
        "mask": torch.arange(16) % 3 == seed % 3,
    }


def sharded(full: dict, world: int, rank: int, mesh, extra=None) -> dict:
    sd = {}
    for k in ("w", "h"):
        local = full[k].chunk(world)[rank].clone()
        sd[k] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    sd["b"] = full["b"].clone()
    sd["mask"] = full["mask"].clone()
    sd["extra"] = extra if extra is not None else {"epoch": 3, "name": "run"}
    return sd


def empty_like_sharded(world: int, rank: int, mesh) -> dict:
    z = {k: torch.zeros_like(v) for k, v in full_state(0).items()}
    sd = sharded(z, world, rank, mesh, extra={"epoch": -1, "name": ""})
    return sd


def check_loaded(sd: dict, full: dict, world: int, rank: int, extra=None) -> None:
    for k in ("w", "h"):
        local = sd[k].to_local()
        want = full[k].chunk(world)[rank]
        assert torch.equal(local.view(torch.uint8) if local.dtype == torch.bool else local,
                           want), f"rank {rank}: {k} differs"
        assert local.dtype == want.dtype
    assert torch.equal(sd["b"], full["b"]), f"rank {rank}: b differs"
    assert torch.equal(sd["mask"], full["mask"]) and sd["mask"].dtype == torch.bool
    assert sd["extra"] == (extra or {"epoch": 3, "name": "run"}), sd["extra"]


def _child(rank, world, init, fn, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (world,))
        fn(rank, world, mesh, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(world: int, tmp_path, fn, *args) -> None:
    """Run fn(rank, world, mesh, *args) in `world` forked ranks; raise a child's error."""
    init = f"file://{tmp_path}/pg-{uuid.uuid4().hex}"
    tmp_mp.start_processes(_child, args=(world, init, fn, args), nprocs=world,
                           join=True, start_method="fork")


# ---- what the ranks do ----------------------------------------------------------------

def save_step(rank, world, mesh, repo, seed, meta):
    dcp.save(sharded(full_state(seed), world, rank, mesh),
             storage_writer=StorageWriter(repo, **meta))


def load_and_check(rank, world, mesh, repo, seed, ref):
    sd = empty_like_sharded(world, rank, mesh)
    dcp.load(sd, storage_reader=StorageReader(repo, ref=ref))
    check_loaded(sd, full_state(seed), world, rank)


def save_twice_counting_bytes(rank, world, mesh, repo, out):
    full = full_state(1)
    w1 = StorageWriter(repo, message="first", step=1)
    dcp.save(sharded(full, world, rank, mesh), storage_writer=w1)
    first = [None] * world
    dist.all_gather_object(first, w1.last_part.bytes_written)
    # One row of rank 0's shard changes: one chunk of 128.
    full["w"][3, :] += 1.0
    # The same writer again: it keeps its last save's items and copies and hashes only
    # what changed (what it writes must not depend on that).
    w2 = w1
    w2.message, w2.meta = "second", {"step": 2}
    dcp.save(sharded(full, world, rank, mesh), storage_writer=w2)
    second = [None] * world
    dist.all_gather_object(second, w2.last_part.bytes_written)
    # Everything changes.
    dense = {k: (v + 1 if v.dtype != torch.bool else ~v) for k, v in full.items()}
    w1.message, w1.meta = "dense", {"step": 3}
    v2 = [w2.last_version]
    dcp.save(sharded(dense, world, rank, mesh), storage_writer=w1)
    third = [None] * world
    dist.all_gather_object(third, w1.last_part.bytes_written)
    dist.broadcast_object_list(v2, src=0)
    sd = empty_like_sharded(world, rank, mesh)
    dcp.load(sd, storage_reader=StorageReader(repo, ref=v2[0]))
    check_loaded(sd, full, world, rank)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{sum(first)} {sum(second)} {sum(third)} {v2[0]}\n")


def save_raw_and_compressed(rank, world, mesh, raw_repo, coded_repo, out):
    full = full_state(6)
    written = []
    for repo, compress in ((raw_repo, False), (coded_repo, True)):
        w = StorageWriter(repo, compress=compress)
        dcp.save(sharded(full, world, rank, mesh), storage_writer=w)
        each = [None] * world
        dist.all_gather_object(each, w.last_part.bytes_written)
        written.append(sum(each))
        sd = empty_like_sharded(world, rank, mesh)
        dcp.load(sd, storage_reader=StorageReader(repo))
        check_loaded(sd, full, world, rank)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{written[0]} {written[1]}\n")


def async_save_and_load(rank, world, mesh, repo):
    full = full_state(5)
    fut = dcp.async_save(sharded(full, world, rank, mesh),
                         storage_writer=StorageWriter(repo, message="async"))
    fut.result()
    sd = empty_like_sharded(world, rank, mesh)
    dcp.load(sd, storage_reader=StorageReader(repo))
    check_loaded(sd, full, world, rank)


class FailingWriter(StorageWriter):
    """Rank 2 fails in write_data after the other ranks wrote their parts."""

    def write_data(self, plan, planner):
        if dist.get_rank() == 2:
            raise OSError("disk gone on rank 2")
        return super().write_data(plan, planner)


def failing_save(rank, world, mesh, repo):
    with pytest.raises(CheckpointException):
        dcp.save(sharded(full_state(7), world, rank, mesh),
                 storage_writer=FailingWriter(repo, message="never"))


class KilledWriter(StorageWriter):
    """Rank 2 is killed (SIGKILL) in write_data, after its part is written and before
    the coordinator hears of it."""

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        if dist.get_rank() == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return fut


def killed_save(rank, world, mesh, repo):
    dcp.save(sharded(full_state(9), world, rank, mesh),
             storage_writer=KilledWriter(repo, message="never"))


class FailingFinish(StorageWriter):
    """The coordinator fails in finish, after every rank wrote its part."""

    def finish(self, metadata, results):
        raise OSError("coordinator lost its disk")


def failing_finish(rank, world, mesh, repo):
    with pytest.raises(CheckpointException):
        dcp.save(sharded(full_state(8), world, rank, mesh),
                 storage_writer=FailingFinish(repo, message="never"))


def concurrent_saves(rank, world, mesh, repo, job, n, out):
    ok, lost = 0, 0
    for i in range(n):
        try:
            dcp.save(sharded(full_state(100 * job + i), world, rank, mesh),
                     storage_writer=StorageWriter(repo, message=f"job{job}-{i}"))
            ok += 1
        except CheckpointException as e:
            assert "BranchMoved" in repr(e) or "moved" in str(e), repr(e)
            lost += 1
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{ok} {lost}\n")


def move_main_same_layout(repo):
    """A save that moves main: every shard of `w` + 1, DCP metadata unchanged."""
    s = th.Store.open(repo)
    for name in s.snapshot("main").keys():
        if name.startswith("w@"):
            s.write(name, s.get(name) + np.float32(1))
    s.commit("moved: w + 1")
    s.save()


def move_main_other_layout(repo):
    """A save that moves main to a version whose DCP metadata has another item."""
    import pickle

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    from tensor_history.torch import dcp as th_dcp

    s = th.Store.open(repo)
    md = pickle.loads(s.get(METADATA_NAME).tobytes())
    md.state_dict_metadata["ghost"] = BytesStorageMetadata()
    md.storage_data[MetadataIndex("ghost")] = th_dcp._Item("ghost", "0" * 64)
    s.remove(METADATA_NAME)
    s.insert(METADATA_NAME, np.frombuffer(pickle.dumps(md), dtype=np.uint8))
    s.commit("moved: another layout")
    s.save()


class MovingReader(StorageReader):
    """A save moves the branch between the ranks' read_metadata: rank `first` reads,
    then `move(repo)` runs on it, then the other ranks read."""

    def __init__(self, repo, move, first):
        super().__init__(repo)
        self.move, self.first = move, first

    def read_metadata(self, *args, **kwargs):
        me = dist.get_rank()
        md = super().read_metadata(*args, **kwargs) if me == self.first else None
        dist.barrier()
        if me == self.first:
            self.move(self.location)
        dist.barrier()
        return md if me == self.first else super().read_metadata(*args, **kwargs)


def load_while_main_moves(rank, world, mesh, repo, move, first, out):
    sd = empty_like_sharded(world, rank, mesh)
    reader = MovingReader(repo, move, first)
    try:
        dcp.load(sd, storage_reader=reader)
    except CheckpointException as e:
        if rank == 0:
            with open(out, "w") as f:
                f.write(repr(e))
        return
    # every rank loaded the coordinator's version: w as saved (rank 0 read before the
    # move) or w + 1 (after it)
    full = full_state(1)
    if first != 0:
        full["w"] = full["w"] + 1
    check_loaded(sd, full, world, rank)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"loaded {reader.version}\n")


def save_around_another_commit(rank, world, mesh, repo):
    """One writer saves twice; between its saves another process's commit moves main."""
    w = StorageWriter(repo, message="first")
    dcp.save(sharded(full_state(1), world, rank, mesh), storage_writer=w)
    dist.barrier()
    if rank == 0:
        move_main_same_layout(repo)
    dist.barrier()
    w.message = "second"
    dcp.save(sharded(full_state(2), world, rank, mesh), storage_writer=w)
    sd = empty_like_sharded(world, rank, mesh)
    dcp.load(sd, storage_reader=StorageReader(repo))
    check_loaded(sd, full_state(2), world, rank)


def save_trusting_versions(rank, world, mesh, repo, out):
    """Saves of one state dict (the same tensors) by a trust_versions writer: an
    in-place op, then a write through a .numpy() view (missed: the documented caveat),
    a fresh tensor, and last a default writer (which compares everything)."""
    sd = sharded(full_state(1), world, rank, mesh)
    w = StorageWriter(repo, trust_versions=True)
    versions = []

    def save(writer, message):
        writer.message = message
        dcp.save(sd, storage_writer=writer)
        box = [writer.last_version]
        dist.broadcast_object_list(box, src=0)
        versions.append(box[0])

    save(w, "first")
    sd["w"].to_local()[3, :] += 1.0
    save(w, "in-place add")
    sd["w"].to_local().numpy()[5, :] = 7.0
    save(w, "numpy write")
    sd["b"] = sd["b"] + 1
    save(w, "fresh b")
    save(StorageWriter(repo), "default writer")
    if rank == 0:
        with open(out, "w") as f:
            f.write(" ".join(versions) + "\n")


# ---- fixtures --------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _own_process():
    """The ranks are forked: a process that loaded JAX or TensorFlow (their thread pools)
    must not fork. Run this file in its own process, as the framework tiers do."""
    loaded = [m for m in ("jax", "tensorflow") if m in sys.modules]
    if loaded:
        pytest.skip(f"{', '.join(loaded)} loaded in this process; forked ranks could "
                    "deadlock: run tests/test_dcp.py in a process of its own")


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory):
    """A repository with one DCP save of 4 ranks (seed 1) on main."""
    base = tmp_path_factory.mktemp("dcp")
    repo = str(base / "repo")
    run(4, base, save_step, repo, 1, {"step": 1})
    return repo


def copy_repo(src, tmp_path) -> str:
    dst = str(tmp_path / "repo")
    shutil.copytree(src, dst)
    return dst


def disk_bytes(path, sub="") -> int:
    total = 0
    for root, _, files in os.walk(os.path.join(path, sub)):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def keys(path, sub) -> set:
    out = set()
    for root, _, files in os.walk(os.path.join(path, sub)):
        out.update(os.path.relpath(os.path.join(root, f), path) for f in files)
    return out


# ---- tests -----------------------------------------------------------------------------

def test_a_save_by_4_ranks_is_one_version_with_every_shard_and_the_metadata(saved_by_4):
    s = th.Store.open(saved_by_4)
    log = s.log("main")
    assert len(log) == 1 and log[0].message == "dcp save"
    assert s.metadata("main") == {"step": 1}
    names = set(s.snapshot("main").keys())
    rows = ROWS // 4
    assert {f"w@{r * rows},0" for r in range(4)} <= names
    assert {"b", "mask", "extra.epoch", "extra.name", METADATA_NAME} <= names
    # A shard is a plain tensor of the version: any store reads it.
    full = full_state(1)
    assert np.array_equal(s.get(f"w@{rows},0", at="main"), full["w"][rows:2 * rows].numpy())
    assert s.get("mask", at="main").dtype == np.uint8


def test_whole_tensors_assemble_the_shards_of_a_save_in_one_process(saved_by_4):
    got = whole_tensors(saved_by_4)
    full = full_state(1)
    assert set(got) == {"w", "h", "b", "mask", "extra.epoch", "extra.name"}
    for k, v in full.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert isinstance(got["extra.epoch"], bytes)


def test_a_save_exports_as_one_safetensors_file_of_whole_tensors(saved_by_4, tmp_path):
    path = tmp_path / "model.safetensors"
    left_out = export_safetensors(saved_by_4, path)
    assert left_out == ["extra.epoch", "extra.name", "mask"]
    back = th.Store()
    assert back.import_safetensors(path) == ["b", "h", "w"]
    full = full_state(1)
    assert np.array_equal(back.get("w"), full["w"].numpy())
    assert np.array_equal(back.get("h").view(np.uint16), full["h"].view(torch.uint16).numpy())


def test_whole_tensors_of_a_version_that_is_not_a_dcp_save_is_a_key_error(tmp_path):
    s = th.Store()
    s.insert("w", np.ones(3, dtype=np.float32))
    s.commit("plain")
    s.save_as(tmp_path / "plain")
    with pytest.raises(KeyError, match="not a DCP save"):
        whole_tensors(tmp_path / "plain")


def test_a_save_by_4_ranks_loads_bit_for_bit_into_4_ranks(saved_by_4, tmp_path):
    run(4, tmp_path, load_and_check, saved_by_4, 1, "main")


def test_a_save_by_4_ranks_loads_resharded_into_2_and_1_ranks(saved_by_4, tmp_path):
    run(2, tmp_path, load_and_check, saved_by_4, 1, "main")
    run(1, tmp_path, load_and_check, saved_by_4, 1, "main")


def check_one_percent_save(repo: str, tmp_path) -> None:
    """4 ranks save, change 1% of the rows and save, then change everything and save, into
    `repo` (a directory or a URL): the bytes each save wrote, and the 1% version."""
    out = str(tmp_path / "bytes.txt")
    run(4, tmp_path, save_twice_counting_bytes, repo, out)
    first, second, dense, v2 = open(out).read().split()
    first, second, dense = int(first), int(second), int(dense)
    model = ROWS * COLS * 4
    # every chunk written, as it is (the writer's default)
    assert first >= model, (first, model)
    # one chunk of 256 KiB of 128, plus index and manifests
    assert second < 0.02 * first, (second, first)
    assert dense >= model, (dense, model)
    s = th.Store.open(repo)
    assert [e.message for e in s.log("main")] == ["dense", "second", "first"]
    assert s.metadata(v2) == {"step": 2}
    # the 1% version loads bit for bit (checked in the ranks); its rank-0 shard differs
    # from the first version in exactly one row
    a = s.get("w@0,0", at=v2)
    b = s.get("w@0,0", at=s.log("main")[2].id)
    assert np.flatnonzero((a != b).any(axis=1)).tolist() == [3]


def test_a_second_save_with_1_percent_changed_writes_about_1_percent_of_the_bytes(tmp_path):
    check_one_percent_save(str(tmp_path / "repo"), tmp_path)


def test_compress_stores_the_parts_byte_plane_coded_and_they_load_bit_for_bit(tmp_path):
    raw, coded = str(tmp_path / "raw"), str(tmp_path / "coded")
    out = str(tmp_path / "bytes.txt")
    run(2, tmp_path, save_raw_and_compressed, raw, coded, out)
    raw_bytes, coded_bytes = map(int, open(out).read().split())
    model = ROWS * COLS * 4
    assert raw_bytes >= model, (raw_bytes, model)
    # the model's float32 weights code to well under their raw bytes
    assert coded_bytes < 0.95 * raw_bytes, (coded_bytes, raw_bytes)
    for repo in (raw, coded):
        th.Store.open(repo).verify()


def test_async_save_writes_a_version_that_loads_bit_for_bit(saved_by_4, tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    run(4, tmp_path, async_save_and_load, repo)
    s = th.Store.open(repo)
    assert [e.message for e in s.log("main")] == ["async", "dcp save"]


def test_a_rank_failing_in_write_data_leaves_no_new_version_and_gc_cleans_up(saved_by_4,
                                                                              tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    before = th.Store.open(repo).version_hash("main")
    packs_before = keys(repo, "packs")
    manifests_before = keys(repo, "manifests")
    run(4, tmp_path, failing_save, repo)
    s = th.Store.open(repo)
    assert s.version_hash("main") == before
    assert len(s.versions()) == 1
    assert keys(repo, "packs") > packs_before  # the other ranks' parts: garbage
    run(2, tmp_path, load_and_check, repo, 1, "main")
    # gc's two phases in one process (grace 0: no other writer)
    s.gc(grace=0)
    assert keys(repo, "packs") == packs_before
    assert keys(repo, "manifests") == manifests_before
    run(1, tmp_path, load_and_check, repo, 1, "main")


def test_a_rank_killed_in_write_data_leaves_no_new_version(saved_by_4, tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    before = th.Store.open(repo).version_hash("main")
    packs_before = keys(repo, "packs")
    with pytest.raises((tmp_mp.ProcessExitedException, tmp_mp.ProcessRaisedException)):
        run(4, tmp_path, killed_save, repo)
    s = th.Store.open(repo)
    assert s.version_hash("main") == before and len(s.versions()) == 1
    run(1, tmp_path, load_and_check, repo, 1, "main")
    s.gc(grace=0)
    assert keys(repo, "packs") == packs_before


def test_a_coordinator_failing_in_finish_leaves_no_new_version(saved_by_4, tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    before = th.Store.open(repo).version_hash("main")
    packs_before = keys(repo, "packs")
    run(4, tmp_path, failing_finish, repo)
    s = th.Store.open(repo)
    assert s.version_hash("main") == before and len(s.versions()) == 1
    assert keys(repo, "packs") > packs_before
    run(2, tmp_path, load_and_check, repo, 1, "main")


def test_two_coordinators_on_one_branch_one_wins_and_the_other_raises_branch_moved(
        saved_by_4, tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    writers = []
    for seed in (1, 2):
        w = th.Store()
        w.insert("x", np.full(1000, seed, dtype=np.float32))
        writers.append(w.write_part(repo).items)
    a, b = th.Store.open(repo), th.Store.open(repo)
    a.commit_parts("main", [writers[0]], "a")
    b.commit_parts("main", [writers[1]], "b")
    a.save()
    with pytest.raises(th.BranchMoved) as e:
        b.save()
    assert e.value.theirs is not None
    r = th.Store.open(repo)
    assert [x.message for x in r.log("main")] == ["a", "dcp save"]
    # the DCP version under the winner is intact
    run(1, tmp_path, load_and_check, repo, 1, r.version_hash(r.log("main")[1].id))


def test_concurrent_dcp_saves_to_one_branch_lose_nothing(saved_by_4, tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    import multiprocessing

    n = 3
    outs = [str(tmp_path / f"job{j}.txt") for j in (0, 1)]
    ctx = multiprocessing.get_context("fork")
    jobs = [ctx.Process(target=run, args=(2, tmp_path, concurrent_saves, repo, j, n, outs[j]))
            for j in (0, 1)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join(timeout=300)
        assert j.exitcode == 0, j.exitcode
    ok = lost = 0
    for o in outs:
        a, b = map(int, open(o).read().split())
        ok, lost = ok + a, lost + b
    assert ok + lost == 2 * n and ok >= 1
    s = th.Store.open(repo)
    messages = [e.message for e in s.log("main")]
    assert len(messages) == ok + 1, messages  # every save that returned is in the history
    assert messages[-1] == "dcp save"


@pytest.mark.parametrize("coordinator_read", ["before the move", "after the move"])
def test_a_save_moving_the_branch_during_a_load_pins_the_coordinators_version(
        saved_by_4, tmp_path, coordinator_read):
    repo = copy_repo(saved_by_4, tmp_path)
    old = th.Store.open(repo).version_hash("main")
    out = str(tmp_path / "out.txt")
    first = 0 if coordinator_read == "before the move" else 3
    run(4, tmp_path, load_while_main_moves, repo, move_main_same_layout, first, out)
    s = th.Store.open(repo)
    new = s.version_hash("main")
    assert new != old and [e.message for e in s.log("main")] == ["moved: w + 1", "dcp save"]
    # the ranks resolved main to two versions, and all loaded the coordinator's (checked
    # bit for bit in the ranks)
    assert open(out).read().split() == ["loaded", old if first == 0 else new]


def test_a_save_of_another_layout_moving_the_branch_during_a_load_raises(saved_by_4,
                                                                          tmp_path):
    repo = copy_repo(saved_by_4, tmp_path)
    out = str(tmp_path / "out.txt")
    run(4, tmp_path, load_while_main_moves, repo, move_main_other_layout, 0, out)
    err = open(out).read()
    assert issubclass(VersionMismatch, RuntimeError)
    assert "VersionMismatch" in err and "differ from the coordinator" in err, err


def test_a_reused_writer_saves_on_top_of_what_another_process_saved_in_between(tmp_path):
    # the coordinator keeps the repository open between saves and takes in the other
    # process's version (a stale view would lose the race: BranchMoved)
    repo = str(tmp_path / "repo")
    run(2, tmp_path, save_around_another_commit, repo)
    s = th.Store.open(repo)
    assert [e.message for e in s.log("main")] == ["second", "moved: w + 1", "first"]


def test_trust_versions_skips_tensors_whose_version_counter_did_not_move(tmp_path):
    repo = str(tmp_path / "repo")
    out = str(tmp_path / "versions.txt")
    run(2, tmp_path, save_trusting_versions, repo, out)
    v1, v2, v3, v4, v5 = open(out).read().split()
    s = th.Store.open(repo)
    full = full_state(1)
    rows = ROWS // 2

    def w(v, r):
        return s.get(f"w@{r * rows},0", at=v)

    for r in (0, 1):  # every rank's shard
        want = full["w"][r * rows:(r + 1) * rows].numpy().copy()
        assert np.array_equal(w(v1, r), want)
        want[3] += 1.0  # the in-place add is saved
        assert np.array_equal(w(v2, r), want)
        # the write through a .numpy() view moved no counter: not saved (the caveat)
        assert np.array_equal(w(v3, r), want) and np.array_equal(w(v4, r), want)
        want[5] = 7.0  # a default writer compares everything: saved
        assert np.array_equal(w(v5, r), want)
    assert np.array_equal(s.get("b", at=v3), full["b"].numpy())
    assert np.array_equal(s.get("b", at=v4), full["b"].numpy() + 1)  # a fresh tensor
