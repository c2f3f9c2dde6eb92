"""Behaviour of tensor_history.Store from Python: arrays in and out, in-place restores,
refs, history calls and errors."""

from __future__ import annotations

import os
import gc
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import tensor_history as th
from conftest import DTYPES, LAYOUTS, OUT_LAYOUTS, random_array, same, with_layout


def fresh(chunk_bytes: int = 64) -> th.Store:
    return th.Store(chunk_bytes=chunk_bytes)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(), (0,), (17,), (6, 5), (2, 0, 3), (4, 3, 5)])
def test_every_dtype_and_layout_round_trips(dtype, layout, shape):
    rng = np.random.default_rng(1)
    a = random_array(rng, dtype, shape)
    s = fresh()
    s.insert("x", with_layout(a, layout))
    assert same(s.get("x"), a)
    b = random_array(rng, dtype, shape)
    s.write("x", with_layout(b, layout))
    assert same(s.get("x"), b)
    v = s.commit()
    assert same(s.get("x", at=v), b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", OUT_LAYOUTS)
def test_restore_into_writes_every_layout_in_place(dtype, layout):
    rng = np.random.default_rng(2)
    a, b = random_array(rng, dtype, (8, 6)), random_array(rng, dtype, (8, 6))
    s = fresh()
    s.insert("x", a)
    v0 = s.commit()
    s.write("x", b)
    s.commit()
    out = with_layout(b, layout)
    ident = id(out)
    s.restore(v0, into={"x": out})
    assert id(out) == ident and same(out, a)


def test_arrays_going_out_are_copies():
    s = fresh()
    a = np.arange(10, dtype=np.float32)
    s.insert("x", a)
    a[0] = 99
    got = s.get("x")
    assert got[0] == 0
    got[1] = 42
    assert s.get("x")[1] == 1
    v = s.commit()
    snap = s.snapshot(v)
    snap["x"][2] = 7
    assert snap["x"][2] == 2


def test_write_copies_only_changed_chunks():
    s = fresh(chunk_bytes=64)  # 16 float32 per chunk
    a = np.zeros(160, dtype=np.float32)
    s.insert("x", a)
    s.commit()
    a[20] = 1.0
    st = s.write("x", a)
    assert (st.chunks_changed, st.chunks_total, st.bytes_copied) == (1, 10, 64)
    assert s.write("x", a).chunks_changed == 0  # unchanged since


def test_write_into_compares_and_writes_only_differing_chunks():
    s = fresh(chunk_bytes=64)
    a = np.arange(160, dtype=np.float32)
    s.insert("x", a)
    v0 = s.commit()
    out = a.copy()
    out[[5, 100]] = -1
    stats = s.write_into({"x": out}, at=v0)
    assert stats["x"].chunks_changed == 2 and stats["x"].bytes_copied == 128
    assert same(out, a)


def test_known_skips_shared_chunks_without_reading_them():
    s = fresh(chunk_bytes=64)
    a = np.arange(160, dtype=np.float32)
    s.insert("x", a)
    v0 = s.commit()
    b = a.copy()
    b[3] = -5  # chunk 0 changes between v0 and v1
    s.write("x", b)
    v1 = s.commit()
    out = b.copy()
    out[150] = 1234.0  # the caller broke its promise in a chunk v0 and v1 share
    stats = s.restore(v0, into={"x": out}, known=v1)
    assert stats == v0
    assert out[3] == 3  # the differing chunk was written
    assert out[150] == 1234.0  # the shared one was trusted, not read


def test_bfloat16_through_ml_dtypes_and_uint16_tag():
    s = fresh()
    a = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    s.insert("a", a)
    s.insert("b", a.view(np.uint16), dtype="bfloat16")
    assert s.info("b") == ("bf16", [3])
    assert same(s.get("b"), a)
    s.commit()
    out = np.zeros(3, dtype=np.uint16)
    s.write_into({"b": out.view(ml_dtypes.bfloat16)})
    assert same(out.view(ml_dtypes.bfloat16), a)
    with pytest.raises(th.InvalidArgument):
        s.insert("c", np.zeros(3, np.float32), dtype="bfloat16")


def test_big_endian_input_is_converted():
    s = fresh()
    a = np.arange(5, dtype=">f4")
    s.insert("x", a)
    assert s.info("x") == ("f32", [5])
    assert s.get("x").tolist() == [0, 1, 2, 3, 4]


def test_broadcast_inputs_are_copied():
    s = fresh()
    s.insert("x", np.broadcast_to(np.float32(2), (4, 3)))
    assert s.get("x").tolist() == [[2.0] * 3] * 4


def test_lists_and_scalars_are_accepted_as_arrays():
    s = fresh()
    s.insert("l", [1.0, 2.0])
    s.insert("i", 3)
    assert s.get("l").tolist() == [1.0, 2.0] and s.get("i").shape == ()


def test_unsupported_dtypes_raise_type_errors_and_change_nothing():
    s = fresh()
    for bad in (np.zeros(3, bool), np.zeros(3, np.complex64), np.array(["a"])):
        with pytest.raises(th.UnsupportedDType) as e:
            s.insert("x", bad)
        assert isinstance(e.value, TypeError) and e.value.operation == "store"
    assert s.names() == []


def test_outputs_that_cannot_be_written_in_place_are_rejected():
    s = fresh()
    s.insert("x", np.arange(8, dtype=np.float32))
    v = s.commit()
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    buf = np.zeros(33, np.uint8)
    misaligned = buf[1:].view(np.float32)
    repeated = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (8,), (0,))
    for bad in (ro, misaligned, np.zeros(8, ">f4"), [0.0] * 8, repeated):
        with pytest.raises(th.InvalidArgument):
            s.restore(v, into={"x": bad})
    same_arr = np.zeros(8, np.float32)
    s.insert("y", np.arange(8, dtype=np.float32))
    v2 = s.commit()
    with pytest.raises(th.InvalidArgument):
        s.restore(v2, into={"x": same_arr, "y": same_arr})
    assert s.head() == v2 and not same_arr.any()


