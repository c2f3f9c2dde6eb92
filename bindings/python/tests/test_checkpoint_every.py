"""``tracker.checkpoint_every(n)``: a background save after every n-th kept step, at most
one in flight (a due one is deferred, never stacked), errors raised by the next kept step
before it commits, by ``save()`` or by ``close()``; with the fake torch of
``fake_torch.py``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fake_torch as ft
import tensor_history as th
from test_fake_torch import make, state, train_step


@pytest.fixture(autouse=True)
def fake_torch_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", ft)
    yield


class Gate:
    """A stand-in for a ``PendingSave`` whose end the test decides; it wraps the real
    one, which it waits for when it is let through."""

    def __init__(self, real) -> None:
        self.real, self.open = real, False

    def done(self) -> bool:
        return self.open and self.real.done()

    def wait(self):
        self.open = True
        return self.real.wait()


class Recording:
    """The tracker's store, with every background save recorded and gated."""

    def __init__(self, store) -> None:
        self._store = store
        self.started: list = []  # (HEAD at the call, Gate)

    def save(self, *, background: bool = False):
        if not background:
            return self._store.save()
        g = Gate(self._store.save(background=True))
        self.started.append((self._store.head(), g))
        return g

    def __getattr__(self, name):
        return getattr(self._store, name)

    def __contains__(self, name) -> bool:
        return name in self._store


def kept_step(tr, model, opt, rng):
    with tr.trial() as t:
        train_step(model, opt, rng)
        return t.keep()


CHILD = textwrap.dedent("""
    import sys, numpy as np, tensor_history as th
    r = th.Store.open(sys.argv[1])
    np.savez(sys.argv[2], **{n.replace("/", "|"): r.get(n) for n in r.names()})
    print(r.version_hash(r.head()))
""")


def test_a_loop_with_checkpoint_every_reopens_in_another_process_bit_for_bit(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    tr.checkpoint_every(2)
    rng = np.random.default_rng(1)
    for i in range(9):
        with tr.trial() as t:
            train_step(model, opt, rng, lr=0.01 * (i + 1))
            if i % 3 != 2:  # two of three kept: six kept steps, three checkpoints due
                t.keep()
    at_end = state(model, opt)
    head = tr.store.head()
    held = {n: tr.store.get(n) for n in tr.store.names()}
    want = tr.store.version_hash(head)
    tr.close()  # waits, and writes the last due checkpoint if it was deferred
    assert tr.store.closed
    out = tmp_path / "state.npz"
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "run"), str(out)],
                         capture_output=True, text=True, check=True)
    assert res.stdout.strip() == want
    there = np.load(out)
    assert sorted(k.replace("|", "/") for k in there.files) == sorted(held)
    for n, a in held.items():
        b = there[n.replace("/", "|")]
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), n
    # and a tracker on the repository resumes that state in place
    model2, opt2 = make(seed=7)
    th.torch.track(model2, opt2, path=tmp_path / "run")
    resumed = state(model2, opt2)
    assert resumed.keys() == at_end.keys()
    for k in at_end:
        if isinstance(at_end[k], np.ndarray):
            assert resumed[k].tobytes() == at_end[k].tobytes(), k


