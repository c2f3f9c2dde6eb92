"""Version history for a PyTorch model and optimizer, restored in place.

>>> tracker = tensor_history.torch.track(model, optimizer)   # commits the current state
>>> with tracker.trial("lr probe") as t:                     # copies nothing on entry
...     loss = train_step()
...     if loss < best:
...         t.keep()                                          # commits changed chunks only
>>> # left without keep() (or on an exception): parameters, buffers and optimizer state
>>> # are put back in place, only the chunks that differ are written.
>>> tracker.undo()                                            # back one kept step

How it works, and what to know:

- The tracker reads and writes the tensors' own storage through NumPy views of
  ``model.state_dict()`` (which shares storage with the parameters) and of the
  optimizer's ``state``; ``Parameter`` objects keep their identity, so optimizer
  references stay valid. bfloat16 tensors go through ``t.view(torch.uint16)`` views.
- Parameters and optimizer state untouched since the last sync are found without
  reading them, by their in-place version counter (``tensor._version``, which every
  in-place torch op advances). Buffers are always compared: BatchNorm's running
  statistics, for one, are updated inside a kernel that leaves the counter alone.
  Writes that bypass torch (through ``.numpy()`` views or ``.data`` of another tensor
  sharing the storage) do not advance it: pass ``trust_versions=False`` to compare every
  tensor's bytes instead.
- Every tensor the tracker writes gets its version counter advanced, as torch's own
  in-place ``copy_`` would: a ``backward()`` through a graph built before a restore that
  saved a restored tensor raises torch's "modified by an inplace operation" error instead
  of computing silently wrong gradients. ``.grad`` fields are not part of the state and
  are left as they are (call ``optimizer.zero_grad()`` as usual).
- Tied weights (several state_dict names over the same storage) are stored once.
- CPU tensors only; optimizer state that appears (first ``step()``) or disappears
  between versions is created or removed; ``param_groups`` hyper-parameters (learning
  rates, ...) are restored too.
- Saving and resuming: ``track(model, optimizer, path="runs/exp1")`` opens (or creates)
  the repository there; if it holds a history, its HEAD is put back into the model and
  optimizer in place. ``tracker.save()`` writes the committed versions (only chunks the
  repository lacks). ``param_groups`` values and non-tensor optimizer state travel as
  JSON in each version's metadata under ``"torch.scalars"`` (None, bool, int, float,
  str, lists, tuples, dicts and small tensors; a version with other values keeps them
  in memory only, and restoring it after a reopen leaves ``param_groups`` as they are).

torch is imported on first use; nothing here needs it at import time.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import numpy as np

from ._core import SaveStats, Store, Version
from ._errors import TrialError, UncommittedChanges

__all__ = ["Tracker", "Trial", "track"]


def _torch() -> Any:
    import torch

    return torch


SCALARS_KEY = "torch.scalars"
"""Metadata key of the optimizer's hyper-parameters and non-tensor state (JSON)."""


class _NotJson(Exception):
    pass


