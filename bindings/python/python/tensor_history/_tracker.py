"""The framework-neutral half of the trackers: trials, keep and revert, commits of what
changed, metadata, save and resume.

A framework module subclasses :class:`Tracker` and supplies the tensors by store name,
NumPy views of their storage, identity tokens that prove a tensor unchanged, and the
framework's hyper-parameters; everything else lives here. ``tensor_history.torch``
writes restores through writable views of the tensors' storage; frameworks without such
views (``tensor_history.tf``, ``tensor_history.keras``, the Flax NNX tracker of
``tensor_history.jax``) subclass :class:`AssignTracker`, which assigns each variable
whose value differs, whole.

Names in the store are ``<prefix>/...`` for each of the tracker's ``PREFIXES``; other
variables of the store (the user's own) are kept as they are by every commit.
"""

from __future__ import annotations

import json
import math
import os
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

import numpy as np

from ._core import PendingSave, SaveStats, Store, Version
from ._errors import (CorruptObject, OpenFallbackWarning, PrunedVersion, TrialError,
                      UncommittedChanges, UnknownVersion)

__all__ = ["AUTO_BUDGET", "DEFAULT_BUDGET_MIN_BYTES", "DEFAULT_BUDGET_MODELS",
           "DEFAULT_BUDGET_STATES", "AssignTracker",
           "Tracker", "Trial", "default_budget", "follow_budget", "tracker_store"]

#: A tracker that makes its own store (``track()`` without ``store=``) gives it a memory
#: budget of this many *states*, a state being everything the tracker tracks: the
#: model's tensors and the optimizer's (for AdamW, the weights and two moments: three
#: times the model). Two states are HEAD and the working copy, held raw; the rest holds
#: older versions encoded as lossless deltas, and when those pass it the oldest go
#: (spilled to the repository with ``path=``, else dropped unless a branch, tag or the
#: reflog holds them; see ``Store(memory_budget=...)``). So a dense training loop that
#: keeps every step holds at most this many states (plus the one being committed),
#: however long it runs (or ``DEFAULT_BUDGET_MIN_BYTES``, for a small model). The
#: budget follows the state as it grows (an optimizer's state
#: appears at its first step). ``track(..., memory_budget=bytes)`` sets another, fixed
#: budget; ``memory_budget=None`` none.
DEFAULT_BUDGET_STATES = 4
#: The same number under its earlier name.
DEFAULT_BUDGET_MODELS = DEFAULT_BUDGET_STATES
#: The default budget is at least this many bytes (64 MiB): a small model's history
#: keeps many more than ``DEFAULT_BUDGET_STATES`` states (a long undo) at no real cost.
DEFAULT_BUDGET_MIN_BYTES = 64 << 20

#: Stores made by :func:`tracker_store` whose budget follows the tracked state.
_AUTO_BUDGET: "weakref.WeakSet[Store]" = weakref.WeakSet()


def default_budget(model_bytes: int) -> Optional[int]:
    """The memory budget of a tracker's own store for a tracked state of `model_bytes`
    bytes: ``DEFAULT_BUDGET_STATES`` times that, and at least
    ``DEFAULT_BUDGET_MIN_BYTES`` (``None``, no budget, for no bytes)."""
    if model_bytes <= 0:
        return None
    return max(DEFAULT_BUDGET_STATES * model_bytes, DEFAULT_BUDGET_MIN_BYTES)


class _AutoBudget:
    """The default of ``track(..., memory_budget=)``: ``DEFAULT_BUDGET_STATES`` tracked
    states, following the state as it grows."""

    def __repr__(self) -> str:
        return "AUTO_BUDGET"


#: ``memory_budget=`` default of every ``track()`` (see ``DEFAULT_BUDGET_STATES``).
AUTO_BUDGET: Any = _AutoBudget()
_AUTO = AUTO_BUDGET


def tracker_store(path: Union[str, "os.PathLike[str]", None], model_bytes: int,
                  memory_budget: Any = _AUTO) -> Store:
    """The store a ``track()`` call makes: in memory (`path` ``None``) or the repository
    at `path` (opened or created). Its budget is `memory_budget` bytes when given
    (``None``: no budget), else :func:`default_budget` of `model_bytes`, raised as the
    tracker's state grows (see ``DEFAULT_BUDGET_STATES``).

    Raises ``CorruptObject`` if the repository's HEAD does not read and ``Store.open``
    fell back to an older version: a tracker would resume from that older state without
    a word. To resume from it knowingly, open the store yourself and pass ``store=``
    (``store.open_fallback`` says where it started)."""
    auto = memory_budget is _AUTO
    budget = default_budget(model_bytes) if auto else memory_budget
    if path is None:
        store = Store(memory_budget=budget)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OpenFallbackWarning)
            store = Store.open(path, memory_budget=budget)
        f = store.open_fallback
        if f is not None:
            where = f"branch `{f.branch}`" if f.branch is not None else "HEAD"
            raise CorruptObject(
                f"cannot resume from `{path}`: {where} is at version {f.wanted}, which does "
                f"not read ({f.error}); the repository opened at an older version, "
                f"{f.opened_at}. To resume from that one, open it yourself and pass it: "
                f"track(..., store=tensor_history.Store.open(path))",
                path=str(path), reason=f.error)
    if auto:
        _AUTO_BUDGET.add(store)
    return store


