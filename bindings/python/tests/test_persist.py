"""Persistence from Python: save, open, refresh, gc and content addresses, with several
stores (and processes) on one repository, and errors that change nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tensor_history as th
from conftest import DTYPES, random_array, same


def history(s: th.Store) -> dict:
    """Everything a reopened store must bring back, keyed by content address."""
    out = {"refs": {}, "versions": {}}
    for name, kind, v in s.refs():
        out["refs"][name] = (kind, s.version_hash(v))
    for v in s.versions():
        snap = s.snapshot(v)
        out["versions"][s.version_hash(v)] = {
            "message": snap.message,
            "time": snap.time,
            "metadata": s.metadata(v),
            "parents": [s.version_hash(p) for p in s.parents(v)],
            "arrays": {k: snap[k] for k in snap.keys()},
        }
    h = s.head()
    out["head"] = s.version_hash(h) if h is not None else None
    out["branch"] = s.current_branch()
    return out


def assert_same_history(a: dict, b: dict) -> None:
    assert a["refs"] == b["refs"]
    assert a["head"] == b["head"] and a["branch"] == b["branch"]
    assert a["versions"].keys() == b["versions"].keys()
    for h, va in a["versions"].items():
        vb = b["versions"][h]
        for k in ("message", "time", "metadata", "parents"):
            assert va[k] == vb[k], (h, k)
        assert va["arrays"].keys() == vb["arrays"].keys()
        for k, arr in va["arrays"].items():
            assert same(arr, vb["arrays"][k]), (h, k)


def rich_store() -> th.Store:
    """Every dtype, several chunk sizes, branches, tags, messages and metadata."""
    rng = np.random.default_rng(7)
    s = th.Store(chunk_bytes=256)
    for i, dt in enumerate(DTYPES):
        shape = [(), (0,), (37,), (9, 13), (3, 0, 2), (5, 4, 3)][i % 6]
        s.insert(f"t{i}", random_array(rng, dt, shape))
    s.insert("big", random_array(rng, np.dtype(np.float32), (64, 33)), chunk_bytes=1024)
    v0 = s.commit("init: ünïcode message", step=0, lr=0.1, note="first", ok=True)
    s.tag("start")
    s.branch("side")
    for step in range(1, 4):
        big = s.get("big")
        big[step] += 1
        s.write("big", big)
        s.commit(f"step {step}", step=step)
    s.checkout("side")
    s.write("t2", random_array(rng, s.get("t2").dtype, s.get("t2").shape))
    s.commit("side change", loss=float("inf"))
    s.merge("main", strategy="theirs")
    s.tag("merged")
    s.checkout("main")
    assert s.resolve("start") == v0
    return s


def test_save_as_then_open_brings_back_every_version_ref_and_message(tmp_path):
    s = rich_store()
    before = history(s)
    stats = s.save_as(tmp_path / "repo")
    assert s.location is not None and Path(s.location) == tmp_path / "repo"
    assert stats.versions_written == len(s.versions()) and stats.chunks_written > 0
    # The saving store still answers the same after its chunks left the heap.
    assert_same_history(before, history(s))
    r = th.Store.open(tmp_path / "repo")
    assert Path(r.location) == tmp_path / "repo"
    assert_same_history(before, history(r))
    assert not r.is_dirty() and r.current_branch() == "main"
    for name in s.names():
        assert same(r[name], s[name])
    r.verify()


def test_snapshot_info_gives_each_versions_layouts_and_reads_no_data(tmp_path):
    s = th.Store(chunk_bytes=1024)
    s.insert("w", np.zeros((8, 4), np.float32))
    s.insert("b", np.zeros(3, np.int16))
    v0 = s.commit("small")
    s.remove("w")
    s.insert("w", np.ones((16, 4), np.float64))
    v1 = s.commit("wider")
    s.save_as(tmp_path / "repo")
    r = th.Store.open(tmp_path / "repo")
    for v, want in ((v0, ("f32", [8, 4])), (v1, ("f64", [16, 4]))):
        snap = r.snapshot(v)
        assert snap.info("w") == want
        assert snap.info("b") == ("i16", [3])
        assert list(snap["w"].shape) == want[1]
        with pytest.raises(th.UnknownVariable):
            snap.info("nope")
    assert r.info("w") == ("f64", [16, 4])
    # Layouts come from the manifests that the open read: with the packs deleted after
    # it, info still answers and a read fails.
    r2 = th.Store.open(tmp_path / "repo")
    snap = r2.snapshot(v1)
    for pack in (tmp_path / "repo" / "packs").rglob("*.thpack"):
        pack.unlink()
    assert snap.info("w") == ("f64", [16, 4]) and r2.info("w") == ("f64", [16, 4])
    with pytest.raises(th.TensorHistoryError):
        r2.get("w")


def test_second_save_writes_only_new_chunks(tmp_path):
    s = th.Store(chunk_bytes=1024)
    s.insert("w", np.random.default_rng(0).random((64, 64), np.float32))
    s.commit("a")
    first = s.save_as(tmp_path)
    assert first.chunks_written == 16
    again = s.save()
    assert again.versions_written == 0 and again.chunks_written == 0
    w = s.get("w")
    w[0, 0] = 1
    s.write("w", w)
    s.commit("b")
    third = s.save()
    assert third.versions_written == 1 and third.chunks_written == 1
    assert third.chunks_present == 15
    assert third.bytes_written < first.bytes_written / 4


def test_dense_steps_are_saved_as_deltas_and_stats_report_raw_and_stored_bytes(tmp_path):
    rng = np.random.default_rng(1)
    w = (rng.random(16384, np.float32) - 0.5) * 0.2
    s = th.Store(chunk_bytes=16384)
    s.insert("w", w)
    s.commit("step 0")
    first = s.save_as(tmp_path)
    assert first.chunk_bytes_raw == w.nbytes
    assert first.chunk_bytes_stored <= first.chunk_bytes_raw
    w = w * (1 + 1e-4 * (rng.random(w.shape, np.float32) - 0.5))
    s.write("w", w)
    s.commit("step 1")
    second = s.save()
    assert second.chunk_bytes_raw == w.nbytes
    # A dense step stored as deltas takes well under its raw bytes.
    assert second.chunk_bytes_stored * 3 < second.chunk_bytes_raw * 2
    assert "chunk_bytes_stored=" in repr(second)
    r = th.Store.open(tmp_path)
    assert same(r.get("w"), w)
    st = r.stats()
    assert st.stored_bytes == 2 * w.nbytes
    assert st.stored_pack_bytes == first.chunk_bytes_stored + second.chunk_bytes_stored


def test_uncommitted_changes_are_not_saved(tmp_path):
    s = th.Store()
    s.insert("w", np.arange(4.0))
    s.commit("a")
    s.write("w", np.zeros(4))
    s.save_as(tmp_path)
    r = th.Store.open(tmp_path)
    assert same(r["w"], np.arange(4.0))
    assert s.is_dirty() and same(s["w"], np.zeros(4))


def test_content_address_is_the_same_in_a_child_process_and_resolves_by_prefix(tmp_path):
    s = rich_store()
    s.save_as(tmp_path)
    head = s.head()
    full = s.version_hash(head)
    assert len(full) == 64 and int(full, 16) >= 0
    assert s.resolve(full[:12]) == head
    child = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        import tensor_history as th
        s = th.Store.open(sys.argv[1])
        h = s.head()
        out = {
            "head": s.version_hash(h),
            "branch": s.current_branch(),
            "refs": sorted([n, k, s.version_hash(v)] for n, k, v in s.refs()),
            "sums": {n: s[n].tobytes().hex() for n in s.names()},
            "log": [[e.message, e.metadata] for e in s.log()],
        }
        s.verify()
        # the child also saves a new version for the parent to pick up
        big = s.get("big"); big[:] = 7; s.write("big", big)
        out["child"] = s.version_hash(s.commit("from the child", pid=1))
        s.save()
        print(json.dumps(out))
        """
    )
    res = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True,
                         text=True, check=True)
    got = json.loads(res.stdout)
    assert got["head"] == full and got["branch"] == "main"
    assert got["refs"] == sorted([n, k, s.version_hash(v)] for n, k, v in s.refs())
    assert got["sums"] == {n: s[n].tobytes().hex() for n in s.names()}
    assert got["log"] == [[e.message, e.metadata] for e in s.log()]
    # the parent takes in the child's save
    r = s.refresh()
    assert r.versions_loaded == 1 and "main" in r.refs_updated and r.diverged == []
    assert s.version_hash(s.head()) == got["child"]
    assert (s["big"] == 7).all()
    assert s.log()[0].metadata == {"pid": 1}