def test_failed_restore_into_changes_nothing():
    s = fresh()
    s.insert("x", np.arange(8, dtype=np.float32))
    v0 = s.commit()
    s.write("x", np.ones(8, np.float32))
    v1 = s.commit()
    good = np.zeros(8, np.float32)
    for into, exc in (
        ({"x": good, "nope": np.zeros(1)}, th.UnknownVariable),
        ({"x": np.zeros(9, np.float32)}, th.ShapeMismatch),
        ({"x": np.zeros(8, np.float64)}, th.DTypeMismatch),
    ):
        with pytest.raises(exc):
            s.restore(v0, into=into)
        assert s.head() == v1 and not good.any()
        assert same(s.get("x"), np.ones(8, np.float32))


def test_failed_redo_into_rolls_back():
    s = fresh()
    s.insert("x", np.zeros(4, np.float32))
    s.commit()
    s.remove("x")
    s.insert("x", np.zeros(5, np.float32))
    v1 = s.commit()
    v0 = s.undo()
    with pytest.raises(th.ShapeMismatch):
        s.redo(into={"x": np.zeros(4, np.float32)})
    assert s.head() == v0
    out = np.ones(5, np.float32)
    assert s.redo(into={"x": out}) == v1 and not out.any()


def test_error_classes_subclass_the_fitting_builtins_and_carry_fields():
    s = fresh()
    s.insert("x", np.zeros((2, 3), np.float32))
    with pytest.raises(KeyError) as e:
        s.get("y")
    assert isinstance(e.value, th.UnknownVariable) and e.value.name == "y"
    assert str(e.value) == "unknown variable `y`"
    with pytest.raises(ValueError) as e:
        s.write("x", np.zeros((3, 2), np.float32))
    assert e.value.expected == (2, 3) and e.value.found == (3, 2)
    with pytest.raises(TypeError) as e:
        s.write("x", np.zeros((2, 3), np.int32))
    assert (e.value.expected, e.value.found) == ("f32", "i32")
    with pytest.raises(th.NoCommits):
        s.tag("t")
    v = s.commit()
    with pytest.raises(th.UnknownVersion) as e:
        s.restore(th.Version(99))
    assert e.value.id == th.Version(99)
    with pytest.raises(th.UnknownRef):
        s.checkout("nope")
    s.tag("t", v)
    with pytest.raises(th.WrongRefKind):
        s.checkout("t")
    with pytest.raises(th.InvalidRefName):
        s.branch("has space")
    with pytest.raises(th.NothingToUndo):
        s.undo()
    with pytest.raises(th.InvalidConfig):
        th.Store(chunk_bytes=0)
    with pytest.raises(TypeError):
        s.restore(3.5)
    assert all(issubclass(c, th.TensorHistoryError) for c in (th.UnknownRef, th.MergeConflict))