def follow_budget(store: Store, state_bytes: Callable[[], int]) -> None:
    """Raise the budget of a store :func:`tracker_store` made to
    ``DEFAULT_BUDGET_STATES`` times ``state_bytes()`` (the bytes the tracker tracks now)
    when that is more: an optimizer's state appears at its first step. Other stores'
    budgets are the caller's and stay as they are, and `state_bytes` is not called for
    them (a commit with a budget of the caller's does not count its tensors). O(1) plus
    `state_bytes`."""
    if store not in _AUTO_BUDGET:
        return
    want = default_budget(state_bytes())
    have = store.memory_budget
    if want is not None and (have is None or want > have):
        store.memory_budget = want


def _dtype_name(d: np.dtype) -> str:
    """The core's name of a NumPy dtype (``f32``, ``bf16``, ``u8``), as ``Store.info``
    gives it."""
    if d.name == "bfloat16":
        return "bf16"
    return d.kind + str(d.itemsize * 8)


_C = TypeVar("_C", bound="Checkpoints")


class NotJson(Exception):
    """A hyper-parameter value with no JSON form (kept in memory only)."""


class Trial:
    """A tentative change of the model: a ``with`` block whose changes are kept only if
    :meth:`keep` is called, else reverted in place on exit.

    Made by :meth:`Tracker.trial`, not constructed directly.

    Args:
        tracker: the tracker whose model and optimizer the trial changes.
        message: the message of the version ``keep()`` commits.
    """

    def __init__(self, tracker: "Tracker", message: str) -> None:
        self._tracker = tracker
        self.message = message
        self.base: Optional[Version] = None
        self.kept: Optional[Version] = None
        self._ended = False

    def keep(self, message: Optional[str] = None, **metadata: Any) -> Version:
        """Commit the model and optimizer as they are now (copies changed chunks only).

        Args:
            message: the commit message (default: the trial's).
            **metadata: the version's metadata (bool, int, float or str values).

        Returns:
            The version committed.

        Changes made after ``keep()`` inside the same ``with`` block are reverted on exit
        unless ``keep()`` is called again. Raises ``TrialError`` outside the ``with``
        block (before it, or after it ended), and the error of a checkpoint (see
        :meth:`Tracker.checkpoint_every`) before it commits anything: then nothing
        changed, and leaving the block reverts the trial; a ``keep()`` that committed
        returns.
        """
        if self._ended:
            raise TrialError("keep() after the trial's with block ended", reason="trial ended")
        if self.base is None:
            raise TrialError("keep() outside the trial's with block", reason="not entered")
        tr = self._tracker
        tr._checkpoint_outcome()
        before = self.kept
        v = tr._commit(message if message is not None else self.message, metadata)
        if tr._bg_pending is not None:
            tr._bg_trial = (self, before)
        self.kept = v
        tr._checkpoint_after_commit()
        return v

    def __enter__(self) -> "Trial":
        tr = self._tracker
        if self._ended or self.base is not None:
            raise TrialError("a trial's with block can be entered once", reason="reused trial")
        if tr._trial is not None:
            raise TrialError("trials do not nest", reason="nested trial")
        # The base is the state at entry: if the model, optimizer state or
        # hyper-parameters moved on since the last commit, record them first (copying
        # only the changed chunks), so that a revert goes back to them, not to HEAD.
        if tr.is_dirty():
            tr._commit(f"{self.message} (base)", {}, defer=False)
        self.base = tr._head()
        tr._trial = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        tr = self._tracker
        tr._trial = None
        self._ended = True
        target = self.kept if self.kept is not None else self.base
        assert target is not None
        if tr._bg_pending is not None and target == tr._head() and not tr._moved_since_sync():
            # Left right after keep(), nothing changed since: nothing to put back (and
            # the copy keep() started goes on).
            return False
        tr._apply(target, lambda: tr.store.restore(target), partial=True)
        return False