def test_conflict_is_a_deprecated_alias_of_branch_moved():
    with pytest.warns(DeprecationWarning, match="BranchMoved"):
        alias = th.Conflict
    assert alias is th.BranchMoved
    with pytest.warns(DeprecationWarning):
        from tensor_history import Conflict
    assert Conflict is th.BranchMoved
    assert "Conflict" not in th.__all__ and "BranchMoved" in th.__all__
    with pytest.raises(AttributeError):
        th.NoSuchError


def test_two_stores_on_one_repository_conflict_then_refresh_and_merge(tmp_path):
    a = th.Store()
    a.insert("w", np.zeros(8, np.float32))
    a.insert("b", np.zeros(8, np.float32))
    a.commit("base")
    a.save_as(tmp_path)
    b = th.Store.open(tmp_path)

    w = a.get("w"); w[0] = 1; a.write("w", w)
    va = a.commit("a's change")
    a.save()

    x = b.get("b"); x[7] = 2; b.write("b", x)
    vb = b.commit("b's change")
    head, versions = b.head(), b.versions()
    with pytest.raises(th.BranchMoved) as e:
        b.save()
    assert e.value.branch == "main"
    assert b.head() == head and b.versions() == versions and b.current_branch() == "main"
    assert same(b["b"], x)
    # the repository still has a's version on main
    assert th.Store.open(tmp_path).version_hash("main") == a.version_hash(va)

    r = b.refresh()
    assert r.diverged == ["main"] and r.versions_loaded == 1
    assert b.resolve("main") == vb
    theirs = b.resolve(a.version_hash(va)[:16])
    merged = b.merge(theirs)
    assert same(b["w"], w) and same(b["b"], x)
    b.save()
    a.refresh()
    assert a.version_hash("main") == b.version_hash(merged)
    assert same(a["w"], w) and same(a["b"], x)


