"""Store behaviour at the edges: forked processes, pickling, closing, argument forms,
metadata types, statistics and the printed history."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pytest

import tensor_history as th


def big_store() -> th.Store:
    """64 chunks of 64 KiB: verify and dense writes run in parallel."""
    s = th.Store(chunk_bytes=64 << 10)
    s.insert("w", np.arange(64 * (64 << 10) // 4, dtype=np.float32))
    s.commit("init")
    return s


def _child_work(s: th.Store) -> bool:
    s.verify()
    a = s.get("w")
    a += 1
    s.write("w", a)
    s.commit("in child")
    s.verify()
    return True


def _pool_work(i: int) -> int:
    s = big_store()
    s.verify()
    return i


def test_forked_child_finishes_parallel_work_after_the_parent_used_the_pool():
    s = big_store()
    s.verify()  # the parent's pool has run
    pid = os.fork()
    if pid == 0:  # the child: must not hang in its first parallel call
        code = 1
        try:
            code = 0 if _child_work(s) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in a parallel call")
        time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_multiprocessing_fork_pool_workers_do_parallel_work():
    big_store().verify()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        assert pool.map_async(_pool_work, range(4)).get(timeout=60) == [0, 1, 2, 3]


def _raise_unknown(_: int) -> None:
    s = th.Store()
    s.insert("w", np.zeros(2, np.float32))
    s.commit("one")
    s.restore(th.Version(7))


def test_version_and_errors_pickle_with_their_fields():
    v = th.Version(12)
    assert pickle.loads(pickle.dumps(v)) == v
    s = th.Store()
    s.insert("w", np.zeros(2, np.float32))
    s.commit("one")
    with pytest.raises(th.UnknownVersion) as e:
        s.restore(th.Version(7))
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is th.UnknownVersion and back.id == th.Version(7)
    assert str(back) == str(e.value)
    with pytest.raises(th.ShapeMismatch) as e:
        s.write("w", np.zeros(3, np.float32))
    back = pickle.loads(pickle.dumps(e.value))
    assert (back.name, back.expected, back.found) == ("w", (2,), (3,))
    # and across a process boundary
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        with pytest.raises(th.UnknownVersion) as e:
            pool.apply(_raise_unknown, (0,))
    assert e.value.id == th.Version(7)


def test_insert_of_an_unsupported_dtype_names_the_variable():
    s = th.Store()
    with pytest.raises(th.UnsupportedDType) as e:
        s.insert("mask", np.array([True, False]))
    assert e.value.name == "mask" and "mask" in str(e.value) and "uint8" in str(e.value)
    s.insert("w", np.zeros(2, np.float32))
    with pytest.raises(th.UnsupportedDType) as e:
        s.sync({"flags": np.array([True])})
    assert e.value.name == "flags"
    assert s.names() == ["w"]


def test_a_closed_store_raises_store_closed(tmp_path):
    s = th.Store()
    s.insert("w", np.zeros(2, np.float32))
    s.commit("one")
    s.save_as(tmp_path / "r")
    with th.Store.open(tmp_path / "r") as r:
        assert r.names() == ["w"] and not r.closed
    assert r.closed and repr(r) == "Store(closed)"
    for call in (r.names, r.head, r.save, r.stats, lambda: r.get("w"),
                 lambda: r.commit("x"), lambda: len(r), lambda: "w" in r):
        with pytest.raises(th.StoreClosed):
            call()
    r.close()  # twice is fine
    # an exception inside the block propagates, and the store is closed
    with pytest.raises(KeyError):
        with th.Store.open(tmp_path / "r") as r2:
            r2.get("nope")
    assert r2.closed
    # the repository is intact
    assert th.Store.open(tmp_path / "r").get("w").tolist() == [0.0, 0.0]


def test_into_takes_a_list_of_pairs_and_rejects_other_things_clearly():
    s = th.Store()
    s.insert("w", np.zeros(3, np.float32))
    v0 = s.commit("zeros")
    s.write("w", np.ones(3, np.float32))
    s.commit("ones")
    a = np.full(3, 5, np.float32)
    s.restore(v0, into=[("w", a)])
    assert a.tolist() == [0, 0, 0]
    s.sync([("w", np.full(3, 2, np.float32))])
    assert s.get("w").tolist() == [2, 2, 2]
    for bad in (a, "w", 3, [("w",)], [1, 2]):
        with pytest.raises(TypeError, match="mapping"):
            s.restore(v0, into=bad)
    assert s.get("w").tolist() == [2, 2, 2]


def test_numpy_scalars_in_metadata_keep_their_type():
    s = th.Store()
    s.insert("w", np.zeros(1, np.float32))
    v = s.commit("m", step=np.int64(3), ok=np.bool_(True), small=np.uint8(7),
                 loss=np.float32(0.5), no=np.bool_(False))
    m = s.metadata(v)
    assert m == {"step": 3, "ok": True, "small": 7, "loss": 0.5, "no": False}
    assert type(m["step"]) is int and type(m["ok"]) is bool and type(m["no"]) is bool
    assert type(m["loss"]) is float
    with pytest.raises(th.InvalidArgument):
        s.commit("big", n=np.uint64(2**64 - 1))


def test_sharing_ratio_is_one_after_the_first_commit():
    s = th.Store()
    a = np.zeros(1000, np.float32)
    s.insert("w", a)
    s.commit("one")
    st = s.stats()
    assert st.logical_bytes == a.nbytes and st.sharing_ratio == 1.0
    a[0] = 1
    s.write("w", a)  # uncommitted changes are a copy of their own
    assert s.stats().logical_bytes == 2 * a.nbytes


def test_graph_hides_underscore_metadata_and_shows_the_rest():
    s = th.Store()
    s.insert("w", np.zeros(1, np.float32))
    s.commit("step", loss=0.25, _internal='{"groups": [1, 2, 3]}')
    g = s.graph()
    assert "loss=0.25" in g and "_internal" not in g and "groups" not in g
    assert s.metadata("HEAD")["_internal"] == '{"groups": [1, 2, 3]}'