def test_refs_resolve_by_name_version_and_text():
    s = fresh()
    s.insert("x", np.zeros(3))
    v0 = s.commit("init")
    s.branch("exp")
    s.tag("best", v0)
    assert s.resolve("HEAD") == s.resolve("main") == s.resolve("best") == s.resolve("v0") == v0
    assert s.resolve(v0) == v0 and str(v0) == "v0" and int(v0) == 0 and v0 == th.Version(0)
    assert {n: (k, v) for n, k, v in s.refs()} == {
        "best": ("tag", v0), "exp": ("branch", v0), "main": ("branch", v0)}
    assert s.checkout("exp") == v0 and s.current_branch() == "exp"
    s.write("x", np.ones(3))
    v1 = s.commit("on exp")
    assert s.resolve("exp") == v1 and s.resolve("main") == v0
    s.detach()
    assert s.current_branch() is None
    s.delete_tag("best")
    s.checkout("main")
    s.delete_branch("exp")
    assert s.refs() == [("main", "branch", v0)]


def test_log_graph_dot_and_metadata():
    s = fresh()
    s.insert("x", np.zeros(3))
    v0 = s.commit("init", step=0)
    s.write("x", np.ones(3))
    v1 = s.commit("step", step=1, loss=0.5, note="ok", done=True)
    log = s.log()
    assert [e.id for e in log] == [v1, v0]
    assert log[0].message == "step" and log[0].parents == [v0] and log[1].parents == []
    assert log[0].metadata == {"step": 1, "loss": 0.5, "note": "ok", "done": True}
    assert log[0].time >= log[1].time > 1.6e9
    assert "step" in s.graph() and "init" in s.graph()
    assert s.to_dot().startswith("digraph")
    for bad in ({"obj": [1, 2]}, {"none": None}, {"big": 2**70}):
        with pytest.raises(th.InvalidArgument):
            s.commit("bad", **bad)
        assert s.head() == v1
    assert "loss=0.5" in s.graph()


def test_diff_merge_and_average():
    s = fresh(chunk_bytes=32)
    s.insert("w", np.zeros(16, np.float32))  # 2 chunks
    base = s.commit("base")
    s.branch("other")
    w = np.zeros(16, np.float32)
    w[0] = 2
    s.write("w", w)
    ours = s.commit("ours")
    s.checkout("other")
    w2 = np.zeros(16, np.float32)
    w2[0] = 4
    w2[15] = 1
    s.write("w", w2)
    theirs = s.commit("theirs")
    d = s.diff(base, theirs)
    assert d["w"].kind == "changed" and d["w"].chunks == [0, 1] and d["w"].bytes == 64
    s.checkout("main")
    with pytest.raises(th.MergeConflict) as e:
        s.merge("other")
    assert e.value.conflicts == [("w", [0])]
    assert s.head() == ours
    m = s.merge("other", strategy="mean")
    assert s.parents(m) == [ours, theirs]
    got = s.get("w")
    assert got[0] == 3 and got[15] == 1
    with pytest.raises(th.InvalidArgument):
        s.merge("other", strategy="nope")
    avg = s.average([ours, theirs], weights=[1.0, 3.0])
    assert s.get("w")[0] == pytest.approx(3.5)
    assert s.head() == avg
    s.write("w", np.zeros(16, np.float32))
    assert s.diff()["w"].kind == "changed"
    assert s.diff(base)["w"].kind == "unchanged"