def test_a_due_checkpoint_is_deferred_while_one_is_in_flight_never_stacked(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(2)
    rng = np.random.default_rng(3)
    kept = [kept_step(tr, model, opt, rng) for _ in range(2)]
    assert [v for v, _ in rec.started] == [kept[1]]
    # due again after two more, but the first is still in flight: deferred
    kept += [kept_step(tr, model, opt, rng) for _ in range(3)]
    assert len(rec.started) == 1
    rec.started[0][1].wait()  # it ends; the next kept step starts the deferred one
    kept.append(kept_step(tr, model, opt, rng))
    assert [v for v, _ in rec.started] == [kept[1], kept[5]]
    # it covers the 6th kept step; the 7th is not due (the next due step is the 8th)
    kept.append(kept_step(tr, model, opt, rng))
    assert len(rec.started) == 2
    # a commit() counts as a kept step too
    train_step(model, opt, rng)
    v = tr.commit("plain commit")
    assert len(rec.started) == 2  # due, deferred: the second is still in flight
    want = tr.store.version_hash(v)
    tr.close()  # waits for the second and writes the deferred one
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want
    assert len(r.log()) == 1 + 7 + 1


def test_close_writes_a_due_checkpoint_that_was_deferred(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(1)
    rng = np.random.default_rng(4)
    kept_step(tr, model, opt, rng)
    last = kept_step(tr, model, opt, rng)  # due, deferred: the first is still gated
    assert len(rec.started) == 1
    want = tr.store.version_hash(last)
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want


def test_a_deferral_does_not_move_the_later_due_steps(tmp_path):
    # Due at the 3rd, 6th and 9th kept step. The first is in flight until after the
    # 6th, so the 7th starts the deferred one; the 9th is due all the same (deferred
    # while the second is in flight) and close() writes it: the repository ends at the
    # 9th kept step however slow the writer was.
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(3)
    rng = np.random.default_rng(5)
    kept = [kept_step(tr, model, opt, rng) for _ in range(6)]
    assert [v for v, _ in rec.started] == [kept[2]]
    rec.started[0][1].wait()
    kept += [kept_step(tr, model, opt, rng) for _ in range(3)]
    assert [v for v, _ in rec.started] == [kept[2], kept[6]]
    want = tr.store.version_hash(kept[8])
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want
    assert len(r.log()) == 1 + 9


def moved_by_another_store(path) -> None:
    other = th.Store.open(path)
    other.insert("mine", np.ones(3, np.float32))
    other.commit("theirs")
    other.save()


def test_an_error_of_a_background_checkpoint_is_raised_by_the_next_keep_before_it_commits(
        tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(1)
    rng = np.random.default_rng(5)
    moved_by_another_store(tmp_path / "run")
    kept_step(tr, model, opt, rng)  # its checkpoint meets the moved branch
    with pytest.raises(th.BranchMoved):
        rec.started[0][1].wait()  # (the test waits; the tracker has not seen it yet)
    before = state(model, opt)
    head, n_log = tr.store.head(), len(tr.store.log())
    with pytest.raises(th.BranchMoved):
        kept_step(tr, model, opt, rng)
    # nothing was committed, and the trial put the model back
    assert tr.store.head() == head and len(tr.store.log()) == n_log
    after = state(model, opt)
    for k in before:
        if isinstance(before[k], np.ndarray):
            assert after[k].tobytes() == before[k].tobytes(), k
    # reported once: the next kept step commits (and starts a checkpoint of its own)
    kept_step(tr, model, opt, rng)
    assert len(tr.store.log()) == n_log + 1
    # whose error close() raises, closing the store all the same
    with pytest.raises(th.BranchMoved):
        tr.close()
    assert tr.store.closed


def test_the_error_of_the_last_checkpoint_is_raised_by_close_or_save(tmp_path):
    for end in ("close", "save", "with"):
        path = tmp_path / end
        model, opt = make()
        tr = th.torch.track(model, opt, path=path)
        tr.checkpoint_every(1)
        moved_by_another_store(path)
        rng = np.random.default_rng(6)
        if end == "with":
            with pytest.raises(th.BranchMoved):
                with tr:
                    kept_step(tr, model, opt, rng)
            assert tr.store.closed
            continue
        kept_step(tr, model, opt, rng)
        with pytest.raises(th.BranchMoved):
            getattr(tr, end)()


def test_checkpoint_every_rejects_bad_counts_and_needs_a_repository(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(th.InvalidArgument):
            tr.checkpoint_every(bad, path=tmp_path / "never")
    assert not (tmp_path / "never").exists()
    with pytest.raises(th.InvalidArgument):
        tr.checkpoint_every(3)  # an in-memory store and no path
    # with a path the store is bound there, and checkpoints follow
    tr.checkpoint_every(1, path=tmp_path / "run")
    rng = np.random.default_rng(8)
    v = kept_step(tr, model, opt, rng)
    want = tr.store.version_hash(v)
    tr.checkpoint_every(None)  # off: the one in flight still ends at close
    kept_step(tr, model, opt, rng)
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want
