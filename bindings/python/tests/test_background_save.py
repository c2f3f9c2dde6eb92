"""Background saves from Python: ``Store.save(background=True)`` returns a ``PendingSave``
at once, the store stays usable while it runs, errors reach ``wait()`` or the next call,
and ``close()`` and the ``with`` form wait for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensor_history as th


def saved_store(path) -> th.Store:
    s = th.Store(chunk_bytes=4096)
    s.insert("w", np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024))
    s.insert("b", np.ones(7, np.int16))
    s.commit("init")
    s.save_as(path)
    return s


def dense_step(s: th.Store, k: int):
    s.write("w", s.get("w") * 0.5 + k)
    return s.commit(f"dense {k}")


def test_background_save_returns_a_pending_save_and_writes_what_it_captured(tmp_path):
    s = saved_store(tmp_path / "r")
    captured = [dense_step(s, k) for k in range(3)]
    hashes = [s.version_hash(v) for v in captured]
    p = s.save(background=True)
    assert isinstance(p, th.PendingSave)
    # the store stays usable: a commit and a restore while the save runs
    dense_step(s, 9)
    s.restore(captured[0])
    stats = p.wait()
    assert isinstance(stats, th.SaveStats) and stats.versions_written == 3
    assert p.done()
    assert p.wait().versions_written == 3  # the same outcome again
    r = th.Store.open(tmp_path / "r")
    # the repository's HEAD is the captured one, not the restore made meanwhile
    assert [r.version_hash(e.id) for e in r.log()][:3] == hashes[::-1]
    np.testing.assert_array_equal(r.get("w"), s.snapshot(captured[2])["w"])
    s.close()


def test_an_error_nobody_waited_for_is_raised_by_the_next_save(tmp_path):
    s = saved_store(tmp_path / "r")
    other = th.Store.open(tmp_path / "r")
    other.write("b", np.full(7, 3, np.int16))
    other.commit("theirs")
    other.save()
    dense_step(s, 1)
    del_me = s.save(background=True)
    del del_me  # nobody waits
    with pytest.raises(th.BranchMoved):
        s.save()
    # reported once: the next save raises only what it finds itself
    with pytest.raises(th.BranchMoved):
        s.save()
    stats = s.refresh()
    assert stats.diverged == ["main"]


def test_close_and_the_with_block_wait_and_raise_an_unseen_error(tmp_path):
    s = saved_store(tmp_path / "r")
    other = th.Store.open(tmp_path / "r")
    other.write("b", np.full(7, 3, np.int16))
    other.commit("theirs")
    other.save()
    dense_step(s, 1)
    s.save(background=True)
    with pytest.raises(th.BranchMoved):
        s.close()
    assert s.closed
    with pytest.raises(th.BranchMoved):
        with th.Store.open(tmp_path / "r") as r:
            r.write("b", np.full(7, 4, np.int16))
            r.commit("mine")
            r.save()  # lands
            other.write("b", np.full(7, 5, np.int16))
            other.commit("theirs again")
            other.save()
            r.write("b", np.full(7, 6, np.int16))
            r.commit("mine again")
            r.save(background=True)  # conflicts; raised when the block ends
    assert r.closed


def test_a_store_closed_with_a_save_in_flight_reopens_with_every_version_it_captured(tmp_path):
    s = saved_store(tmp_path / "r")
    for k in range(3):
        dense_step(s, k)
    want = s.version_hash(s.head())
    s.save(background=True)
    dense_step(s, 9)  # after the capture: not saved
    s.close()
    r = th.Store.open(tmp_path / "r")
    assert r.version_hash(r.head()) == want
    assert len(r.log()) == 4


CHILD = textwrap.dedent("""
    import sys, numpy as np, tensor_history as th
    r = th.Store.open(sys.argv[1])
    np.save(sys.argv[2], r.get("w"))
    print(r.version_hash(r.head()))
""")


def test_background_saves_every_step_reopen_in_another_process_bit_for_bit(tmp_path):
    s = saved_store(tmp_path / "r")
    pending = None
    for k in range(5):
        dense_step(s, k)
        pending = s.save(background=True)
    pending.wait()
    out = tmp_path / "w.npy"
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "r"), str(out)],
                         capture_output=True, text=True, check=True)
    assert res.stdout.strip() == s.version_hash(s.head())
    np.testing.assert_array_equal(np.load(out), s.get("w"))


def test_background_save_without_a_repository_raises_invalid_argument():
    s = th.Store()
    s.insert("w", np.zeros(3, np.float32))
    s.commit("c")
    with pytest.raises(th.InvalidArgument):
        s.save(background=True)