def test_prune_stats_and_verify():
    s = fresh(chunk_bytes=64)
    a = np.zeros(1600, np.float32)  # 100 chunks
    s.insert("x", a)
    for i in range(20):
        a[i * 16] = i + 1
        s.write("x", a)
        s.commit(f"c{i}", i=i)
    st = s.stats()
    assert st.versions == 20 and st.logical_bytes == 20 * a.nbytes
    assert st.unique_bytes < 2 * a.nbytes and st.sharing_ratio > 10
    p = s.prune(keep_last=5)
    assert p.kept == 5 and len(p.dropped) == 15 and p.bytes_after <= p.bytes_before
    with pytest.raises(th.PrunedVersion):
        s.restore(p.dropped[0])
    s.verify()
    assert len(s.log()) == 5


def test_auto_retention_keeps_max_versions():
    s = th.Store(max_versions=3)
    s.insert("x", np.zeros(2))
    for i in range(6):
        s.commit(str(i), i=i)
    assert len(s.versions()) == 3 and s.max_versions == 3


def test_snapshot_is_a_read_only_mapping_that_outlives_the_store():
    s = fresh()
    s.insert("a", np.arange(3))
    s.insert("b", np.ones(2))
    v = s.commit("m")
    snap = s.snapshot(v)
    del s
    assert sorted(snap) == ["a", "b"] and len(snap) == 2 and "a" in snap
    assert snap.id == v and snap.message == "m" and snap.time > 0
    assert snap["a"].tolist() == [0, 1, 2] and snap.get("zz") is None
    assert len(snap.content_hash()) == 64 and snap.nbytes == 3 * 8 + 2 * 8


def test_sync_is_all_or_nothing():
    s = fresh()
    s.insert("a", np.zeros(3, np.float32))
    s.commit()
    with pytest.raises(th.ShapeMismatch):
        s.sync({"new": np.ones(2), "a": np.ones(4, np.float32)})
    assert s.names() == ["a"] and not s.get("a").any() and not s.is_dirty()
    st = s.sync({"a": np.ones(3, np.float32), "new": np.ones(2)})
    assert st["a"].chunks_changed == 1 and st["new"].bytes_copied == 16


