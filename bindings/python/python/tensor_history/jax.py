"""Version history for JAX pytrees (Flax, Optax states) and Flax NNX modules.

Functional form, for state kept in pytrees of immutable arrays:

>>> tracker = tensor_history.jax.track(state)       # any pytree: params, opt_state, ...
>>> with tracker.trial(state) as t:                  # copies nothing on entry
...     new = train_step(state, batch)
...     if loss(new) < best:
...         t.keep(new)                               # commits the changed chunks only
>>> state = t.result                                  # the kept state, or the original
>>> state = tracker.undo()                            # the tree one kept step back
>>> state = tracker.restore(v)                        # any version, same structure

In-place form, for Flax NNX modules (``nnx.Variable`` values are replaced):

>>> tracker = tensor_history.jax.track(model, optimizer)   # nnx.Module, nnx.Optimizer
>>> with tracker.trial() as t:
...     train_step(model, optimizer, batch)                 # an nnx.jit step
...     if loss < best:
...         t.keep()
>>> # left without keep(): every Variable whose value changed gets its old value back.

How it works, and what to know:

- Names in the store: ``tree/<path>`` (functional) from ``jax.tree_util`` key paths
  joined by ``/`` (``params/dense/kernel``, ``opt_state/0/mu/dense/kernel``), over any
  nesting of dicts, lists, tuples, named tuples (Optax states) and dataclasses
  registered as pytrees; ``model/<path>`` and ``optim/<path>`` (NNX) from the graph
  paths of the module's and the optimizer's ``nnx.Variable``s.
- Arrays that did not change between commits are not copied again: a JAX array that
  is the same object as at the last commit (immutable; the tracker holds those arrays,
  so they cannot be freed and an identity cannot be reused) is skipped without reading
  it, other leaves are compared chunk by chunk, so a new array with the old values
  writes nothing. NumPy leaves are always compared: they may have been written in
  place (``state["a"][:] = 5; tracker.commit(state)`` records the fives).
- ``restore``, ``undo``, ``redo``, ``checkout`` return a tree of the structure of the
  last committed or restored tree (or of ``like=``): JAX leaves the target shares with
  it are the same array objects, the others new arrays of the same dtype (bfloat16 and
  float16 included) on the same devices and sharding. A leaf of another shape or
  dtype, or a target that lacks a leaf, raises ``TrialError(reason="model structure")``
  before HEAD moves. Typed PRNG keys are stored as their key data and wrapped again;
  NumPy leaves come back as new NumPy arrays, the caller's own (writing into one
  changes no version), Python scalars as Python scalars.
- Buffer donation (``jax.jit(step, donate_argnums=0)``): a donated input's arrays are
  deleted by the step. A trial that ends without ``keep()`` hands back the original
  tree with every deleted leaf rebuilt from the store (the base version), so donation
  and trials work together; the tracker never donates anything itself.
- Hyper-parameters that are Python floats in the optimizer (``optax.adam(1e-3)``) are
  part of the code, not the state; use ``optax.inject_hyperparams`` to make them leaves.
- ``trial(state)`` commits the entry state first when it differs from HEAD (as the
  torch tracker does), so that a revert goes back to it. A NumPy leaf written in place
  during a reverted trial (or after ``keep()``) is handed back in ``t.result`` as a new
  array holding the base's (the kept) values.
- Saving, as for every tracker: ``save(path=None, *, background=False)``,
  ``checkpoint_every(n, path=None)`` (a background save after every n-th ``keep()`` or
  ``commit()``; a checkpoint's error is raised by a later ``keep()`` or ``commit()``
  before it commits anything, or by ``save()`` or ``close()``), ``close()``, and
  ``with tensor_history.jax.track(state, path=...) as tracker:``, which closes the
  tracker (waiting for its checkpoint) at the end of the block.
- The store ``track`` makes (in memory, or opened at ``path``) has a memory budget of
  ``DEFAULT_BUDGET_STATES`` (4) tracked states, at least 64 MiB (for a pytree, the
  whole tree, optimizer state included; for an NNX module, its and the optimizer's
  Variables): versions past it are kept encoded (lossless deltas), and the oldest go
  when those pass it (see ``Store(memory_budget=...)``). Pass ``memory_budget=`` (bytes
  or ``None``) or ``store=`` to choose another.

JAX and Flax are imported on first use; nothing here needs them at import time.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._core import Store, Version
from ._errors import TrialError
from ._tracker import (AUTO_BUDGET, DEFAULT_BUDGET_MODELS, DEFAULT_BUDGET_STATES, AssignTracker,
                       Checkpoints, tracker_store)
from ._tracker import Trial as NnxTrial

__all__ = ["DEFAULT_BUDGET_MODELS", "DEFAULT_BUDGET_STATES", "FunctionalTrial", "NnxTracker",
           "NnxTrial", "Tracker", "nnx_model_bytes", "track", "tree_bytes"]

PREFIX = "tree/"


def _jax() -> Any:
    import jax

    return jax


def _is_key(x: Any) -> bool:
    jax = _jax()
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def leaf_to_numpy(x: Any) -> np.ndarray:
    """A read-only NumPy view (zero-copy for CPU arrays) of a leaf's values: typed PRNG
    keys as their key data, bool as uint8."""
    jax = _jax()
    if _is_key(x):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _start_host_copies(leaves: List[Any]) -> None:
    """``copy_to_host_async()`` on the JAX arrays among `leaves` that are not on the host
    (a no-op for them otherwise; deleted arrays are left to the caller's check)."""
    jax = _jax()
    for x in leaves:
        if isinstance(x, jax.Array) and not _deleted(x):
            try:
                on_host = all(d.platform == "cpu" for d in x.devices())
            except Exception:  # noqa: BLE001 - an array that cannot say: read it plainly
                continue
            if not on_host:
                x.copy_to_host_async()


def leaf_like(a: np.ndarray, template: Any) -> Any:
    """A new leaf holding `a` (a fresh array from the store) of the kind of `template`:
    a JAX array on the template's devices and sharding, a typed key, a NumPy array or a
    Python scalar."""
    jax = _jax()
    if isinstance(template, jax.Array):
        if _is_key(template):
            data = jax.device_put(a, template.sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(template))
        if template.dtype == np.bool_:
            a = a.view(np.bool_)
        return jax.device_put(a, template.sharding)
    if isinstance(template, np.ndarray) or isinstance(template, np.generic):
        return a.view(np.bool_) if template.dtype == np.bool_ else a
    if isinstance(template, (bool, int, float, complex)):
        return type(template)(a.reshape(()).item())
    return a


def _layout(x: Any) -> Tuple[str, tuple]:
    """(dtype name as stored, shape) of a leaf, without reading its values."""
    jax = _jax()
    if _is_key(x):
        x = jax.random.key_data(x)  # metadata only for a deleted key is not needed
    dtype = getattr(x, "dtype", None)
    dtype = np.dtype(dtype) if dtype is not None else np.asarray(x).dtype
    if dtype == np.bool_:
        dtype = np.dtype(np.uint8)
    return dtype.str if dtype.name != "bfloat16" else "bfloat16", tuple(np.shape(x))


def tree_bytes(tree: Any) -> int:
    """The bytes of a pytree's leaves (typed PRNG keys as their key data), from their
    shapes and dtypes without reading them: what the default memory budget of a tracker
    of `tree` is computed from (see ``DEFAULT_BUDGET_MODELS``)."""
    jax = _jax()
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        if _is_key(x):
            x = jax.random.key_data(x)
        n = getattr(x, "nbytes", None)
        total += int(n) if n is not None else np.asarray(x).nbytes
    return total


def _deleted(x: Any) -> bool:
    f = getattr(x, "is_deleted", None)
    return bool(f()) if f is not None else False


def _immutable(x: Any) -> bool:
    """Whether a leaf's values cannot change while it is held: JAX arrays, Python and
    NumPy scalars. Other leaves (NumPy arrays above all, even read-only ones, whose base
    may be written) can be written in place: the same object proves nothing."""
    return isinstance(x, (_jax().Array, bool, int, float, complex, np.generic))


def _holds(x: Any, a: np.ndarray) -> bool:
    """Whether leaf `x` holds exactly `a` (a stored array): dtype, shape and bytes."""
    live = leaf_to_numpy(x)
    return (live.dtype == a.dtype and live.shape == a.shape
            and np.ascontiguousarray(live).tobytes() == a.tobytes())


class FunctionalTrial:
    """A tentative step of a pytree (see :meth:`Tracker.trial`); ``result`` is the kept
    tree after the ``with`` block, or the entry tree. Leaves of it that a donating step
    deleted, and NumPy leaves written in place since (the entry tree's during the
    trial, the kept tree's after ``keep()``), are new arrays holding the version's
    values; the other leaves are the tree's own objects.

    Made by :meth:`Tracker.trial`, not constructed directly.

    Args:
        tracker: the pytree tracker the trial commits to.
        tree: the tree at entry: what ``result`` is unless ``keep()`` is called.
        message: the message of the version ``keep()`` commits.
    """

    def __init__(self, tracker: "Tracker", tree: Any, message: str) -> None:
        self._tracker = tracker
        self._entry = tree
        self.message = message
        self.base: Optional[Version] = None
        self.kept: Optional[Version] = None
        self.result: Any = tree
        self._ended = False

    def keep(self, tree: Any, message: Optional[str] = None, **metadata: Any) -> Version:
        """Commit `tree` (changed chunks only); it becomes :attr:`result`. NumPy leaves
        written in place after ``keep()`` get the kept values back on exit (in new
        arrays), unless ``keep()`` is called again.

        Args:
            tree: the tree to commit (the same structure as the tracker's).
            message: the commit message (default: the trial's).
            **metadata: the version's metadata (bool, int, float or str values).

        Returns:
            The version committed.

        Raises ``TrialError`` outside the ``with`` block, and the error of a checkpoint
        (see :meth:`Tracker.checkpoint_every`) before it commits anything: then nothing
        changed (``kept`` and ``result`` included); a ``keep()`` that committed returns.
        """
        if self._ended:
            raise TrialError("keep() after the trial's with block ended", reason="trial ended")
        if self.base is None:
            raise TrialError("keep() outside the trial's with block", reason="not entered")
        tr = self._tracker
        tr._checkpoint_outcome()
        v = tr._commit(tree, message if message is not None else self.message, metadata)
        self.kept = v
        self.result = tree
        tr._checkpoint_after_commit()
        return v

    def __enter__(self) -> "FunctionalTrial":
        tr = self._tracker
        if self._ended or self.base is not None:
            raise TrialError("a trial's with block can be entered once", reason="reused trial")
        if tr._trial is not None:
            raise TrialError("trials do not nest", reason="nested trial")
        tr._commit(self._entry, f"{self.message} (base)", {}, only_if_changed=True)
        self.base = tr.store.head()
        tr._trial = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        tr = self._tracker
        tr._trial = None
        self._ended = True
        target = self.kept if self.kept is not None else self.base
        if self.kept is None:
            self.result = self._entry
        # Leaves a donating step deleted, and NumPy leaves written in place since the
        # target was committed, come back from the store (in new arrays).
        if tr._stale(target, self.result):
            self.result = tr._build(target, self.result, keep_equal=True)
        tr.state = self.result
        return False


class Tracker(Checkpoints):
    """History of a pytree in a :class:`Store` (functional: trees in, trees out).

    ``resume``: make :attr:`state` the store's HEAD in the structure of `tree` instead
    of committing `tree` (default: when HEAD holds a tree, as after ``Store.open``).
    :attr:`state` is the tree of the last commit, restore or trial.

    Saving is that of every tracker: :meth:`save` (``background=True`` for a
    :class:`PendingSave`), :meth:`checkpoint_every`, :meth:`close`, and ``with
    track(tree, path=...) as tracker:``, which closes it at the end of the block.
    Usually made by :func:`track`.

    Args:
        tree: the pytree to track (JAX or NumPy arrays as leaves).
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        resume: put the store's HEAD into `state` (in the structure of `tree`) instead
            of committing (default: when HEAD holds a model, as after ``Store.open``).
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.

    Raises:
        TrialError: ``resume=True`` and the store holds no model.
        TypeError: ``memory_budget`` together with ``store``.
    """

    def __init__(self, tree: Any, *, store: Optional[Store] = None, message: str = "track",
                 resume: Optional[bool] = None, memory_budget: Any = AUTO_BUDGET) -> None:
        # Without a store, one of the default memory budget (DEFAULT_BUDGET_STATES times
        # the tree's bytes: for a pytree, the tree is the whole state) or of
        # `memory_budget` bytes.
        if store is not None and memory_budget is not AUTO_BUDGET:
            raise TypeError("memory_budget= sets the budget of the store the tracker makes: "
                            "with store=, set Store(memory_budget=...) instead")
        self.store = (store if store is not None
                      else tracker_store(None, tree_bytes(tree), memory_budget))
        self._trial: Optional[FunctionalTrial] = None
        self._init_checkpoints()
        self._leaves: Dict[str, Any] = {}
        self._synced_head: Optional[Version] = None
        self.state: Any = tree
        head = self.store.head()
        held = head is not None and any(n.startswith(PREFIX) for n in self.store.snapshot(head))
        if resume is None:
            resume = held
        if resume:
            if not held:
                raise TrialError("resume=True but the store has no committed tree",
                                 reason="nothing to resume")
            self.state = self._build(head, tree)
            self._synced(head, *self._flatten(self.state)[:2])
        else:
            self._commit(tree, message, {})

    # ---- trees and names ---------------------------------------------------------------

    def _flatten(self, tree: Any) -> Tuple[List[str], List[Any], Any]:
        jax = _jax()
        pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
        names = [PREFIX + jax.tree_util.keystr(p, simple=True, separator="/") for p, _ in pairs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise TrialError(f"the tree has several leaves named {dup[:5]}", reason="names")
        return names, [x for _, x in pairs], treedef

    def _synced(self, head: Version, names: List[str], leaves: List[Any]) -> None:
        self._leaves = dict(zip(names, leaves))
        self._synced_head = head

    def _commit(self, tree: Any, message: str, metadata: dict,
                only_if_changed: bool = False) -> Version:
        names, leaves, _ = self._flatten(tree)
        meta = {k: _plain(k, v) for k, v in metadata.items()}
        store = self.store
        clean = store.head() == self._synced_head and store.head() is not None
        held = self._leaves
        # The same immutable object as at the last sync holds the same values; anything
        # else (a NumPy array may have been written in place) is compared.
        read = [(n, x) for n, x in zip(names, leaves)
                if not (clean and held.get(n) is x and _immutable(x))]
        # Arrays on an accelerator start their device->host copies all at once, so that
        # they overlap one another instead of running one by one as each is read below.
        _start_host_copies([x for _, x in read])
        arrays = {}
        for n, x in read:
            if _deleted(x):
                raise TrialError(f"leaf `{n}` was deleted (donated to a jitted step)",
                                 reason="deleted")
            arrays[n] = leaf_to_numpy(x)
        live = set(names)
        gone = [n for n in store.names() if n.startswith(PREFIX) and n not in live]
        stats = store.sync(arrays)
        for n in gone:
            store.remove(n)
        if only_if_changed and clean and not gone and not store.is_dirty():
            self._synced(store.head(), names, leaves)
            return store.head()
        v = store.commit(message, **meta)
        del stats
        self._synced(v, names, leaves)
        self.state = tree
        return v

    def _build(self, target: Version, like: Any, keep_equal: bool = False) -> Any:
        """The tree of version `target` in the structure of `like`: immutable leaves
        `target` shares with the tracker's last sync are those objects, other leaves
        new arrays read from the store (so a NumPy leaf handed back is the caller's
        own, never an array anything else holds); with `keep_equal`, a NumPy leaf of
        `like` that holds `target`'s values is kept. Raises ``TrialError`` (changing
        nothing) when `target` does not fit `like`."""
        jax = _jax()
        names, leaves, treedef = self._flatten(like)
        store = self.store
        snap = store.snapshot(target)
        have = set(snap.keys())
        ours = {n for n in have if n.startswith(PREFIX)}
        missing = [n for n in names if n not in have]
        extra = sorted(ours - set(names))
        if missing or extra:
            raise TrialError(f"version {target} does not fit the tree: it lacks {missing[:5]} "
                             f"and has {extra[:5]} besides", reason="model structure")
        same: set = set()
        synced = self._synced_head
        if synced is not None and synced in store.versions():
            diff = store.diff(synced, target) if synced != target else {}
            same = {n for n in names if n not in diff or diff[n].kind == "unchanged"}
        out = []
        wrong = []
        for n, x in zip(names, leaves):
            held = self._leaves.get(n)
            if n in same and held is not None and _immutable(held) and not _deleted(held) \
                    and _layout(held) == _layout(x):
                out.append(held)
                continue
            a = snap[n]
            want = (a.dtype.str if a.dtype.name != "bfloat16" else "bfloat16", a.shape)
            if want != _layout(x):
                wrong.append(n)
                continue
            if keep_equal and not _immutable(x) and not _deleted(x) and _holds(x, a):
                out.append(x)
                continue
            out.append(leaf_like(a, x))
        if wrong:
            raise TrialError(f"the tree holds {wrong[:5]} with another shape or dtype than "
                             f"version {target}; nothing was changed", reason="model structure")
        return jax.tree_util.tree_unflatten(treedef, out)

    def _stale(self, target: Version, tree: Any) -> bool:
        """Whether `tree` (the tree `target` was committed from) has a leaf that no
        longer holds `target`'s values: one a donating step deleted, or a NumPy leaf
        written in place since. Reads only the mutable leaves' values."""
        names, leaves, _ = self._flatten(tree)
        snap = None
        for n, x in zip(names, leaves):
            if _deleted(x):
                return True
            if _immutable(x):
                continue
            if snap is None:
                snap = self.store.snapshot(target)
            if n not in snap or not _holds(x, snap[n]):
                return True
        return False

    def _move(self, target: Version, like: Any, move) -> Any:
        tree = self._build(target, self.state if like is None else like)
        move()
        names, leaves, _ = self._flatten(tree)
        self._synced(target, names, leaves)
        self.state = tree
        return tree

    # ---- the public calls ----------------------------------------------------------------

    def commit(self, tree: Any, message: str = "", **metadata: Any) -> Version:
        """Commit `tree`: leaves that are the immutable arrays of the last sync are
        skipped without reading them, others (NumPy leaves always: they may have been
        written in place) compared chunk by chunk; then an O(1) commit. Raises a
        checkpoint's error before it commits anything (see :meth:`checkpoint_every`).

        Args:
            tree: the tree to commit; it becomes :attr:`state`.
            message: the commit message.
            **metadata: the version's metadata (bool, int, float or str values).

        Returns:
            The version committed.
        """
        self._check_idle("commit")
        self._checkpoint_outcome()
        v = self._commit(tree, message, metadata)
        self._checkpoint_after_commit()
        return v

    def restore(self, ref: Any, like: Any = None) -> Any:
        """The tree of version `ref` (a Version or a ref name), in the structure of `like`
        (default: :attr:`state`); HEAD moves there. JAX leaves the version shares with
        the last sync are those arrays; NumPy leaves are always new arrays (writing
        into them changes no version)."""
        self._check_idle("restore")
        target = self.store.resolve(ref)
        return self._move(target, like, lambda: self.store.restore(target))

    def undo(self, like: Any = None) -> Any:
        """The tree of HEAD's parent; HEAD moves there (``NothingToUndo`` at the root).

        Args:
            like: the tree whose structure the result takes (default: :attr:`state`).
        """
        self._check_idle("undo")
        head = self.store.head()
        parent = self.store.parent(head) if head is not None else None
        if parent is None:
            self.store.undo()  # raises NothingToUndo, changing nothing
        return self._move(parent, like, self.store.undo)

    def redo(self, like: Any = None) -> Any:
        """The tree of the version the last undo came from; HEAD moves there.

        Args:
            like: the tree whose structure the result takes (default: :attr:`state`).
        """
        self._check_idle("redo")
        v = self.store.redo()
        self.store.undo()  # undo right after redo cannot fail
        return self._move(v, like, self.store.redo)

    def branch(self, name: str, at: Any = None) -> None:
        """Create branch `name` at `at` (default HEAD)."""
        self._check_idle("branch")
        self.store.branch(name, at)

    def checkout(self, name: str, like: Any = None) -> Any:
        """The tree of branch (or tag) `name`; HEAD moves there, later commits extend it.

        Args:
            name: the branch or tag.
            like: the tree whose structure the result takes (default: :attr:`state`).
        """
        self._check_idle("checkout")
        target = self.store.resolve(name)
        return self._move(target, like, lambda: self.store.checkout(name))

    def diff(self, a: Any, b: Any = None) -> dict:
        """The leaves that differ from version `a` to `b` (default HEAD): name -> Change."""
        b = self.store.head() if b is None else b
        return {n: c for n, c in self.store.diff(a, b).items() if c.kind != "unchanged"}

    def trial(self, tree: Any, message: str = "trial") -> FunctionalTrial:
        """``with tracker.trial(state) as t: state2 = step(state); t.keep(state2)``; after
        the block ``t.result`` is the kept tree or `state`.

        Args:
            tree: the tree at entry (``t.result`` unless ``keep()`` is called).
            message: the message of the version ``keep()`` commits.

        Returns:
            A :class:`FunctionalTrial` to enter with ``with``.
        """
        return FunctionalTrial(self, tree, message)

    def log(self) -> list:
        """The store's log from HEAD (see :meth:`Store.log`)."""
        return self.store.log()

    def stats(self) -> Any:
        """Bytes held against what deep copies of every version would hold (see
        :meth:`Store.stats`)."""
        return self.store.stats()


def _plain(key: str, v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)):
        return v
    a = np.asarray(v)
    if a.size != 1:
        raise TypeError(f"metadata `{key}` is an array of {a.size} elements; give a bool, "
                        "int, float or str (or a one-element array)")
    return a.reshape(()).item()


class NnxTracker(AssignTracker):
    """History of a Flax NNX module's ``nnx.Variable``s (and an ``nnx.Optimizer``'s) in a
    :class:`Store`, restored in place by setting each changed Variable's value. Usually
    made by :func:`track`.

    Args:
        model: the ``nnx.Module`` whose Variables are tracked.
        optimizer: an ``nnx.Optimizer`` whose state is tracked too (``None``: the model
            only).
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        trust_versions: skip, without comparing, tensors whose identity token (version
            counter, buffer) is unchanged since the last sync (default); ``False``
            compares every tensor's bytes.
        resume: put the store's HEAD into the module and optimizer instead of committing
            (default: when HEAD holds a model, as after ``Store.open``).
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.

    Raises:
        TrialError: ``resume=True`` and the store holds no model.
        TypeError: ``memory_budget`` together with ``store``.
    """

    SCALARS_KEY = "_nnx.scalars"

    def __init__(self, model: Any, optimizer: Any = None, *, store: Optional[Store] = None,
                 message: str = "track", trust_versions: bool = True,
                 resume: Optional[bool] = None, memory_budget: Any = AUTO_BUDGET) -> None:
        self.model = model
        self.optimizer = optimizer
        self._pending: Dict[int, Any] = {}
        self._keep: Dict[int, Any] = {}
        super().__init__(store=store, message=message, trust_versions=trust_versions,
                         resume=resume, memory_budget=memory_budget)

    def _model_bytes(self) -> int:
        return nnx_model_bytes(self.model)

    @staticmethod
    def _variables(obj: Any) -> List[Tuple[str, Any]]:
        from flax import nnx

        return [("/".join(str(p) for p in path), v) for path, v in nnx.iter_graph(obj)
                if isinstance(v, nnx.Variable)]

    def _live(self) -> Tuple[Dict[str, Any], Dict[str, Any], set]:
        out: Dict[str, Any] = {}
        tokens: Dict[str, Any] = {}
        untrusted: set = set()
        seen = set()
        groups = [("model/", self.model)]
        if self.optimizer is not None:
            groups.append(("optim/", self.optimizer))
        for prefix, obj in groups:
            for key, var in self._variables(obj):
                if id(var) in seen:
                    continue
                seen.add(id(var))
                name = prefix + key
                out[name] = var
                tokens[name] = tok = self._token(var)
                if tok is None:
                    untrusted.add(name)
        return out, tokens, untrusted

    def _token(self, var: Any) -> Any:
        value = var.get_value()
        if isinstance(value, np.ndarray):
            return None  # mutable: its identity proves nothing
        self._pending[id(var)] = value  # held: its id cannot be reused
        return id(value)

    def _synced_now(self) -> None:
        self._keep, self._pending = self._pending, {}

    def _np(self, name: str, var: Any) -> np.ndarray:
        return leaf_to_numpy(var.get_value())

    def _assign(self, name: str, var: Any, value: np.ndarray) -> None:
        var.set_value(leaf_like(value, var.get_value()))

    def _plain(self, key: str, v: Any) -> Any:
        return _plain(key, v)


def nnx_model_bytes(model: Any) -> int:
    """The bytes of the ``nnx.Variable`` values of `model`, a Flax NNX module (without
    an optimizer's): what the default memory budget of an :class:`NnxTracker` is
    computed from."""
    return sum(tree_bytes(var.get_value()) for _, var in NnxTracker._variables(model))


def track(tree_or_model: Any, optimizer: Any = None, *,
          path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Any:
    """Start tracking a pytree (returns a functional :class:`Tracker`) or a Flax NNX
    module and optimizer (returns an in-place :class:`NnxTracker`).

    Args:
        tree_or_model: a pytree, or an ``nnx.Module``.
        optimizer: an ``nnx.Optimizer`` (NNX only: a pytree's optimizer state is part
            of the tree).
        path: a repository's directory or URL to open (or create) and resume from.
        **kwargs: passed to the tracker (``store``, ``message``, ``resume``,
            ``memory_budget``, ...).

    Without `path`: commits the current state in a new in-memory store. With `path`:
    opens (or creates) the repository there; if it holds a history, its HEAD becomes the
    tracker's ``state`` (pytrees) or is put into the module (NNX). The store gets a
    memory budget of ``DEFAULT_BUDGET_STATES`` (4) tracked states (the whole tree; for
    NNX, the module's and the optimizer's Variables), or ``memory_budget`` bytes
    (``None``: none; or pass ``store=``): a loop that keeps every step holds at most that
    many states, the oldest versions going (saved to the repository with `path`, else
    dropped unless a branch or tag holds them). Other keyword arguments go to the
    tracker. Raises ``CorruptObject`` when the repository's HEAD does not read."""
    try:
        from flax import nnx
    except ImportError:
        nnx = None
    is_nnx = nnx is not None and isinstance(tree_or_model, nnx.Module)
    if optimizer is not None and not is_nnx:  # (before a repository is created at path)
        raise TypeError("a pytree's optimizer state is part of the tree: track((params, "
                        "opt_state)) instead of passing optimizer=")
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        nbytes = nnx_model_bytes(tree_or_model) if is_nnx else tree_bytes(tree_or_model)
        kwargs["store"] = tracker_store(path, nbytes, kwargs.pop("memory_budget", AUTO_BUDGET))
    if is_nnx:
        return NnxTracker(tree_or_model, optimizer, **kwargs)
    return Tracker(tree_or_model, **kwargs)