def test_stores_on_different_branches_both_land(tmp_path):
    a = th.Store()
    a.insert("w", np.zeros(4))
    a.commit("base")
    a.save_as(tmp_path)
    b = th.Store.open(tmp_path)
    b.branch("exp"); b.checkout("exp")
    b.write("w", np.ones(4)); b.commit("exp step")
    a.write("w", np.full(4, 2.0)); a.commit("main step")
    b.save()
    a.save()
    c = th.Store.open(tmp_path)
    assert same(c.get("w", at="exp"), np.ones(4))
    assert same(c.get("w", at="main"), np.full(4, 2.0))


def test_save_without_repository_raises_and_changes_nothing():
    s = th.Store()
    s.insert("w", np.arange(3))
    s.commit("a")
    with pytest.raises(th.InvalidArgument):
        s.save()
    with pytest.raises(th.InvalidArgument):
        s.refresh()
    with pytest.raises(th.InvalidArgument):
        s.gc()
    assert s.location is None and len(s.versions()) == 1


def test_save_as_into_a_file_raises_storage_error_and_keeps_the_old_location(tmp_path):
    s = th.Store()
    s.insert("w", np.arange(3))
    s.commit("a")
    s.save_as(tmp_path / "good")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((th.StorageError, th.UnsupportedFormat)) as e:
        s.save_as(blocker)
    assert isinstance(e.value, (OSError, ValueError))
    assert Path(s.location) == tmp_path / "good"
    assert blocker.read_text() == "not a directory"
    s.write("w", np.arange(3) + 1)
    s.commit("b")
    assert s.save().versions_written == 1


