"""Background saves whose end the test decides, for the trackers' ``checkpoint_every``
tests: :class:`Recording` gates the real saves (they end when the test waits for them,
or, with ``ends_at_commit``, while the next kept step commits); :class:`FaultyStore`
makes them fail at every point of a kept step (``keep()`` or ``commit()``); and
:class:`Loop` retries each failed step and checks that a call that raised changed
nothing.

A tracker calls ``store.save(background=True)`` for a checkpoint and asks the
``PendingSave`` it gets whether it ended (``done()``) and how (``wait()``). The kinds of
failure :class:`FaultyStore` injects, one per save it is asked for:

- ``"ended"``: the save fails and has ended before the tracker's next call starts;
- ``"during"``: it fails, and ends while the next kept step commits (after that call
  looked for an ended checkpoint, before it starts the next one);
- ``"start"``: ``save(background=True)`` itself raises, after the step committed.

Every injected error is a ``StorageError`` of its own message, so the test can tell that
each one was raised exactly once. The saves that do not fail are real, blocking saves.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import numpy as np

import tensor_history as th

KINDS = ("ended", "during", "start")


def same_value(a: Any, b: Any) -> bool:
    """Deep equality; arrays bit for bit (dtype, shape and bytes)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(
            same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


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
    """The tracker's store, with every background save recorded and gated. With
    `ends_at_commit`, a save ends (its gate opens) when the store next commits: while
    the tracker's next kept step commits, after that call looked for an ended save."""

    def __init__(self, store, ends_at_commit: bool = False) -> None:
        self._store = store
        self.started: list = []  # (HEAD at the call, Gate)
        self.ends_at_commit = ends_at_commit

    def _commit_starts(self) -> None:
        if self.ends_at_commit:
            for _, g in self.started:
                g.open = True

    def commit(self, *args, **kwargs):
        self._commit_starts()
        return self._store.commit(*args, **kwargs)

    def commit_later(self, *args, **kwargs):
        self._commit_starts()
        return self._store.commit_later(*args, **kwargs)

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


class Done:
    """A save that ended well (a real, blocking save done at once)."""

    def __init__(self, stats) -> None:
        self.stats = stats

    def done(self) -> bool:
        return True

    def wait(self):
        return self.stats


class Failing:
    """A save that fails with `error`; it has ended at once, or (`during`) once the
    store committed after it started."""

    def __init__(self, error: Exception, during: bool) -> None:
        self.error = error
        self.ended = not during

    def done(self) -> bool:
        return self.ended

    def wait(self):
        self.ended = True
        raise self.error


class FaultyStore:
    """The tracker's store, whose background saves follow `plan` (one entry per save
    asked for: ``None`` for a real save, else a kind of :data:`KINDS`)."""

    def __init__(self, store, plan: List[Optional[str]]) -> None:
        self._store = store
        self.plan = list(plan)
        self.asked = 0
        self.injected: List[str] = []
        self._during: List[Failing] = []

    def save(self, *, background: bool = False):
        if not background:
            return self._store.save()
        i, self.asked = self.asked, self.asked + 1
        kind = self.plan[i] if i < len(self.plan) else None
        if kind is None:
            return Done(self._store.save())
        message = f"injected fault {i} ({kind})"
        self.injected.append(message)
        error = th.StorageError(message)
        if kind == "start":
            raise error
        p = Failing(error, during=kind == "during")
        if kind == "during":
            self._during.append(p)
        return p

    def _ends_during(self) -> None:
        for p in self._during:
            p.ended = True
        self._during = []

    def commit(self, *args, **kwargs):
        self._ends_during()
        return self._store.commit(*args, **kwargs)

    def commit_later(self, *args, **kwargs):
        self._ends_during()
        return self._store.commit_later(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)

    def __contains__(self, name) -> bool:
        return name in self._store


class Loop:
    """Kept steps with retries: each failed call is checked to have changed nothing
    (`seen()` gives what it must leave as it was), and every error raised is recorded."""

    def __init__(self, tracker, seen: Callable[[], Dict[str, Any]]) -> None:
        self.tr = tracker
        self.seen = seen
        self.raised: List[str] = []

    def record(self) -> Dict[str, Any]:
        store = self.tr.store
        branch = store.current_branch()
        return {"head": store.head(), "log": [e.id for e in store.log()],
                "branch": (branch, store.resolve(branch) if branch is not None else None),
                **self.seen()}

    def call(self, f: Callable[[], Any], extra: Callable[[], Dict[str, Any]] = dict) -> bool:
        """Run `f` (a keep() or commit()); if it raises, check that nothing changed and
        record the error. Whether it returned."""
        before = {**self.record(), **extra()}
        try:
            v = f()
        except th.TensorHistoryError as e:
            after = {**self.record(), **extra()}
            assert after.keys() == before.keys()
            for k in before:
                assert same_value(after[k], before[k]), k
            self.raised.append(str(e))
            return False
        assert self.tr.store.head() == v
        return True

    def close(self) -> None:
        try:
            self.tr.close()
        except th.TensorHistoryError as e:
            self.raised.append(str(e))
        assert self.tr.store.closed

    def check_errors(self, store: FaultyStore) -> None:
        """Every injected error was raised exactly once (by a later call or close())."""
        assert sorted(self.raised) == sorted(store.injected), (self.raised, store.injected)