def _encode(v: Any) -> Any:
    """A JSON-able form of a param_groups / optimizer-state value (tagged tuples, dicts and
    small tensors, so that decoding gives back the same Python types)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, tuple):
        return {"tuple": [_encode(x) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": [[k, _encode(x)] for k, x in v.items()]}
    torch = _torch()
    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel() <= 64:
        return {"tensor": v.detach().tolist(), "dtype": str(v.dtype).removeprefix("torch."),
                "shape": list(v.shape)}
    raise _NotJson(type(v).__name__)


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "tuple" in v:
        return tuple(_decode(x) for x in v["tuple"])
    if "dict" in v:
        return {k: _decode(x) for k, x in v["dict"]}
    torch = _torch()
    return torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"])).reshape(v["shape"])


def _dump_scalars(extras: dict) -> Optional[str]:
    try:
        return json.dumps({
            "groups": [_encode(g) for g in extras["groups"]],
            "state": [[i, k, _encode(v)] for (i, k), v in extras["state"].items()],
        })
    except _NotJson:
        return None


def _load_scalars(text: str) -> dict:
    d = json.loads(text)
    return {"groups": [_decode(g) for g in d["groups"]],
            "state": {(i, k): _decode(v) for i, k, v in d["state"]}}


def _increment_version(tensors: list) -> None:
    if not tensors:
        return
    torch = _torch()
    bump = torch.autograd.graph.increment_version
    for t in tensors:
        bump(t)


class Trial:
    """A tentative change of the model (see :meth:`Tracker.trial`)."""

    def __init__(self, tracker: "Tracker", message: str) -> None:
        self._tracker = tracker
        self.message = message
        self.base: Optional[Version] = None
        self.kept: Optional[Version] = None

    def keep(self, message: Optional[str] = None, **metadata: Any) -> Version:
        """Commit the model and optimizer as they are now (copies changed chunks only).

        Changes made after ``keep()`` inside the same ``with`` block are reverted on exit
        unless ``keep()`` is called again.
        """
        if self.base is None:
            raise TrialError("keep() outside the trial's with block", reason="not entered")
        v = self._tracker._commit(message if message is not None else self.message, metadata)
        self.kept = v
        return v

    def __enter__(self) -> "Trial":
        tr = self._tracker
        if tr._trial is not None:
            raise TrialError("trials do not nest", reason="nested trial")
        # The base is HEAD; if the model moved on since the last commit, record it first
        # (copying only the changed chunks) so that a revert has somewhere to go.
        if tr.is_dirty():
            tr._commit(f"{self.message} (base)", {})
        self.base = tr.store.head()
        tr._trial = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        tr = self._tracker
        tr._trial = None
        target = self.kept if self.kept is not None else self.base
        assert target is not None
        tr._apply(target, lambda: tr.store.restore(target))
        return False


class Tracker:
    """History of a model's state_dict and an optimizer's state in a :class:`Store`.

    Names in the store: ``model/<state_dict key>`` and ``optim/<param index>/<key>``.
    ``resume``: put the store's HEAD into the model and optimizer instead of committing
    them (default: when the store's HEAD holds a model, as after ``Store.open``).
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        store: Optional[Store] = None,
        message: str = "track",
        trust_versions: bool = True,
        resume: Optional[bool] = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.store = store if store is not None else Store()
        self.trust_versions = trust_versions
        self._trial: Optional[Trial] = None
        self._synced: Dict[str, int] = {}
        self._synced_head: Optional[Version] = None
        self._extras: Dict[Version, dict] = {}
        self._kinds: Dict[str, Any] = {}
        self._untrusted: set = set()
        head = self.store.head()
        held = head is not None and any(n.startswith("model/") for n in self.store.snapshot(head))
        if resume is None:
            resume = held
        if resume:
            if not held:
                raise TrialError("resume=True but the store has no committed model",
                                 reason="nothing to resume")
            self._apply(head, lambda: self.store.restore(head))
        else:
            self._commit(message, {})

    # ---- the tensors -------------------------------------------------------------------

    def _entries(self) -> Dict[str, Any]:
        """Every tracked tensor by store name; tied tensors appear once."""
        torch = _torch()
        out: Dict[str, Any] = {}
        seen: Dict[Tuple, str] = {}
        params = {p.data_ptr() for p in self.model.parameters()}
        untrusted = set()
        for key, t in self.model.state_dict().items():
            if not isinstance(t, torch.Tensor):
                continue
            if t.data_ptr() not in params:
                # Buffers such as BatchNorm's running statistics are updated inside
                # kernels that do not advance the version counter: always compared.
                untrusted.add("model/" + key)
            if t.numel() > 0:
                ident = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
                if ident in seen:
                    continue
                seen[ident] = key
            out["model/" + key] = t
        if self.optimizer is not None:
            for i, p in enumerate(self._params()):
                st = self.optimizer.state.get(p)
                if not st:
                    continue
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        out[f"optim/{i}/{k}"] = v.detach()
        self._untrusted = untrusted
        return out

    def _params(self) -> list:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _np(self, name: str, t: Any) -> np.ndarray:
        """A writable NumPy view of the tensor's storage (bf16 and bool as bit views)."""
        torch = _torch()
        if t.device.type != "cpu":
            raise TrialError(f"`{name}` is on {t.device}; only CPU tensors are tracked",
                             reason="device")
        self._kinds.setdefault(name, t.dtype)
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
        if t.dtype == torch.bool:
            return t.view(torch.uint8).numpy()
        return t.numpy()

    def _from_np(self, name: str, a: np.ndarray) -> Any:
        """A tensor owning `a`, a fresh C-order copy from the store (for optimizer state
        missing from the live optimizer)."""
        torch = _torch()
        kind = self._kinds.get(name)
        if kind is None and a.dtype.name == "bfloat16":
            kind = torch.bfloat16
        if kind == torch.bfloat16:
            return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
        if kind == torch.bool:
            return torch.from_numpy(a).view(torch.bool)
        return torch.from_numpy(a)

    def _dirty_names(self, entries: Dict[str, Any]) -> list:
        """Names that may differ from HEAD (all of them without trusted version counters)."""
        if not self.trust_versions or self.store.head() != self._synced_head:
            return list(entries)
        synced = self._synced
        untrusted = self._untrusted
        dirty = [n for n, t in entries.items() if n in untrusted or synced.get(n) != t._version]
        dirty += [n for n in synced if n not in entries]
        return dirty

    def _scalars(self) -> dict:
        """Hyper-parameters and non-tensor optimizer state: small, copied per version."""
        if self.optimizer is None:
            return {}
        torch = _torch()
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                  for g in self.optimizer.param_groups]
        state = {}
        for i, p in enumerate(self._params()):
            for k, v in self.optimizer.state.get(p, {}).items():
                if not isinstance(v, torch.Tensor):
                    state[(i, k)] = copy.deepcopy(v)
        return {"groups": groups, "state": state}

    # ---- commits and restores ------------------------------------------------------------

    def _commit(self, message: str, metadata: dict) -> Version:
        entries = self._entries()
        dirty = set(self._dirty_names(entries))
        arrays = {n: self._np(n, entries[n]) for n in dirty if n in entries}
        gone = [n for n in self.store.names() if n not in entries]
        scalars = self._scalars()
        meta = dict(metadata)
        text = _dump_scalars(scalars) if self.optimizer is not None else None
        if text is not None:
            meta[SCALARS_KEY] = text
        self.store.sync(arrays)
        for n in gone:
            self.store.remove(n)
        v = self.store.commit(message, **meta)
        self._extras[v] = scalars
        self._synced = {n: t._version for n, t in entries.items()}
        self._synced_head = v
        return v

    def _apply(self, target: Version, move) -> dict:
        """Move the store with `move()` (to `target`) and write `target` into the model
        and optimizer in place, only chunks that differ."""
        entries = self._entries()
        snap = self.store.snapshot(target)
        names = set(snap.keys())
        missing = [n for n in entries if n.startswith("model/") and n not in names]
        if missing:
            raise TrialError(f"the model has tensors that version {target} lacks: {missing[:5]}",
                             reason="model structure")
        prev = self.store.head()
        dirty = set(self._dirty_names(entries))
        clean_known = prev == self._synced_head and self.trust_versions
        into_dirty = {n: self._np(n, t) for n, t in entries.items() if n in names and n in dirty}
        into_clean = {}
        if prev != target or not clean_known:
            into_clean = {n: self._np(n, t) for n, t in entries.items()
                          if n in names and n not in dirty}
        move()
        written = {}
        if into_clean:
            written.update(self.store.write_into(into_clean, known=prev if clean_known else None))
        if into_dirty:
            written.update(self.store.write_into(into_dirty))
        bumped = [entries[n] for n, s in written.items() if s.chunks_changed > 0]
        # optimizer state that the target lacks, or that the live optimizer lacks
        if self.optimizer is not None:
            params = self._params()
            for n in entries:
                if n.startswith("optim/") and n not in names:
                    _, i, k = n.split("/", 2)
                    st = self.optimizer.state.get(params[int(i)])
                    if st is not None:
                        st.pop(k, None)
                        if not st:
                            del self.optimizer.state[params[int(i)]]
            for n in names:
                if n.startswith("optim/") and n not in entries:
                    _, i, k = n.split("/", 2)
                    self.optimizer.state[params[int(i)]][k] = self._from_np(n, snap[n])
            self._restore_scalars(self._scalars_of(target))
        _increment_version(bumped)
        self._synced = {n: t._version for n, t in self._entries().items()}
        self._synced_head = target
        return written

    def _scalars_of(self, v: Version) -> Optional[dict]:
        """The optimizer scalars of version `v`: kept in memory, or from its metadata
        (versions loaded from a repository)."""
        extras = self._extras.get(v)
        if extras is None:
            text = self.store.metadata(v).get(SCALARS_KEY)
            if isinstance(text, str):
                extras = _load_scalars(text)
                self._extras[v] = extras
        return extras

    def _restore_scalars(self, extras: Optional[dict]) -> None:
        if not extras or self.optimizer is None:
            return
        for g, saved in zip(self.optimizer.param_groups, extras["groups"]):
            for k, v in saved.items():
                g[k] = copy.deepcopy(v)
        torch = _torch()
        params = self._params()
        for i, p in enumerate(params):
            st = self.optimizer.state.get(p)
            if not st:
                continue
            for k in [k for k, v in st.items() if not isinstance(v, torch.Tensor)]:
                if (i, k) not in extras["state"]:
                    del st[k]
            if not st:
                del self.optimizer.state[p]
        for (i, k), v in extras["state"].items():
            self.optimizer.state[params[i]][k] = copy.deepcopy(v)

    def _check_idle(self, what: str) -> None:
        if self._trial is not None:
            raise TrialError(f"{what}() inside a trial; leave the with block first",
                             reason="inside trial")

    # ---- the public calls ------------------------------------------------------------

    def commit(self, message: str = "", **metadata: Any) -> Version:
        """Commit the model and optimizer: compares (or, by version counters, skips)
        each tensor, copies changed chunks only, then an O(1) commit."""
        self._check_idle("commit")
        return self._commit(message, metadata)

    def is_dirty(self) -> bool:
        """Whether the model or optimizer changed since HEAD: by version counters for
        parameters and optimizer state, by comparing bytes for buffers (and for
        everything with ``trust_versions=False``)."""
        if self.store.head() != self._synced_head:
            return True
        entries = self._entries()
        for n in self._dirty_names(entries):
            if n not in entries or n not in self._untrusted and self.trust_versions:
                return True
            if n not in self.store:
                return True
            live = self._np(n, entries[n])
            held = self.store.get(n)
            if live.shape != held.shape or live.tobytes() != held.tobytes():
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
        try:
            self.store.undo()
        except Exception:  # pragma: no cover - undo right after redo cannot fail
            raise
        self._apply(v, self.store.redo)
        return v

    def save(self, path: Union[str, "os.PathLike[str]", None] = None) -> SaveStats:
        """Write the committed versions to the store's repository (or, with `path`, bind
        the store to the repository there first): only chunks it lacks are written.
        Uncommitted changes of the model are not saved: ``commit()`` first. Raises
        ``Conflict`` if another process moved the branch (see :meth:`Store.save`)."""
        self._check_idle("save")
        return self.store.save_as(path) if path is not None else self.store.save()

    def trial(self, message: str = "trial") -> Trial:
        """A ``with`` block whose changes are kept only if ``keep()`` is called."""
        return Trial(self, message)

    def log(self) -> list:
        """The store's log from HEAD (see :meth:`Store.log`)."""
        return self.store.log()

    def stats(self) -> Any:
        """Bytes held against what deep copies of every version would hold."""
        return self.store.stats()

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.names())


def track(model: Any, optimizer: Any = None, *,
          path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Tracker:
    """Start tracking `model` (and `optimizer`) and return a :class:`Tracker`.

    Without `path`: commits their current state in a new in-memory store. With `path`:
    opens (or creates) the repository there; if it holds a history, its HEAD is written
    into the model and optimizer in place (resume), else their state is committed; call
    ``tracker.save()`` to write new versions. Other keyword arguments go to
    :class:`Tracker`."""
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        kwargs["store"] = Store.open(path)
    return Tracker(model, optimizer, **kwargs)