class Checkpoints:
    """``save``, ``checkpoint_every``, ``close`` and use as a context manager: what every
    tracker has, whatever its commits look like (this module's :class:`Tracker`, the
    JAX pytree tracker).

    The class using it has ``store`` and ``_trial`` (the trial whose ``with`` block is
    running, or ``None``), calls :meth:`_init_checkpoints` in its constructor before its
    first commit, and brackets every kept step (a trial's ``keep()``, a ``commit()``)
    with :meth:`_checkpoint_outcome` before it commits anything and
    :meth:`_checkpoint_after_commit` after. So a kept step either raises before it
    commits (changing nothing) or commits and returns: an error found after the commit
    (a checkpoint that ended with an error meanwhile, a save that cannot start) is kept
    and raised by the next kept step before it commits, or by ``save()`` or ``close()``.
    """

    store: Store
    _trial: Any

    def _init_checkpoints(self) -> None:
        # checkpoint_every(): every how many kept steps, the save in flight, an error
        # found after a kept step committed (raised by the next call), the kept steps
        # counted since checkpoint_every() was called, and how many of them the last
        # checkpoint started covers. Checkpoints fall due at multiples of the period,
        # so a deferred one does not shift the ones after it.
        self._ckpt_every: Optional[int] = None
        self._ckpt_pending: Optional[PendingSave] = None
        self._ckpt_error: Optional[BaseException] = None
        self._ckpt_kept = 0
        self._ckpt_covered = 0

    def _check_idle(self, what: str) -> None:
        """``TrialError`` inside a trial's ``with`` block (`what` names the call)."""
        if self._trial is not None:
            raise TrialError(f"{what}() inside a trial; leave the with block first",
                             reason="inside trial")

    def _settle(self) -> None:
        """Finish a commit whose copy is still in flight (none by default); raises if
        that commit was given up."""

    def save(
        self,
        path: Union[str, "os.PathLike[str]", None] = None,
        *,
        background: bool = False,
    ) -> Union[SaveStats, PendingSave]:
        """Write the committed versions to the store's repository (or, with `path`, bind
        the store to the repository there first): only chunks it lacks are written.
        Uncommitted changes are not saved: ``commit()`` first. Raises
        ``BranchMoved`` if another process moved the branch (see :meth:`Store.save`), or
        if ``path`` holds another run's history on this store's branch (see
        :meth:`Store.save_as`: nothing there is overwritten; resume with
        ``track(..., path=path)``, or save under another branch).

        ``background=True`` returns a :class:`PendingSave` at once and writes on a
        writer thread while training goes on (no copy of the model is made; see
        :meth:`Store.save`); with `path`, the store is bound there by a save first."""
        self._check_idle("save")
        self._checkpoint_outcome(wait=True)
        if background:
            if path is not None:
                self.store.save_as(path)
            return self.store.save(background=True)
        return self.store.save_as(path) if path is not None else self.store.save()

    def checkpoint_every(
        self,
        n: Optional[int],
        path: Union[str, "os.PathLike[str]", None] = None,
    ) -> None:
        """Save in the background after every `n`-th kept step (a trial's ``keep()`` or a
        ``commit()``), without a loop of your own; ``None`` stops it (a checkpoint in
        flight goes on; ``close()`` waits for it). With `path`, the store is first bound
        to the repository there by a blocking save (as ``save(path)``); without, the store
        must have a repository already (``track(..., path=...)``).

        A checkpoint costs the caller what ``save(background=True)`` does: it captures
        the versions to write, O(versions), with no copy of the model; a writer thread
        writes only the chunks the repository lacks while training goes on.

        Checkpoints fall due at the `n`-th, `2n`-th, ... kept step. At most one is in
        flight: one that falls due while the previous one still writes is **deferred**,
        never stacked and never waited for; it starts at the first kept step after the
        previous one ended, and writes every version kept since (so no kept step is left
        out, only later). A deferral does not move the later due steps, and ``close()``
        writes a due checkpoint still deferred, so what is saved at the end does not
        depend on how fast the writer was.

        Errors are never dropped, and never raised by a call that committed: a
        checkpoint's error (``StorageError``, ``BranchMoved``, ...) is raised once, by
        the next ``keep()`` or ``commit()`` after it ended, before that call commits
        anything (the call changes nothing; call it again to go on, as the next
        checkpoint will meet the cause again until it is dealt with), or else by
        ``save()`` or ``close()``. A kept step that committed returns its version: the
        error of a checkpoint that ended while it committed, or of a checkpoint it could
        not start (the store's ``save(background=True)`` raised), is raised the same way
        by the call after it, and the checkpoint stays due (the first kept step after
        the error starts it). Raises ``InvalidArgument`` for `n` < 1 or without a
        repository.
        """
        from ._errors import InvalidArgument

        self._check_idle("checkpoint_every")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidArgument(f"checkpoint_every needs a whole number >= 1 or None, got {n!r}")
        if n is not None and path is None and self.store.location is None:
            raise InvalidArgument(
                "checkpoint_every needs a repository: pass path=, or track(..., path=...)")
        if path is not None:
            self.save(path)
        self._ckpt_every = n
        self._ckpt_kept = 0
        self._ckpt_covered = 0

    def _checkpoint_outcome(self, wait: bool = False) -> None:
        """Raise an error kept from an earlier kept step, or the error of a checkpoint
        that ended (with `wait`: after waiting for the one in flight); each is raised
        once. Called before anything is committed or saved."""
        error = self._ckpt_error
        if error is not None:
            self._ckpt_error = None
            raise error
        p = self._ckpt_pending
        if p is None or not (wait or p.done()):
            return
        self._ckpt_pending = None
        p.wait()

    def _checkpoint_due(self) -> bool:
        """Whether a due step (a multiple of the period) is past what the last started
        checkpoint covers."""
        n = self._ckpt_every
        return n is not None and (self._ckpt_kept // n) * n > self._ckpt_covered

    def _checkpoint_after_commit(self) -> None:
        """Count a kept step that committed; start the checkpoint that is due unless one
        is in flight. Raises nothing about checkpoints: an error of the one that ended
        (seen here when it ended after :meth:`_checkpoint_outcome` looked), or of a
        save that cannot start, is kept for the next call, and the due checkpoint stays
        due (the first kept step after that error was raised starts it). Only a commit
        whose copy was still in flight, given up when settled (then nothing is
        counted), raises here."""
        n = self._ckpt_every
        if n is None:
            return
        kept = self._ckpt_kept + 1
        p = self._ckpt_pending
        start = (kept // n) * n > self._ckpt_covered and (p is None or p.done())
        if start:
            self._settle()  # the save captures the commit whose copy is in flight
        self._ckpt_kept = kept
        if not start:
            return  # not due, or deferred: the first kept step after it ended starts it
        try:
            if p is not None:
                self._ckpt_pending = None
                p.wait()
            self._ckpt_pending = self.store.save(background=True)
        except Exception as e:  # noqa: BLE001 - kept, raised by the next call
            self._ckpt_error = e
            return
        self._ckpt_covered = kept

    def close(self) -> None:
        """End the tracker's use: wait for the checkpoint in flight, write a checkpoint
        that was due but deferred (blocking), then close the store (see
        :meth:`Store.close`). Raises the first error among them; the store is closed
        in any case. Kept steps past the last due checkpoint are not saved: call
        ``save()`` first for those. Also the end of ``with track(...) as tracker:``."""
        try:
            self._checkpoint_outcome(wait=True)
            if self._checkpoint_due():
                self.store.save()
                self._ckpt_covered = self._ckpt_kept
        finally:
            self.store.close()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

class Tracker(Checkpoints):
    """History of a model's tensors and an optimizer's state in a :class:`Store`, written
    back in place. Framework modules subclass it; see ``tensor_history.torch``.

    Args:
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        trust_versions: skip, without comparing, tensors whose identity token (version
            counter, buffer) is unchanged since the last sync (default); ``False``
            compares every tensor's bytes.
        resume: put the store's HEAD into the model and optimizer instead of committing
            (default: when HEAD holds a model, as after ``Store.open``).
        copy_in_background: copy a kept step's tensors on another thread (see
            ``Store.commit_later``); the next call waits for the copy.
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.
    """

    #: Store-name prefixes this tracker owns (other names are the user's).
    PREFIXES: Tuple[str, ...] = ("model/", "optim/")
    #: Prefix of the names that must exist in a version the tracker restores.
    MODEL_PREFIX = "model/"
    #: Metadata key of the hyper-parameters' JSON; ``_`` keeps it out of ``graph()``.
    SCALARS_KEY = "_scalars"
    #: Keys older versions may hold the same JSON under.
    LEGACY_SCALARS_KEYS: Tuple[str, ...] = ()

    def __init__(
        self,
        *,
        store: Optional[Store] = None,
        message: str = "track",
        trust_versions: bool = True,
        resume: Optional[bool] = None,
        copy_in_background: bool = False,
        memory_budget: Any = _AUTO,
    ) -> None:
        # Without a store, one of the default memory budget (see DEFAULT_BUDGET_STATES)
        # or of `memory_budget` bytes.
        if store is not None and memory_budget is not _AUTO:
            raise TypeError("memory_budget= sets the budget of the store the tracker makes: "
                            "with store=, set Store(memory_budget=...) instead")
        self.store = (store if store is not None
                      else tracker_store(None, self._model_bytes(), memory_budget))
        self.trust_versions = trust_versions
        # copy_in_background: the tokens of the tensors a commit copies on another thread
        # (see Store.commit_later), until the store settles it; the tensors; and the trial
        # that kept it, with what that trial had kept before.
        self.copy_in_background = bool(copy_in_background)
        self._bg_pending: Optional[Dict[str, Any]] = None
        self._bg_entries: Dict[str, Any] = {}
        self._bg_memory: List[Any] = []
        self._bg_trial: Optional[Tuple[Trial, Optional[Version]]] = None
        self._trial: Optional[Trial] = None
        # name -> identity token at the last sync; the tensors are held so that their
        # storage cannot be freed and reused by a new tensor at the same address.
        self._synced: Dict[str, Any] = {}
        self._held: List[Any] = []
        self._synced_head: Optional[Version] = None
        self._extras: Dict[Version, Any] = {}
        self._init_checkpoints()
        head = self.store.head()
        held = head is not None and any(
            n.startswith(self.MODEL_PREFIX) for n in self.store.snapshot(head))
        if resume is None:
            resume = held
        if resume:
            if not held:
                raise TrialError("resume=True but the store has no committed model",
                                 reason="nothing to resume")
            self._apply(head, lambda: self.store.restore(head))
        else:
            # At once: the caller may load weights in place before the first step.
            self._commit(message, {}, defer=False)

    # ---- what a framework module supplies -------------------------------------------

    def _model_bytes(self) -> int:
        """The model's bytes (its tensors, without the optimizer's), from their shapes and
        dtypes without reading them: what :func:`default_budget` is computed from."""
        raise NotImplementedError

    def _nbytes(self, t: Any) -> int:
        """The bytes of tracked tensor `t` (what the default budget counts), from its
        shape and dtype without reading it."""
        n = getattr(t, "nbytes", None)
        if isinstance(n, (int, np.integer)):
            return int(n)
        numel, size = getattr(t, "numel", None), getattr(t, "element_size", None)
        if callable(numel) and callable(size):
            return int(numel()) * int(size())  # torch
        elems = int(np.prod([int(d) for d in getattr(t, "shape", ())], dtype=np.int64))
        width = getattr(t.dtype, "size", None)  # a TensorFlow DType
        if not isinstance(width, int):
            width = np.dtype(t.dtype).itemsize
        return elems * width

    def _live(self) -> Tuple[Dict[str, Any], Dict[str, Any], set]:
        """Every tracked tensor by store name (tied tensors once), their identity tokens
        (see :meth:`_token`), and the names whose token cannot prove them unchanged
        (always compared)."""
        raise NotImplementedError

    def _token(self, t: Any) -> Any:
        """A value equal between two calls only if the tensor is the same storage, layout
        and in-place version (``None``: cannot tell)."""
        raise NotImplementedError

    def _np(self, name: str, t: Any) -> np.ndarray:
        """A writable NumPy view of the tensor's storage."""
        raise NotImplementedError

    def _from_np(self, name: str, a: np.ndarray) -> Any:
        """A new framework tensor owning `a` (for optimizer state the live one lacks)."""
        raise NotImplementedError

    def _set_state(self, name: str, t: Any) -> None:
        """Put tensor `t` into the optimizer state entry `name`."""
        raise NotImplementedError

    def _drop_state(self, name: str) -> None:
        """Remove the optimizer state entry `name`."""
        raise NotImplementedError

    def _memory_of(self, t: Any) -> Any:
        """An object that keeps the memory of tensor `t` alive (copy_in_background)."""
        return t

    def _written_over(self, old: Any, new: Any) -> bool:
        """Whether a tensor whose token was `old` when its copy started and is `new` now
        may have been written in the memory being copied."""
        return old != new

    def _written(self, tensors: list) -> None:
        """Called with the tensors a restore wrote into (advance their version counters)."""

    def _forced_dirty(self, entries: Dict[str, Any]) -> set:
        """Names known to have changed although their token may not say so (tensors an
        optimizer step updated without advancing version counters)."""
        return set()

    def _synced_now(self) -> None:
        """Called after every sync (commit or restore)."""

    def _scalars(self, copy: bool = True) -> Any:
        """The hyper-parameters and non-tensor optimizer state, deep-copied (`copy`) or
        as they are (to compare them)."""
        return None

    def _restore_scalars(self, extras: Any) -> None:
        """Put hyper-parameters recorded by :meth:`_scalars` back."""

    def _encode_tensor(self, v: Any) -> Any:
        """The JSON form of a small framework tensor in the hyper-parameters."""
        raise NotJson(type(v).__name__)

    def _decode_tensor(self, d: dict) -> Any:
        raise NotJson("tensor")

    def _same_tensor(self, a: Any, b: Any) -> bool:
        return a is b

    def _plain(self, key: str, v: Any) -> Any:
        """A commit metadata value as a bool, int, float or str (framework scalars)."""
        return v

    # ---- hyper-parameters as JSON ----------------------------------------------------

    def _encode(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self._encode(x) for x in v]
        if isinstance(v, tuple):
            return {"tuple": [self._encode(x) for x in v]}
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {"dict": [[k, self._encode(x)] for k, x in v.items()]}
        return self._encode_tensor(v)

    def _decode(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self._decode(x) for x in v]
        if not isinstance(v, dict):
            return v
        if "tuple" in v:
            return tuple(self._decode(x) for x in v["tuple"])
        if "dict" in v:
            return {k: self._decode(x) for k, x in v["dict"]}
        return self._decode_tensor(v)

    def _dump_scalars(self, extras: Any) -> Optional[str]:
        if extras is None:
            return None
        try:
            return json.dumps({
                "groups": [self._encode(g) for g in extras["groups"]],
                "state": [[i, k, self._encode(v)] for (i, k), v in extras["state"].items()],
            })
        except NotJson:
            return None

    def _load_scalars(self, text: str) -> Any:
        d = json.loads(text)
        return {"groups": [self._decode(g) for g in d["groups"]],
                "state": {(i, k): self._decode(v) for i, k, v in d["state"]}}

    def _same_scalars(self, a: Any, b: Any) -> bool:
        """Deep equality of hyper-parameter values that never asks a tensor for its
        truth value (tensors compare by :meth:`_same_tensor`); NaN equals NaN."""
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(self._same_scalars(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(self._same_scalars(x, y) for x, y in zip(a, b))
        if isinstance(a, float):
            return a == b or (math.isnan(a) and math.isnan(b))
        if a is None or isinstance(a, (bool, int, str, bytes)):
            return a == b
        return self._same_tensor(a, b)

    # ---- syncing ---------------------------------------------------------------------

    def _owns(self, name: str) -> bool:
        return name.startswith(self.PREFIXES)

    def _mark_synced(self, entries: Dict[str, Any], tokens: Dict[str, Any],
                     head: Optional[Version], exclude: Tuple[str, ...] = (),
                     changed: Tuple[Any, ...] = ()) -> None:
        """Record `tokens` as the state of `head`; `changed`: names whose tensors were
        written since `tokens` were taken (their tokens are taken again)."""
        synced = dict(tokens)
        for n in changed:
            synced[n] = self._token(entries[n])
        for n in exclude:
            synced.pop(n, None)
        self._synced = synced
        self._held = list(entries.values())
        self._synced_head = head
        self._synced_now()

    def _dirty_names(self, entries: Dict[str, Any], tokens: Dict[str, Any],
                     untrusted: set) -> list:
        """Names that may differ from HEAD (all of them without trusted tokens)."""
        if not self.trust_versions or self._head() != self._synced_head:
            return list(entries)
        synced = self._synced
        forced = self._forced_dirty(entries)
        get = synced.get
        dirty = [n for n, tok in tokens.items()
                 if tok is None or n in untrusted or n in forced or get(n) != tok]
        dirty += [n for n in synced if n not in entries]
        return dirty

    def _commit(self, message: str, metadata: dict, defer: bool = True) -> Version:
        entries, tokens, untrusted = self._live()
        dirty = self._dirty_names(entries, tokens, untrusted)
        arrays = self._as_stored({n: self._np(n, entries[n]) for n in dirty if n in entries})
        names = self.store.names()
        gone = [n for n in names if self._owns(n) and n not in entries]
        scalars = self._scalars()
        meta = {k: self._plain(k, v) for k, v in metadata.items()}
        text = self._dump_scalars(scalars)
        if text is not None:
            meta[self.SCALARS_KEY] = text
        later, watched = self._sync_changed(
            arrays, untrusted, defer and self.copy_in_background and self.trust_versions)
        for n in gone:
            self.store.remove(n)
        follow_budget(self.store, lambda: sum(self._nbytes(t) for t in entries.values()))
        if later:
            v = self.store.commit_later(later, self._check_pending, message, self._ready(),
                                        **meta)
            self._bg_pending = {n: tokens[n] for n in watched}
            self._bg_entries = {n: entries[n] for n in watched}
            # The memory being copied stays alive even if a tensor is pointed elsewhere.
            self._bg_memory = [self._memory_of(entries[n]) for n in watched]
        else:
            v = self.store.commit(message, **meta)
        self._extras[v] = scalars
        self._mark_synced(entries, tokens, v)
        return v

    def _ready(self) -> Any:
        """What ``Store.commit_later`` calls before it reads the arrays :meth:`_sync_changed`
        left to it (``None``: they are in place already; the staged torch path waits for
        its device->host copies)."""
        return None

    def _sync_changed(self, arrays: Dict[str, Any], untrusted: set,
                      defer: bool) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """``store.sync`` the changed tensors' `arrays` (from :meth:`_np`) into the
        working state, but, with `defer` (``copy_in_background``), leave out those a
        commit may copy on another thread: returns them (for ``Store.commit_later``) and
        the names among them whose tensors must not be written until the copy ended
        (checked by their tokens when it did)."""
        later: Dict[str, np.ndarray] = {}
        if defer:
            # Tensors whose in-place writes advance their tokens are copied on another
            # thread; the others (buffers updated inside kernels) here, now.
            later = {n: a for n, a in arrays.items()
                     if n not in untrusted and a.flags.c_contiguous}
            arrays = {n: a for n, a in arrays.items() if n not in later}
        self.store.sync(arrays)
        return later, list(later)

    # ---- copies in the background (copy_in_background) ---------------------------------

    def _head(self) -> Optional[Version]:
        """HEAD, without waiting for a commit whose copy is in flight (its version)."""
        if self._bg_pending is not None:
            return self._synced_head
        return self.store.head()

    def _moved_since_sync(self) -> bool:
        """Whether a tensor or hyper-parameter may have changed since the last sync, told
        without reading the store (tensors that are always compared count as changed)."""
        entries, tokens, untrusted = self._live()
        if self._dirty_names(entries, tokens, untrusted):
            return True
        extras = self._extras.get(self._synced_head)
        return extras is None or not self._same_scalars(self._scalars(copy=False), extras)

    def _settle(self) -> None:
        """Wait for a commit whose copy is in flight and make it (raises ``TrialError``
        if a tensor changed while it was copied; that commit is then given up)."""
        if self._bg_pending is not None:
            self.store.settle()

    def _check_pending(self, copied: bool) -> None:
        """Called by the store when the copy of a pending commit ended (`copied`: without
        an error): ``TrialError`` if a tensor it copied was written meanwhile (the store
        then gives the commit up). After a failed copy the commit is not made either (the
        store raises the copy's error). Must not call the store."""
        pending, entries = self._bg_pending, self._bg_entries
        self._bg_pending, self._bg_entries, self._bg_memory = None, {}, []
        trial, self._bg_trial = self._bg_trial, None
        if pending is None:
            return
        changed = [n for n, tok in pending.items()
                   if self._written_over(tok, self._token(entries[n]))]
        if copied and not changed:
            return
        lost = self._synced_head
        self._extras.pop(lost, None)
        # Nothing is known of the live tensors now: the next sync compares every one.
        self._synced = {}
        self._synced_head = None
        if trial is not None:
            trial[0].kept = trial[1]
        if not copied:
            return
        raise TrialError(
            f"{changed[:5]} changed in place while the tracker copied them for version "
            f"{lost} (copy_in_background): that version was not made. Let only the "
            "optimizer's step() write tracked tensors between keep() or commit() and the "
            "next step, or track with copy_in_background=False.",
            reason="changed while copied")

    def _apply(self, target: Version, move, partial: bool = False) -> None:
        """Move the store with `move()` (to `target`) and write `target` into the model
        and optimizer in place, only the chunks that differ.

        Model tensors that `target` lacks: without `partial`, ``TrialError`` before
        anything changes; with `partial` (a trial's revert), everything else is put back,
        then ``TrialError`` names them. Model tensors of another shape or dtype are left
        as they are and named the same way."""
        entries, tokens, untrusted = self._live()
        snap = self.store.snapshot(target)
        names = set(snap.keys())
        model = self.MODEL_PREFIX
        extra = sorted(n for n in entries.keys() - names if n.startswith(model))
        if extra and not partial:
            raise TrialError(f"the model has tensors that version {target} lacks: {extra[:5]}",
                             reason="model structure")
        prev = self.store.head()
        if not partial:
            self._check_layouts(entries, target, snap)
        dirty = set(self._dirty_names(entries, tokens, untrusted))
        clean_known = prev == self._synced_head and self.trust_versions
        into_dirty = {}
        into_clean = {}
        for n, t in entries.items():
            if n not in names:
                continue
            if n in dirty:
                into_dirty[n] = self._np(n, t)
            elif prev != target or not clean_known:
                into_clean[n] = self._np(n, t)
        move()
        written: Dict[str, Any] = {}
        mismatched: List[str] = []
        known = prev if clean_known else None
        for group, k in ((into_clean, known), (into_dirty, None)):
            if group:
                self._write(group, k, written, mismatched, entries)
        bumped = [n for n, s in written.items() if s.chunks_changed > 0]
        # Optimizer state of another shape or dtype is replaced by a new tensor.
        replaced = [n for n in mismatched if not n.startswith(self.MODEL_PREFIX)]
        stuck = [n for n in mismatched if n.startswith(self.MODEL_PREFIX)]
        for n in replaced:
            self._set_state(n, self._from_np(n, snap[n]))
        # optimizer state that the target lacks, or that the live optimizer lacks
        dropped = [n for n in entries.keys() - names if not n.startswith(model)]
        for n in dropped:
            self._drop_state(n)
        added = [n for n in names - entries.keys()
                 if self._owns(n) and not n.startswith(model)]
        for n in added:
            self._set_state(n, self._from_np(n, snap[n]))
        self._restore_scalars(self._scalars_of(target))
        self._written([entries[n] for n in bumped])
        problems = tuple(extra + stuck)
        # Tensors left as they were stay dirty (a later commit records them).
        if replaced or dropped or added:
            live, live_tokens, _ = self._live()
            self._mark_synced(live, live_tokens, target, exclude=problems)
        else:
            self._mark_synced(entries, tokens, target, exclude=problems, changed=tuple(bumped))
        if problems:
            raise TrialError(
                f"the model has tensors that version {target} lacks or holds with another "
                f"shape or dtype: {problems[:5]}; everything else was put back",
                reason="model structure")

    def _checks_layout(self, name: str) -> bool:
        """Whether a restore (not a trial's revert) must find `name` with the target's
        shape and dtype before it writes anything (optimizer state of another layout is
        replaced by a new tensor instead)."""
        return name.startswith(self.MODEL_PREFIX)

    def _as_stored(self, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The arrays a commit writes, in the dtypes the store holds them in where
        :meth:`_fits` lets a live tensor differ."""
        return arrays

    def _fits(self, live: str, stored: str) -> bool:
        """Whether a tensor of dtype `live` can take values stored as `stored` (the
        core's dtype names)."""
        return live == stored

    def _check_layouts(self, entries: Dict[str, Any], target: Version, snap: Any) -> None:
        """``TrialError`` if a live tensor that :meth:`_checks_layout` names has another
        shape or dtype than in `target` (read from `snap`'s layouts: no tensor data)."""
        wrong = []
        for n in entries:
            if n not in snap or not self._checks_layout(n):
                continue
            live = self._np(n, entries[n])
            dtype, shape = snap.info(n)
            if tuple(live.shape) != tuple(shape) or not self._fits(_dtype_name(live.dtype), dtype):
                wrong.append(n)
        if wrong:
            raise TrialError(
                f"the model holds {wrong[:5]} with another shape or dtype than version "
                f"{target}; nothing was changed", reason="model structure")

    def _write(self, into: dict, known: Optional[Version], written: dict,
               mismatched: list, entries: Dict[str, Any]) -> None:
        """``write_into`` all of `into`; if some target has another shape or dtype, the
        others one by one and those collected in `mismatched`."""
        from ._errors import DTypeMismatch, ShapeMismatch

        try:
            written.update(self.store.write_into(into, known=known))
            return
        except (ShapeMismatch, DTypeMismatch):
            pass
        for n, a in into.items():
            try:
                written.update(self.store.write_into({n: a}, known=known))
            except (ShapeMismatch, DTypeMismatch):
                mismatched.append(n)

    def _scalars_of(self, v: Version) -> Any:
        """The hyper-parameters of version `v`: kept in memory, or from its metadata
        (versions loaded from a repository)."""
        extras = self._extras.get(v)
        if extras is None:
            meta = self.store.metadata(v)
            for key in (self.SCALARS_KEY, *self.LEGACY_SCALARS_KEYS):
                text = meta.get(key)
                if isinstance(text, str):
                    extras = self._load_scalars(text)
                    self._extras[v] = extras
                    break
        return extras

    # ---- the public calls ------------------------------------------------------------

    def commit(self, message: str = "", **metadata: Any) -> Version:
        """Commit the model and optimizer: compares (or, by identity tokens, skips) each
        tensor, copies changed chunks only, then an O(1) commit. Raises a checkpoint's
        error before it commits anything (see :meth:`checkpoint_every`).

        Args:
            message: the commit message.
            **metadata: the version's metadata (bool, int, float or str values).

        Returns:
            The version committed.
        """
        self._check_idle("commit")
        self._checkpoint_outcome()
        v = self._commit(message, metadata)
        self._checkpoint_after_commit()
        return v

    def is_dirty(self) -> bool:
        """Whether the model, the optimizer state or the hyper-parameters changed since
        HEAD: tensors by identity tokens where they are trusted, by comparing bytes
        otherwise; hyper-parameters by value."""
        head = self._head()
        if head != self._synced_head:
            return True
        entries, tokens, untrusted = self._live()
        for n in self._dirty_names(entries, tokens, untrusted):
            if n not in entries or n not in untrusted and self.trust_versions:
                return True
            if n not in self.store:
                return True
            live = self._np(n, entries[n])
            held = self.store.get(n)
            if live.shape != held.shape or live.dtype.itemsize != held.dtype.itemsize:
                return True
            # Bytes compared in place (no copies of a large table on every call).
            if live.size and not np.array_equal(
                    np.ascontiguousarray(live).reshape(-1).view(np.uint8),
                    held.reshape(-1).view(np.uint8)):
                return True
        saved = self._scalars_of(head) if head is not None else None
        if saved is not None and not self._same_scalars(self._scalars(copy=False), saved):
            return True
        return False

    def restore(self, ref: Any) -> Version:
        """Put version `ref` (a Version or a ref name) back into the model and optimizer in
        place; HEAD moves there. Uncommitted changes of the model are overwritten."""
        self._check_idle("restore")
        target = self.store.resolve(ref)
        self._apply(target, lambda: self.store.restore(target))
        return target

    def undo(self) -> Version:
        """Back to HEAD's parent, in place. Raises ``UncommittedChanges`` if the model
        changed since HEAD (commit first, or use ``restore``)."""
        self._check_idle("undo")
        if self.is_dirty():
            raise UncommittedChanges("the model changed since the last commit; commit or restore first")
        head = self.store.head()
        parent = self.store.parent(head) if head is not None else None
        if parent is None:
            self.store.undo()  # raises NothingToUndo, changing nothing
        self._apply(parent, self.store.undo)
        return parent

    def redo(self) -> Version:
        """Forward to the version the last undo came from, in place."""
        self._check_idle("redo")
        if self.is_dirty():
            raise UncommittedChanges("the model changed since the last commit; commit or restore first")
        v = self.store.redo()
        self.store.undo()  # undo right after redo cannot fail
        self._apply(v, self.store.redo)
        return v

    def branch(self, name: str, at: Any = None) -> None:
        """Create branch `name` at `at` (default HEAD); HEAD stays where it is."""
        self._check_idle("branch")
        self.store.branch(name, at)

    def checkout(self, name: str) -> Version:
        """Move HEAD to branch (or tag) `name` and write its version into the model and
        optimizer in place, as :meth:`restore` does; later commits extend that branch."""
        self._check_idle("checkout")
        target = self.store.resolve(name)
        self._apply(target, lambda: self.store.checkout(name))
        return target

    def trial(self, message: str = "trial") -> Trial:
        """A ``with`` block whose changes are kept only if ``keep()`` is called.

        Args:
            message: the message of the version ``keep()`` commits.

        Returns:
            A :class:`Trial` to enter with ``with``.
        """
        return Trial(self, message)

    def log(self) -> list:
        """The store's log from HEAD (see :meth:`Store.log`)."""
        return self.store.log()

    def stats(self) -> Any:
        """Bytes held against what deep copies of every version would hold."""
        return self.store.stats()

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.names())



class _Assigned:
    """What :meth:`AssignTracker._write` did to one variable (``WriteStats``' field)."""

    __slots__ = ("chunks_changed",)

    def __init__(self, changed: bool) -> None:
        self.chunks_changed = int(changed)


class AssignTracker(Tracker):
    """A tracker for frameworks whose variables have no writable view of their storage
    (TensorFlow, Keras, JAX arrays): it reads through read-only views (or copies) and
    restores by assigning each variable whose value differs from the target, whole.

    Subclasses supply :meth:`_live`, :meth:`_token`, :meth:`_np` (a read-only NumPy view
    or copy of the current value) and :meth:`_assign`. Optimizer variables cannot be
    created or dropped from here: a restore leaves those the target lacks as they are
    and ignores those the live optimizer lacks; every tracked variable must have the
    target's shape and dtype, or the restore raises before it assigns anything.
    """

    def _assign(self, name: str, var: Any, value: Any) -> None:
        """Put `value` into variable `var`: a fresh array owned by the caller, or a value
        :meth:`_held_value` gave."""
        raise NotImplementedError

    def _held_value(self, name: str, var: Any) -> Any:
        """A value the tracker holds that is, bit for bit, what `var` held at the last
        sync (and so what the synced version holds under `name`), or ``None``. A restore
        assigns it to a changed variable whose target value is the synced one, without
        reading the store or the variable (a trial's revert, above all)."""
        return None

    def _checks_layout(self, name: str) -> bool:
        return True

    def _fits(self, live: str, stored: str) -> bool:
        """Integers of another width fit (step counters are int64 on one backend and
        int32 on another), provided the values do: see :meth:`_write`."""
        return live == stored or (live[0] in "iu" and stored[0] in "iu")

    def _as_stored(self, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Integers of another width than the store's are written in the store's dtype
        when the values fit (else as they are, which raises ``DTypeMismatch``)."""
        store = self.store
        for n, a in arrays.items():
            if a.dtype.kind in "iu" and n in store:
                stored = store.info(n)[0]
                if stored != _dtype_name(a.dtype) and stored[0] in "iu":
                    cast = a.astype(np.dtype(stored[0] + str(int(stored[1:]) // 8)))
                    if np.array_equal(cast.astype(a.dtype), a):
                        arrays[n] = cast
        return arrays

    def _write(self, into: dict, known: Optional[Version], written: dict,
               mismatched: list, entries: Dict[str, Any]) -> None:
        """Assign the store's working state to every variable of `into` whose value
        differs. With `known` (a version the variables are known to hold), variables
        the store holds unchanged since `known` are skipped without reading them."""
        store = self.store
        head = store.head()
        if known is not None:
            if known == head:
                return
            diff = store.diff(known, head)
            into = {n: a for n, a in into.items()
                    if n not in diff or diff[n].kind != "unchanged"}
        # Variables whose target value is the one they held at the last sync get the
        # value the tracker held since (held values are trusted only with trust_versions:
        # a write that bypasses the framework could have changed them too).
        synced = self._synced_head
        as_synced: Any = ()
        if self.trust_versions and synced is not None and head is not None:
            if synced == head:
                as_synced = into
            else:
                try:
                    moved = store.diff(synced, head)
                except (UnknownVersion, PrunedVersion):
                    moved = None  # pruned since: nothing is known to be as synced
                if moved is not None:
                    as_synced = {n for n in into
                                 if n not in moved or moved[n].kind == "unchanged"}
        for n, live in into.items():
            if n in as_synced:
                held = self._held_value(n, entries[n])
                if held is not None:
                    self._assign(n, entries[n], held)
                    written[n] = _Assigned(True)
                    continue
            want = store.get(n)
            if want.shape != live.shape or not self._fits(_dtype_name(live.dtype),
                                                          _dtype_name(want.dtype)):
                mismatched.append(n)
                continue
            if want.dtype != live.dtype:
                cast = want.astype(live.dtype)
                if not np.array_equal(cast.astype(want.dtype), want):
                    mismatched.append(n)  # the values do not fit the narrower integer
                    continue
                want = cast
            same = want.size == 0 or np.array_equal(
                np.ascontiguousarray(live).reshape(-1).view(np.uint8),
                want.reshape(-1).view(np.uint8))
            if not same:
                self._assign(n, entries[n], want)
            written[n] = _Assigned(not same)

    def _set_state(self, name: str, t: Any) -> None:
        """Optimizer variables are the optimizer's: a version's extra ones are ignored."""

    def _drop_state(self, name: str) -> None:
        """Optimizer variables a version lacks are left as they are."""

    def _from_np(self, name: str, a: np.ndarray) -> Any:
        return a