def test_one_store_from_many_threads():
    s = th.Store(chunk_bytes=4096)
    n_threads, steps = 6, 40
    for t in range(n_threads):
        s.insert(f"t{t}", np.zeros(10_000, np.float32))
    s.commit("init")
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            rng = np.random.default_rng(t)
            a = np.zeros(10_000, np.float32)
            for i in range(steps):
                a[rng.integers(0, 10_000)] = i
                s.write(f"t{t}", a)
                if i % 5 == 0:
                    s.commit(f"t{t}-{i}")
                assert same(s.get(f"t{t}"), a)
                s.stats()
                s.log()
                out = np.empty(10_000, np.float32)
                s.write_into({f"t{t}": out})
                assert same(out, a)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th_ in threads:
        th_.start()
    for th_ in threads:
        th_.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert not errors, errors
    assert len(s.versions()) == 1 + n_threads * (steps // 5)
    s.verify()


def test_the_gil_is_released_during_heavy_calls():
    s = th.Store()
    big = np.zeros(32 << 20, np.uint8)
    s.insert("x", big)
    s.commit()
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for i in range(20):
            big[i * 1000] = i + 1
            s.write("x", big)
            s.verify()
    finally:
        stop.set()
        t.join()
    assert len(ticks) > 0


def test_context_manager_and_repr():
    with th.Store() as s:
        s.insert("x", np.zeros(1))
        assert "1 variables" in repr(s)


def test_safetensors_export_and_import(tmp_path):
    s = fresh()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    s.insert("a", a)
    s.insert("b", b)
    v = s.commit()
    path = tmp_path / "m.safetensors"
    s.export_safetensors(path, v)
    t = fresh()
    assert t.import_safetensors(str(path)) == ["a", "b"]
    assert same(t.get("a"), a) and same(t.get("b"), b)
    with pytest.raises(th.VariableExists):
        t.import_safetensors(path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(th.InvalidSafeTensors):
        t.import_safetensors(bad)
    with pytest.raises(OSError):
        t.import_safetensors(tmp_path / "missing.safetensors")
    assert t.names() == ["a", "b"]


def test_a_memory_budget_keeps_old_versions_encoded_and_reads_them_back():
    # Every version is tagged: the budget encodes them and lets none go.
    s = th.Store(chunk_bytes=16384, memory_budget=0)
    assert s.memory_budget == 0
    w = (np.sin(np.arange(65536, dtype=np.float32) * 0.37) * 0.05).astype(np.float32)
    s.insert("w", w)
    copies = [(s.commit("init"), w.copy())]
    s.tag("t0", copies[0][0])
    for i in range(8):
        w = (w * np.float32(1 - 1e-4) + np.float32(1e-6) * i).astype(np.float32)
        s.write("w", w)
        copies.append((s.commit(f"step {i}"), w.copy()))
        s.tag(f"t{i + 1}", copies[-1][0])
    held = s.enforce_memory_budget()
    st = s.stats()
    assert held == st.held_bytes
    # Dense steps: deltas hold well under the raw bytes.
    assert st.encoded_bytes > 0 and st.encoded_held_bytes * 4 < st.encoded_bytes * 3
    assert st.held_bytes * 4 < st.logical_bytes * 3
    for v, want in copies:
        assert same(s.get("w", at=v), want)
    s.verify()
    assert th.Store().memory_budget is None


def test_a_memory_budget_bounds_what_the_history_holds_and_lets_the_oldest_versions_go():
    model = 65536 * 4
    budget = 3 * model
    s = th.Store(chunk_bytes=16384, memory_budget=budget)
    w = (np.sin(np.arange(65536, dtype=np.float32) * 0.37) * 0.05).astype(np.float32)
    s.insert("w", w)
    copies = [(s.commit("init"), w.copy())]
    s.tag("start", copies[0][0])
    for i in range(30):
        w = (w * np.float32(1 - 1e-3) + np.float32(1e-4) * i).astype(np.float32)
        s.write("w", w)
        copies.append((s.commit(f"step {i}"), w.copy()))
        assert s.stats().held_bytes <= budget + model
    live = set(s.versions())
    gone = [v for v, _ in copies if v not in live]
    assert gone and copies[0][0] in live  # the tagged version stays
    assert gone == sorted(gone) and max(gone) < min(v for v, _ in copies[1:] if v in live)
    for v in gone:
        with pytest.raises(th.PrunedVersion):
            s.get("w", at=v)
    for v, want in copies:
        if v in live:
            assert same(s.get("w", at=v), want)
    # The budget is settable; None turns it off.
    s.memory_budget = None
    assert s.memory_budget is None
    s.verify()


def test_commit_later_copies_on_another_thread_and_commits_at_the_next_call():
    s = th.Store()
    a = np.arange(1 << 16, dtype=np.float32)
    s.insert("a", a)
    v0 = s.commit("init")
    a += 1
    b = np.ones((3, 5), np.int64)
    checked = []
    v1 = s.commit_later({"a": a, "b": b}, checked.append, "later", step=1)
    assert v1 != v0
    assert s.commit_pending()
    assert s.head() == v1  # settled: the copy ended, the check ran, the commit made
    assert checked == [True] and not s.commit_pending()
    assert s.metadata(v1) == {"step": 1} and s.log()[0].message == "later"
    a += 1  # after the commit: the version keeps what was copied
    assert same(s.get("a", at=v1), a - 1)
    assert same(s.get("b", at=v1), b)
    s.verify()


def test_a_check_that_raises_gives_the_commit_up_and_puts_the_variables_back():
    s = th.Store()
    s.insert("a", np.zeros(100, np.float32))
    s.insert("mine", np.full(4, 7.0))
    v0 = s.commit("init")
    s.write("mine", np.full(4, 8.0))  # an uncommitted change the failed commit keeps

    def check(copied):
        assert copied
        raise ValueError("written while copied")

    s.commit_later({"a": np.ones(100, np.float32), "new": np.ones(3)}, check, "lost")
    with pytest.raises(ValueError, match="written while copied"):
        s.names()
    assert s.head() == v0 and len(s.log()) == 1
    assert sorted(s.names()) == ["a", "mine"]
    assert same(s.get("a"), np.zeros(100, np.float32))
    assert same(s.get("mine"), np.full(4, 8.0))
    s.verify()


def test_commit_later_reads_the_arrays_only_after_ready_returned():
    s = th.Store()
    a = np.zeros(1 << 12, np.float32)
    s.insert("a", a)
    s.commit("init")
    staging = np.zeros(1 << 12, np.float32)  # filled by "the device" only later
    go = threading.Event()
    order = []

    def ready():
        order.append("ready")
        assert go.wait(10)
        staging[:] = 5  # the bytes land just before ready returns
        order.append("landed")

    v1 = s.commit_later({"a": staging}, lambda ok: order.append(("check", ok)), "later",
                        ready, step=3, ready=True)  # a keyword is metadata, whatever its name
    time.sleep(0.05)
    assert order == ["ready"]  # the caller went on while ready waited
    go.set()
    assert s.head() == v1
    assert order == ["ready", "landed", ("check", True)]
    assert same(s.get("a"), np.full(1 << 12, 5, np.float32))  # what ready put there
    assert s.metadata(v1) == {"step": 3, "ready": True}
    s.verify()


def test_a_ready_that_raises_makes_no_copy_and_its_exception_is_raised_once():
    s = th.Store()
    s.insert("a", np.zeros(16, np.float32))
    v0 = s.commit("init")
    told = []

    def ready():
        raise KeyError("the device copy failed")

    s.commit_later({"a": np.ones(16, np.float32)}, told.append, "lost", ready)
    with pytest.raises(KeyError, match="the device copy failed"):
        s.settle()
    assert told == [False]
    assert s.head() == v0 and len(s.log()) == 1 and not s.commit_pending()
    assert same(s.get("a"), np.zeros(16, np.float32))
    s.verify()


def test_a_store_dropped_while_ready_waits_does_not_hang():
    s = th.Store()
    s.insert("a", np.zeros(16, np.float32))
    s.commit("init")
    release = threading.Event()
    s.commit_later({"a": np.ones(16, np.float32)}, lambda ok: None, "later",
                   lambda: release.wait(0.2))
    t0 = time.monotonic()
    del s  # waits for the copy thread, which needs the GIL to call ready
    gc.collect()
    assert time.monotonic() - t0 < 10


def test_commit_later_refuses_what_it_cannot_read_later_and_its_check_cannot_call_the_store():
    s = th.Store()
    s.insert("a", np.zeros((4, 4), np.float32))
    v0 = s.commit("init")
    with pytest.raises(th.InvalidArgument):
        s.commit_later({"a": np.ones((4, 4), np.float32).T[::2]}, lambda ok: None)
    assert not s.commit_pending()
    s.commit_later({"a": np.ones((4, 4), np.float32)}, lambda ok: s.head())
    with pytest.raises(th.InvalidArgument, match="must not"):
        s.settle()
    assert s.head() == v0
    s.commit_later({"a": np.ones((4, 4), np.float32)}, lambda ok: None)
    s.close()  # settles first: the version is made, then the store closes
    with pytest.raises(th.StoreClosed):
        s.head()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_with_a_commit_later_in_flight_is_told_and_the_parent_commits():
    s = th.Store()
    a = np.zeros(1 << 20, np.float32)
    s.insert("a", a)
    v0 = s.commit("init")
    v1 = s.commit_later({"a": a + 1}, lambda ok: None, "later")
    pid = os.fork()
    if pid == 0:  # the child: its next call on the store raises, it does not hang
        try:
            s.head()
        except th.InvalidArgument:
            os._exit(0)
        except BaseException:  # noqa: BLE001 - any other outcome fails the test
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert s.head() == v1 and s.parent(v1) == v0
    assert same(s.get("a"), np.ones(1 << 20, np.float32))


def test_a_copy_that_fails_changes_nothing_and_raises_after_telling_the_check():
    s = th.Store()
    s.insert("a", np.zeros(8, np.float32))
    v0 = s.commit("init")
    told = []
    # "a" is held with 8 elements: the copy of 9 fails on the other thread
    s.commit_later({"b": np.ones(3), "a": np.ones(9, np.float32)}, told.append, "bad")
    with pytest.raises(th.ShapeMismatch):
        s.settle()
    assert told == [False]
    assert s.head() == v0 and s.names() == ["a"]
    assert same(s.get("a"), np.zeros(8, np.float32))
