"""``tracker.checkpoint_every(n)``: a background save after every n-th kept step, at most
one in flight (a due one is deferred, never stacked), errors raised by the next kept step
before it commits, by ``save()`` or by ``close()``; with the fake torch of
``fake_torch.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fake_torch as ft
import tensor_history as th
from checkpoint_faults import KINDS, FaultyStore, Loop, Recording
from test_fake_torch import assert_same, make, state, train_step


@pytest.fixture(autouse=True)
def fake_torch_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", ft)
    yield


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


# ---- a checkpoint that fails at any point of a kept step ------------------------------------


def test_a_checkpoint_that_ends_with_an_error_while_keep_commits_is_raised_by_the_next_call(
        tmp_path):
    # The first checkpoint meets a branch another writer moved; it ends (with its error)
    # while the next keep() commits: after that call looked for an ended checkpoint. The
    # call that committed returns its version; the next call raises the error, changing
    # nothing.
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store, ends_at_commit=True)
    tr.store = rec
    tr.checkpoint_every(1)
    rng = np.random.default_rng(9)
    moved_by_another_store(tmp_path / "run")
    kept_step(tr, model, opt, rng)
    with pytest.raises(th.BranchMoved):
        rec.started[0][1].real.wait()  # it has failed; the tracker has not seen it
    n_log = len(tr.store.log())
    with tr.trial() as t:
        train_step(model, opt, rng)
        v = t.keep()  # it ends during this call's commit: kept, not raised here
        assert tr.store.head() == v and t.kept == v
    assert len(tr.store.log()) == n_log + 1
    assert len(rec.started) == 1  # the due checkpoint did not start after an error
    before, head = state(model, opt), tr.store.head()
    with tr.trial() as t:
        train_step(model, opt, rng)
        with pytest.raises(th.BranchMoved):
            t.keep()
        assert t.kept is None and tr.store.head() == head
    assert len(tr.store.log()) == n_log + 1
    for k, a in before.items():  # the trial put the model back
        if isinstance(a, np.ndarray):
            assert state(model, opt)[k].tobytes() == a.tobytes(), k
    kept_step(tr, model, opt, rng)  # raised once: this one commits, and checkpoints
    assert len(tr.store.log()) == n_log + 2 and len(rec.started) == 2
    with pytest.raises(th.BranchMoved):
        tr.close()


def test_a_checkpoint_whose_save_cannot_start_is_raised_by_the_next_call(tmp_path):
    # The store raises a failed background save nobody waited for (here one the user
    # started) from the next save(background=True): the checkpoint that falls due with
    # the second kept step cannot start. That keep() committed, and returns; the next
    # call raises the error before it commits, and the call after it checkpoints.
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    tr.checkpoint_every(2)
    rng = np.random.default_rng(10)
    kept_step(tr, model, opt, rng)
    moved_by_another_store(tmp_path / "run")
    tr.save(background=True)  # fails in the background; nobody waits for it
    head = tr.store.head()
    v = kept_step(tr, model, opt, rng)
    assert v != head and tr.store.head() == v and tr.store.parent(v) == head
    n_log = len(tr.store.log())
    train_step(model, opt, rng)
    with pytest.raises(th.BranchMoved):
        tr.commit("after the failed start")
    assert tr.store.head() == v and len(tr.store.log()) == n_log
    v2 = tr.commit("again")  # the step was applied once, and is committed once
    assert tr.store.parent(v2) == v
    with pytest.raises(th.BranchMoved):
        tr.close()  # the checkpoint it started met the moved branch too


def test_a_checkpoint_on_a_repository_that_went_away_is_raised_once_by_a_later_call(tmp_path):
    # A failing backend: the repository is moved away (a file in its place) while a
    # checkpoint writes to it; that checkpoint ends while the next keep() commits.
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "run")
    rec = Recording(tr.store, ends_at_commit=True)
    tr.store = rec
    tr.checkpoint_every(1)
    rng = np.random.default_rng(11)
    (tmp_path / "run").rename(tmp_path / "away")
    (tmp_path / "run").write_bytes(b"not a repository")
    kept_step(tr, model, opt, rng)
    with pytest.raises(th.StorageError):
        rec.started[0][1].real.wait()  # it failed; the tracker has not seen it
    v = kept_step(tr, model, opt, rng)  # it ends while this call commits: returns
    assert tr.store.head() == v
    with pytest.raises(th.StorageError):
        kept_step(tr, model, opt, rng)  # the next call raises it, changing nothing
    assert tr.store.head() == v
    (tmp_path / "run").unlink()
    (tmp_path / "away").rename(tmp_path / "run")
    # raised once: with the repository back, kept steps and checkpoints go on
    v2 = kept_step(tr, model, opt, rng)
    assert tr.store.parent(v2) == v
    want = tr.store.version_hash(v2)
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want and len(r.log()) == 1 + 3


def test_a_store_commit_never_raises_a_failed_background_save_s_error(tmp_path):
    """What a kept step relies on: ``Store.commit`` makes its version even after a
    background save failed unseen; that error waits for the next save."""
    s = th.Store()
    s.insert("w", np.zeros(3, np.float32))
    s.commit("a")
    s.save_as(tmp_path / "r")
    moved_by_another_store(tmp_path / "r")
    s.write("w", np.ones(3, np.float32))
    head = s.commit("b")
    p = s.save(background=True)  # fails in the background; nobody waits for it
    while not p.done():
        time.sleep(0.001)
    s.write("w", np.full(3, 2, np.float32))
    v = s.commit("c")  # takes the ended save back, and commits
    assert s.head() == v and s.parent(v) == head
    with pytest.raises(th.BranchMoved):
        s.save()


class HookedSGD(ft.SGD):
    """The fake SGD with torch's step pre-hooks, which ``copy_in_background`` needs (its
    step waits for the copy)."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr)
        self.pre_hooks: list = []

    def register_step_pre_hook(self, hook):
        self.pre_hooks.append(hook)
        return hook

    def step(self, grads) -> None:
        for hook in list(self.pre_hooks):
            hook(self, (grads,), {})
        super().step(grads)