def test_open_of_a_directory_that_is_not_a_repository_raises(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(th.UnsupportedFormat) as e:
        th.Store.open(tmp_path)
    assert isinstance(e.value, ValueError) and e.value.path
    assert (tmp_path / "notes.txt").read_text() == "hello"
    # no repository file was written (the local backend may leave its empty tmp/ folder)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["notes.txt"]


def test_a_damaged_pack_raises_corrupt_object_naming_it(tmp_path):
    s = th.Store(chunk_bytes=1024)
    s.insert("w", np.random.default_rng(0).random((32, 32)))
    s.commit("a")
    s.save_as(tmp_path)
    packs = [p for p in tmp_path.rglob("*") if p.is_file() and "pack" in str(p.relative_to(tmp_path))]
    assert packs
    for p in packs:
        data = bytearray(p.read_bytes())
        data[4096 + 100] ^= 0xFF  # inside the first chunk (chunks start at 4 KiB)
        p.write_bytes(bytes(data))
    r = th.Store.open(tmp_path)
    with pytest.raises(th.Corrupt) as e:
        r.get("w")
    assert isinstance(e.value, th.CorruptObject) and e.value.path


def test_gc_dry_run_deletes_nothing_and_gc_deletes_what_prune_dropped(tmp_path):
    s = th.Store(chunk_bytes=1024)
    w = np.zeros((64, 64), np.float32)
    s.insert("w", w)
    s.commit("v0")
    for i in range(1, 5):
        w = w + 1
        s.write("w", w)
        s.commit(f"v{i}")
    s.save_as(tmp_path)
    s.prune(keep_last=1, drop_unreachable=True)
    s.save()
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    dry = s.gc(grace=0, dry_run=True)
    assert dry.objects_deleted > 0 and dry.versions_live >= 1
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files
    real = s.gc(grace=0)
    # the dry run counts objects it would delete, not the packs it would rewrite
    assert real.objects_deleted >= dry.objects_deleted and real.bytes_deleted > 0
    assert real.packs_rewritten == dry.packs_rewritten
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < size
    r = th.Store.open(tmp_path)
    assert same(r["w"], w)
    r.verify()


def test_gc_rebase_stores_parts_written_whole_as_deltas_and_reads_them_back(tmp_path):
    # Dense steps written as parts (as DCP saves write them: every chunk whole), then
    # gc(rebase=True) codes them again against the previous step's chunks.
    loc = str(tmp_path)
    w = np.sin(np.arange(200_000, dtype=np.float32) * 0.01)
    c = th.Store.open(loc)
    steps = []
    for i in range(4):
        writer = th.Store()
        writer.insert("w", w)
        c.commit_parts("main", [writer.write_part(loc, compress=False).items], f"step {i}")
        c.save()
        steps.append(w.copy())
        w = w * np.float32(1 - 3e-5)
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(th.InvalidArgument):
        c.gc(grace=0, rebase=True, repack_below=2.0)
    st = c.gc(grace=0, rebase=True)
    # 3 of the 4 steps have a parent; w is 800 KB: 4 chunks of 256 KiB (one shorter)
    assert st.chunks_rebased == 3 * 4 and st.packs_rewritten == 3, st
    assert st.rewritten_bytes_after < 0.9 * st.rewritten_bytes_before
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 0.75 * size
    r = th.Store.open(loc)
    r.verify()
    log = list(reversed(r.log("main")))
    assert [e.message for e in log] == [f"step {i}" for i in range(4)]
    for e, want in zip(log, steps):
        assert same(r.snapshot(e.id)["w"], want)
    assert r.gc(grace=0, rebase=True).chunks_rebased == 0


def test_gc_unchains_kept_versions_so_that_pruned_versions_in_their_chains_go(tmp_path):
    # Dense steps saved with deltas; only every fourth version and the last are kept.
    # Their chunks' delta chains run through the pruned versions: gc codes them again.
    def history(loc):
        s = th.Store()
        w = np.sin(np.arange(200_000, dtype=np.float32) * 0.01)
        s.insert("w", w)
        kept = {}
        s.save_as(loc)
        for i in range(12):
            v = s.commit(f"step {i}")
            if i % 4 == 1 or i == 11:
                s.tag(f"k{i}", v)
                kept[f"k{i}"] = w.copy()
            s.save()
            w = w * np.float32(1 - 3e-5 * (1 + i % 3))
            s.write("w", w)
        s.prune(keep_last=1, drop_unreachable=True)
        s.save()
        return s, kept

    def pack_bytes(loc):
        return sum(p.stat().st_size for p in (loc / "packs").rglob("*") if p.is_file())

    chains, unchain = tmp_path / "chains", tmp_path / "unchain"
    a, _ = history(chains)
    for _ in range(2):
        assert a.gc(grace=0, unchain=False).chunks_unchained == 0
    s, kept = history(unchain)
    dry = s.gc(grace=0, dry_run=True)
    first = s.gc(grace=0)
    # k1, k5, k9 and k11, each 4 chunks (w is 800 KB in chunks of 256 KiB)
    assert first.chunks_unchained == dry.chunks_unchained == 4 * 4, first
    s.gc(grace=0)
    assert pack_bytes(unchain) < 0.6 * pack_bytes(chains)
    r = th.Store.open(unchain)
    r.verify()
    for tag, want in kept.items():
        assert same(r.snapshot(tag)["w"], want), tag
    assert r.gc(grace=0).chunks_unchained == 0
    assert "chunks_unchained=0" in repr(r.gc(grace=0))


def test_gc_merges_the_index_files_of_many_saves_into_one(tmp_path):
    s = th.Store()
    w = np.zeros(1000, np.float32)
    s.insert("w", w)
    for i in range(10):
        w[i] = i + 1
        s.write("w", w)
        s.commit(f"v{i}")
        s.save_as(tmp_path) if i == 0 else s.save()
    assert len(list((tmp_path / "index").rglob("*.thidx"))) == 10
    st = s.gc()  # with its hour of grace: only the merge deletes anything
    assert st.indexes_merged == 10 and st.objects_deleted == 10, st
    assert len(list((tmp_path / "index").rglob("*.thidx"))) == 1
    r = th.Store.open(tmp_path)
    r.verify()
    assert same(r["w"], w) and len(r.log()) == 10


def test_gc_delete_within_sets_the_runs_deletion_deadline(tmp_path):
    s = th.Store()
    for i in range(3):
        s.insert("w", np.full(1000, float(i))) if i == 0 else s.write("w", np.full(1000, float(i)))
        s.commit(f"v{i}")
    s.save_as(tmp_path)
    s.prune(keep_last=1, drop_unreachable=True)
    s.save()
    assert s.gc(grace=0, delete_within=7.5).objects_deleted > 0
    entries = sorted((tmp_path / "gc" / "generations").glob("*.json"))
    assert entries, "a run that deleted objects announced them in a generation entry"
    entry = json.loads(entries[-1].read_text())
    assert entry["deadline_ns"] - entry["time_ns"] == 7_500_000_000
    assert same(th.Store.open(tmp_path)["w"], np.full(1000, 2.0))


@pytest.mark.parametrize("kw", [{"grace": -1.0}, {"grace": float("nan")}, {"repack_below": 1.5},
                                {"delete_within": 0.0}, {"delete_within": -2.0},
                                {"delete_within": float("inf")}])
def test_gc_with_bad_options_raises_invalid_argument(tmp_path, kw):
    s = th.Store()
    s.insert("w", np.arange(3))
    s.commit("a")
    s.save_as(tmp_path)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(th.InvalidArgument):
        s.gc(**kw)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files


def test_a_short_prefix_matching_several_versions_is_ambiguous(tmp_path):
    s = th.Store()
    s.insert("w", np.zeros(1))
    for i in range(1500):
        s.write("w", np.full(1, float(i)))
        s.commit(f"{i}")
    s.save_as(tmp_path)
    by_prefix: dict[str, list] = {}
    for v in s.versions():
        by_prefix.setdefault(s.version_hash(v)[:4], []).append(v)
    # all-digit text names a version id first (`1103` is v1103): use prefixes with a letter
    by_prefix = {p: vs for p, vs in by_prefix.items() if not p.isdigit()}
    clash = next(p for p, vs in by_prefix.items() if len(vs) > 1)
    with pytest.raises(th.AmbiguousRef) as e:
        s.resolve(clash)
    assert isinstance(e.value, KeyError) and e.value.prefix == clash and e.value.matches >= 2
    unique = next(p for p, vs in by_prefix.items() if len(vs) == 1)
    assert s.resolve(unique) == by_prefix[unique][0]


def test_safetensors_export_then_import_round_trips(tmp_path):
    rng = np.random.default_rng(3)
    s = th.Store()
    arrays = {f"x{i}": random_array(rng, dt, (3, 5)) for i, dt in enumerate(DTYPES)}
    for k, a in arrays.items():
        s.insert(k, a)
    s.commit("a")
    s.export_safetensors(tmp_path / "m.safetensors")
    t = th.Store()
    assert t.import_safetensors(tmp_path / "m.safetensors") == sorted(arrays)
    for k, a in arrays.items():
        assert same(t[k], a)


def test_saving_from_one_thread_while_another_commits_loses_nothing(tmp_path):
    import threading

    s = th.Store(chunk_bytes=512)
    s.insert("w", np.zeros(1024, np.float32))
    s.commit("base")
    s.save_as(tmp_path)
    errors: list = []
    done = threading.Event()

    def writer():
        try:
            for i in range(60):
                w = s.get("w")
                w[(i * 37) % 1024] = i + 1
                s.write("w", w)
                s.commit(f"step {i}", step=i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    def saver():
        try:
            while not done.is_set():
                s.save()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=saver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []
    s.save()
    r = th.Store.open(tmp_path)
    assert len(r.log()) == 61 and r.log()[0].metadata == {"step": 59}
    assert same(r["w"], s["w"])
    r.verify()


def test_save_as_onto_another_history_raises_conflict_and_loses_none_of_it(tmp_path):
    a = th.Store()
    a.insert("w", np.zeros(4, np.float32))
    va = a.commit("run 1")
    a.tag("best", va)
    a.save_as(tmp_path)
    before = history(th.Store.open(tmp_path))

    b = th.Store()
    b.insert("w", np.ones(4, np.float32))
    b.commit("run 2")
    with pytest.raises(th.OtherHistory) as e:
        b.save_as(tmp_path)
    assert isinstance(e.value, th.BranchMoved)  # what code catching conflicts expects
    assert e.value.branch == "main" and e.value.theirs == a.version_hash(va)
    assert e.value.location == str(tmp_path)
    assert "holds another history" in str(e.value) and "track(..., path=" in str(e.value)
    assert b.location is None  # still bound where it was: nowhere
    assert_same_history(history(th.Store.open(tmp_path)), before)

    # Under another branch name both histories are kept; gc deletes neither.
    b.branch("run2")
    b.checkout("run2")
    b.delete_branch("main")
    b.save_as(tmp_path)
    assert b.location is not None
    c = th.Store.open(tmp_path)
    c.gc(grace=0)
    c = th.Store.open(tmp_path)
    c.verify()
    assert same(c.get("w", at="main"), np.zeros(4, np.float32))
    assert same(c.get("w", at="best"), np.zeros(4, np.float32))
    assert same(c.get("w", at="run2"), np.ones(4, np.float32))
    assert c.version_hash("main") == a.version_hash(va)


def repository_with_head_damaged(path: Path):
    """Two saves of `w` (v0, then v1); the packs of the second save, which hold v1's
    manifest, get one byte flipped: v1 no longer reads."""
    s = th.Store()
    s.insert("w", np.zeros(64, np.float32))
    v0 = s.commit("zeros")
    s.save_as(path)
    before = {p for p in path.rglob("*.thpack")}
    s.write("w", np.ones(64, np.float32))
    v1 = s.commit("ones")
    s.save()
    for pack in set(path.rglob("*.thpack")) - before:
        b = bytearray(pack.read_bytes())
        b[len(b) // 2] ^= 0x01
        pack.write_bytes(bytes(b))
    return s.version_hash(v0), s.version_hash(v1)


def test_an_open_that_falls_back_to_an_older_version_warns_and_says_where(tmp_path):
    h0, _ = repository_with_head_damaged(tmp_path / "r")
    with pytest.warns(th.OpenFallbackWarning, match="branch `main`.*does not read"):
        s = th.Store.open(tmp_path / "r")
    f = s.open_fallback
    assert f is not None and f.branch == "main"
    assert s.resolve("main") == f.wanted and s.version_hash(f.opened_at) == h0
    assert s.head() == f.opened_at and s.current_branch() is None  # detached there
    assert same(s.get("w"), np.zeros(64, np.float32))
    with pytest.raises(th.CorruptObject):
        s.get("w", at="main")
    # A repository that reads opens without a fallback and without a warning.
    ok = tmp_path / "ok"
    t = th.Store()
    t.insert("w", np.zeros(4, np.float32))
    t.commit("c")
    t.save_as(ok)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert th.Store.open(ok).open_fallback is None