@pytest.fixture
def storages(monkeypatch):
    """The fake tensors' ``untyped_storage()`` (what ``copy_in_background`` keeps alive
    while it copies): their arrays."""
    monkeypatch.setattr(ft.Tensor, "untyped_storage", lambda t: t._arr, raising=False)


def make_model(copy_in_background: bool):
    model, opt = make()
    if copy_in_background:
        opt = HookedSGD(opt.param_groups[0]["params"], lr=opt.param_groups[0]["lr"])
    return model, opt


def test_a_due_checkpoint_settles_a_commit_copied_in_the_background_first(tmp_path, storages):
    model, opt = make_model(copy_in_background=True)
    tr = th.torch.track(model, opt, path=tmp_path / "run", copy_in_background=True)
    tr.checkpoint_every(1)
    rng = np.random.default_rng(12)
    kept = [kept_step(tr, model, opt, rng) for _ in range(3)]
    want = tr.store.version_hash(kept[-1])
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want and len(r.log()) == 1 + 3


class Retry(Exception):
    """A kept step to run again."""


def reference(steps: int) -> dict:
    model, opt = make()
    for i in range(steps):
        train_step(model, opt, np.random.default_rng(100 + i))
    return state(model, opt)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=st.lists(st.sampled_from((None,) + KINDS), max_size=8),
       how=st.sampled_from(["keep, again", "trial, again", "commit"]),
       every=st.sampled_from([1, 2]), copy_in_background=st.booleans())
def test_a_checkpoint_failing_at_any_point_never_fails_a_call_that_committed(
        storages, plan, how, every, copy_in_background):
    """Background saves fail (an error seen before a kept step, one that ends while it
    commits, a save that cannot start) by a plan; every step is retried until its call
    returns. A call that raises changes nothing (HEAD, log, branch, model, ``t.kept``),
    every error is raised exactly once (by a later call or close()), and each step is
    applied and committed once."""
    path = tempfile.mkdtemp(prefix="th-ckpt-faults-")
    try:
        model, opt = make_model(copy_in_background)
        tr = th.torch.track(model, opt, path=path, copy_in_background=copy_in_background)
        faulty = FaultyStore(tr.store, plan)
        tr.store = faulty
        tr.checkpoint_every(every)
        loop = Loop(tr, lambda: state(model, opt))
        steps = 6
        for i in range(steps):
            batch = lambda: np.random.default_rng(100 + i)  # noqa: E731
            if how == "commit":
                train_step(model, opt, batch())
                assert loop.call(tr.commit) or loop.call(tr.commit)
            elif how == "keep, again":
                with tr.trial() as t:
                    train_step(model, opt, batch())
                    kept = lambda: {"kept": t.kept}  # noqa: E731
                    assert loop.call(t.keep, kept) or loop.call(t.keep, kept)
            else:  # a failed keep() ends the trial, which puts the step back; run it again
                for attempt in range(2):
                    before = state(model, opt)
                    try:
                        with tr.trial() as t:
                            train_step(model, opt, batch())
                            if not loop.call(t.keep, lambda: {"kept": t.kept}):
                                raise Retry
                        break
                    except Retry:
                        assert_same(state(model, opt), before)
                else:
                    raise AssertionError("a step failed twice")
        assert len(tr.store.log()) == 1 + steps
        loop.close()
        loop.check_errors(faulty)
        assert_same(state(model, opt), reference(steps))
    finally:
        shutil.rmtree(path, ignore_errors=True)
