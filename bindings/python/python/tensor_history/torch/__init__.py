"""Version history for a PyTorch model and optimizer, restored in place.

>>> tracker = tensor_history.torch.track(model, optimizer)   # commits the current state
>>> with tracker.trial("lr probe") as t:                     # copies nothing on entry
...     loss = train_step()
...     if loss < best:
...         t.keep()                                          # commits changed chunks only
>>> # left without keep() (or on an exception): parameters, buffers and optimizer state
>>> # are put back in place, only the chunks that differ are written.
>>> tracker.undo()                                            # back one kept step

The framework-neutral logic (trials, commits, restores, save) is in
``tensor_history._tracker``; this module adds what is torch's. How it works, and what
to know:

- The tracker reads and writes the tensors' own storage through NumPy views of
  ``model.state_dict()`` (which shares storage with the parameters) and of the
  optimizer's ``state``; ``Parameter`` objects keep their identity, so optimizer
  references stay valid. bfloat16 tensors go through ``t.view(torch.uint16)`` views.
- Parameters and optimizer state untouched since the last sync are found without
  reading them: a tensor is taken as unchanged when it is the same storage (data
  pointer; the tracker holds the tensors it synced, so their memory cannot be reused by
  a new tensor), shape, strides and dtype with the same in-place version counter
  (``tensor._version``, which every in-place torch op advances). A tensor replaced by a
  new one (``model[1] = nn.Linear(...)``, a new ``momentum_buffer``, LBFGS's new
  ``H_diag``) is therefore compared and recorded. Fused optimizers (``fused=True``)
  update parameters and state without advancing the counters: every parameter that had a
  gradient at an optimizer step (seen by a step post-hook the tracker registers) and its
  state are compared at the next sync. Buffers are always compared: BatchNorm's running
  statistics, for one, are updated inside a kernel that leaves the counter alone.
  Writes that bypass torch (through ``.numpy()`` views or ``.data`` of another tensor
  sharing the storage) do not advance it: pass ``trust_versions=False`` to compare every
  tensor's bytes instead.
- Every tensor the tracker writes gets its version counter advanced, as torch's own
  in-place ``copy_`` would: a ``backward()`` through a graph built before a restore that
  saved a restored tensor raises torch's "modified by an inplace operation" error instead
  of computing silently wrong gradients. ``.grad`` fields are not part of the state and
  are left as they are (call ``optimizer.zero_grad()`` as usual).
- ``track(..., copy_in_background=True)``: a commit or ``keep()`` copies the parameters
  and optimizer state on another thread (``Store.commit_later``) and returns at once,
  with the version it will be; the copy runs while the next forward and backward read
  the weights, and the optimizer's ``step()`` (a step pre-hook) waits for it, as does
  any call on the tracker or its store. Buffers are copied at once (kernels update
  BatchNorm's statistics without moving version counters). Only the optimizer may write
  the tracked tensors until its next step: a tensor written in place meanwhile (seen by
  its version counter when the copy is checked) makes that step, or the next tracker
  call, raise ``TrialError(reason="changed while copied")``; that version is then not
  made and the trial goes back to what it kept before. Pointing a tensor at other
  memory (``p.data = x``) is fine: the memory being copied is kept alive. Resizing a
  tracked tensor or writing it through a ``.numpy()`` view in that window is not
  detected: don't. (The
  commit ``track()`` makes, a trial's base commit, and every commit with
  ``trust_versions=False`` copy at once.)
- Tied weights (several state_dict names over the same storage) are stored once.
- Dense (strided) tensors only: others raise ``TrialError(reason="layout")``. Tensors
  on a device (CUDA, or any accelerator with torch's generic streams and events) go
  through the staged path of ``tensor_history.torch._staged``: changed tensors are
  copied device->host through a pinned staging area of ``staging_bytes`` per device,
  reverts write back host->device only the chunks that differ, and
  ``trial_base="device"`` keeps a trial's base on the device (within
  ``device_budget`` bytes). ``staged=True`` (or ``TH_TORCH_STAGED=1`` in the
  environment) sends CPU tensors the same way; ``tracker.transfers()`` counts the
  bytes moved. A tensor found on another device than when the tracker first saw it
  raises ``TrialError(reason="device")`` and changes nothing: track the model again
  after moving it. Optimizer state that appears (first ``step()``) or disappears between
  versions is created or removed; ``param_groups`` hyper-parameters (learning rates, ...)
  are restored too.
- A trial's base is the state at its entry: a change made between two trials (a
  learning rate halved after a rejected step, new weights) is committed as
  ``"<message> (base)"`` when the next trial starts, so its revert keeps it.
- A revert that meets a tensor it cannot put back (a buffer registered during the trial,
  a parameter replaced by one of another shape) puts back everything else, then raises
  ``TrialError(reason="model structure")``; the tensors it names stay as they are and
  are recorded by the next commit.
- Commit metadata: bool, int, float and str values; one-element tensors and NumPy
  scalars are taken by value (``keep(loss=loss)``).
- Saving and resuming: ``track(model, optimizer, path="runs/exp1")`` opens (or creates)
  the repository there; if it holds a history, its HEAD is put back into the model and
  optimizer in place. ``tracker.save()`` writes the committed versions (only chunks the
  repository lacks). Variables of the store outside ``model/`` and ``optim/`` (your
  own) are kept by every commit. ``param_groups`` values and non-tensor optimizer state
  travel as JSON in each version's metadata under ``"_torch.scalars"`` (hidden from
  ``graph()``, which shows the metadata you give; versions saved with the older key
  ``"torch.scalars"`` are read too) (None, bool, int, float,
  str, lists, tuples, dicts and small tensors; a version with other values keeps them
  in memory only, and restoring it after a reopen leaves ``param_groups`` as they are).

torch is imported on first use; nothing here needs it at import time.
"""

from __future__ import annotations

import copy
import os
import weakref
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from .._core import Store
from .._errors import TrialError
from .._tracker import (AUTO_BUDGET, DEFAULT_BUDGET_MODELS, DEFAULT_BUDGET_STATES, NotJson, Trial,
                        default_budget, tracker_store)
from .._tracker import Tracker as _Tracker
from ._device import DEFAULT_STAGING_BYTES
from ._staged import STAGED_ENV, DeviceArray, StagedMixin

__all__ = ["DEFAULT_BUDGET_MODELS", "DEFAULT_BUDGET_STATES", "DEFAULT_STAGING_BYTES",
           "STAGED_ENV", "Tracker", "Trial", "default_memory_budget", "track"]


def _torch() -> Any:
    import torch

    return torch


_deepcopy = copy.deepcopy


def _same_object(v: Any) -> Any:
    return v


SCALARS_KEY = "_torch.scalars"
"""Metadata key of the optimizer's hyper-parameters and non-tensor state (JSON)."""

def model_bytes(model: Any) -> int:
    """The bytes of `model`'s state_dict tensors (what the default memory budget is
    computed from; see ``DEFAULT_BUDGET_STATES``)."""
    total = 0
    for v in model.state_dict().values():
        try:
            n = getattr(v, "nbytes", None)
        except RuntimeError:
            # A layout without plain storage (sparse, say): the tracker refuses it with
            # TrialError(reason="layout") when it first reads the state.
            continue
        if n is None and hasattr(v, "numel") and hasattr(v, "element_size"):
            n = v.numel() * v.element_size()
        total += int(n or 0)
    return total


def default_memory_budget(model: Any) -> Optional[int]:
    """The memory budget a tracker of `model` gets by default: ``DEFAULT_BUDGET_MODELS``
    times its state_dict's bytes (``None``, no budget, for a model without tensors)."""
    return default_budget(model_bytes(model))


class Tracker(StagedMixin, _Tracker):
    """History of a model's state_dict and an optimizer's state in a :class:`Store`.

    Names in the store: ``model/<state_dict key>`` and ``optim/<param index>/<key>``;
    other names are left alone. Usually made by :func:`track`.

    Args:
        model: the ``torch.nn.Module`` whose ``state_dict()`` is tracked.
        optimizer: a ``torch.optim.Optimizer`` whose state and hyper-parameters are
            tracked too (``None``: the model only).
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        trust_versions: skip, without comparing, tensors whose identity token (version
            counter, buffer) is unchanged since the last sync (default); ``False``
            compares every tensor's bytes.
        resume: put the store's HEAD into the model and optimizer instead of committing
            (default: when HEAD holds a model, as after ``Store.open``).
        copy_in_background: make ``keep()`` and ``commit()`` return at once and copy
            the changed tensors on another thread; the optimizer's next ``step()``
            waits for the copy (needs an optimizer).
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.
        staging_bytes: the most bytes of each device's host staging area (pinned on a
            GPU); a larger commit goes in batches, a larger tensor in pieces.
        trial_base: ``"host"`` (default) keeps a trial's base in the store; ``"device"``
            keeps it as device clones, so a rejected trial is copied back device to
            device.
        device_budget: the most bytes of device clones ``trial_base="device"`` may hold
            (``None``: no limit); over it, trials use the host, with one warning.
        staged: send CPU tensors through the staged device path too (default: the
            environment variable ``TH_TORCH_STAGED`` is ``1``). Tensors on a device
            always take it (see ``docs/gpus.md``); :meth:`transfers` counts the bytes
            moved.

    Raises:
        TrialError: ``resume=True`` and the store holds no model.
        TypeError: ``memory_budget`` together with ``store``.
        TypeError: ``copy_in_background=True`` without an optimizer.
        InvalidArgument: a bad ``staging_bytes``, ``trial_base`` or ``device_budget``
            (raised before anything is tracked).
    """

    SCALARS_KEY = SCALARS_KEY
    LEGACY_SCALARS_KEYS = ("torch.scalars",)

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        store: Optional[Store] = None,
        message: str = "track",
        trust_versions: bool = True,
        resume: Optional[bool] = None,
        copy_in_background: bool = False,
        memory_budget: Any = AUTO_BUDGET,
        staged: Optional[bool] = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        trial_base: str = "host",
        device_budget: Optional[int] = None,
    ) -> None:
        self._init_staged(staged, staging_bytes, trial_base, device_budget)
        if copy_in_background and getattr(optimizer, "register_step_pre_hook", None) is None:
            raise TypeError("copy_in_background=True needs an optimizer (its step() waits "
                            "for the copy)")
        self.model = model
        self.optimizer = optimizer
        self._kinds: Dict[str, Any] = {}
        # Indices (into the optimizer's parameters) of the parameters an optimizer step
        # may have changed since the last sync, without advancing version counters.
        self._stepped: set = set()
        self._hook = None
        register = getattr(optimizer, "register_step_post_hook", None)
        if register is not None:
            # A weak reference: the optimizer does not keep the tracker alive.
            method = weakref.WeakMethod(self._after_step)

            def hook(opt: Any, args: Any, kwargs: Any) -> None:
                m = method()
                if m is not None:
                    m(opt, args, kwargs)

            self._hook = register(hook)
        self._pre_hook = None
        if copy_in_background:
            settle = weakref.WeakMethod(self._settle)

            def pre_hook(opt: Any, args: Any, kwargs: Any) -> None:
                m = settle()
                if m is not None:
                    m()

            self._pre_hook = optimizer.register_step_pre_hook(pre_hook)
        super().__init__(store=store, message=message, trust_versions=trust_versions,
                         resume=resume, copy_in_background=copy_in_background,
                         memory_budget=memory_budget)

    def _model_bytes(self) -> int:
        return model_bytes(self.model)

    # ---- the tensors -------------------------------------------------------------------

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for i, p in enumerate(self._params()):
            if getattr(p, "grad", None) is not None:
                self._stepped.add(i)

    def _synced_now(self) -> None:
        self._stepped = set()
        super()._synced_now()

    def _forced_dirty(self, entries: Dict[str, Any]) -> set:
        if not self._stepped:
            return set()
        params = self._params()
        ptrs = {params[i].data_ptr() for i in self._stepped}
        out = set()
        for n, t in entries.items():
            if n.startswith("optim/"):
                if int(n.split("/", 2)[1]) in self._stepped:
                    out.add(n)
            elif t.data_ptr() in ptrs:
                out.add(n)
        return out

    def _live(self) -> Tuple[Dict[str, Any], Dict[str, Any], set]:
        """Every tracked tensor by store name (tied tensors once), their identity tokens,
        and the names that are always compared (buffers)."""
        torch = _torch()
        tensor_type = torch.Tensor
        out: Dict[str, Any] = {}
        tokens: Dict[str, Any] = {}
        seen: Dict[int, list] = {}
        params = {id(p) for p in self.model.parameters()}
        untrusted = set()
        get_synced = self._synced.get
        check = self._check
        token_of = self._token

        def token(name: str, t: Any) -> Any:
            try:
                tok = token_of(t)
            except RuntimeError:
                check(name, t)
                raise
            if get_synced(name) != tok:
                check(name, t)
            return tok

        # A tensor whose token matches the last sync's was checked then (device and
        # layout cannot change without a new storage); others are checked here, before
        # `data_ptr()`, which sparse tensors do not have.
        for key, t in self.model.state_dict(keep_vars=True).items():
            if not isinstance(t, tensor_type):
                continue
            name = "model/" + key
            tok = token(name, t)
            if id(t) not in params:
                # Buffers such as BatchNorm's running statistics are updated inside
                # kernels that do not advance the version counter: always compared.
                untrusted.add(name)
            ptr = tok[1]
            if ptr:  # tied tensors: the same storage, layout and dtype under two names
                ident = tok[1:]
                same = seen.get(ptr)
                if same is None:
                    seen[ptr] = [ident]
                elif ident in same:
                    continue
                else:
                    same.append(ident)
            out[name] = t
            tokens[name] = tok
        if self.optimizer is not None:
            state = self.optimizer.state
            for i, p in enumerate(self._params()):
                st = state.get(p)
                if not st:
                    continue
                prefix = f"optim/{i}/"
                for k, v in st.items():
                    if isinstance(v, tensor_type):
                        name = prefix + k
                        tokens[name] = token(name, v)
                        out[name] = v
        return out, tokens, untrusted

    def _token(self, t: Any) -> Any:
        return (t._version, t.data_ptr(), t.shape, t.stride(), t.dtype)

    def _memory_of(self, t: Any) -> Any:
        return t.untyped_storage()

    def _written_over(self, old: Any, new: Any) -> bool:
        # A tensor pointed at other memory (`p.data = x`, `set_`) left the memory being
        # copied alone (it is kept alive); the same memory with another version counter,
        # shape or strides may have been written.
        return new[1] == old[1] and new != old

    def _check(self, name: str, t: Any) -> None:
        layout = getattr(t, "layout", None)
        if layout is not None and layout != _torch().strided:
            raise TrialError(f"`{name}` has layout {layout}; only dense (strided) tensors "
                             "are tracked", reason="layout")
        self._check_device(name, t)

    def _params(self) -> list:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _np(self, name: str, t: Any) -> Any:
        """A writable NumPy view of the tensor's storage (bf16 and bool as bit views), or
        for a tensor on the staged path a :class:`DeviceArray` (shape and dtype; its
        bytes move through the device's staging area)."""
        torch = _torch()
        self._check(name, t)
        t = t.detach()
        self._kinds.setdefault(name, t.dtype)
        if self._routes(t):
            return DeviceArray(self, name, t)
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

    def _split(self, name: str) -> Tuple[Any, str]:
        _, i, k = name.split("/", 2)
        return self._params()[int(i)], k

    def _set_state(self, name: str, t: Any) -> None:
        p, k = self._split(name)
        self.optimizer.state[p][k] = self._new_on_device(name, t, p)

    def _drop_state(self, name: str) -> None:
        p, k = self._split(name)
        st = self.optimizer.state.get(p)
        if st is not None:
            st.pop(k, None)
            if not st:
                del self.optimizer.state[p]

    def _written(self, tensors: list) -> None:
        if not tensors:
            return
        bump = _torch().autograd.graph.increment_version
        for t in tensors:
            bump(t)

    # ---- hyper-parameters ------------------------------------------------------------

    def _scalars(self, copy: bool = True) -> Optional[dict]:
        """Hyper-parameters and non-tensor optimizer state: small, copied per version."""
        if self.optimizer is None:
            return None
        tensor_type = _torch().Tensor
        dup = _deepcopy if copy else _same_object
        groups = [{k: dup(v) for k, v in g.items() if k != "params"}
                  for g in self.optimizer.param_groups]
        state = {}
        get = self.optimizer.state.get
        for i, p in enumerate(self._params()):
            st = get(p)
            if st:
                for k, v in st.items():
                    if not isinstance(v, tensor_type):
                        state[(i, k)] = dup(v)
        return {"groups": groups, "state": state}

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

    def _encode_tensor(self, v: Any) -> Any:
        torch = _torch()
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel() <= 64:
            return {"tensor": v.detach().tolist(), "dtype": str(v.dtype).removeprefix("torch."),
                    "shape": list(v.shape)}
        raise NotJson(type(v).__name__)

    def _decode_tensor(self, d: dict) -> Any:
        torch = _torch()
        return torch.tensor(d["tensor"], dtype=getattr(torch, d["dtype"])).reshape(d["shape"])

    def _same_tensor(self, a: Any, b: Any) -> bool:
        torch = _torch()
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
        return a is b

    def _plain(self, key: str, v: Any) -> Any:
        torch = _torch()
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise TypeError(f"metadata `{key}` is a tensor of {v.numel()} elements; "
                                "give a bool, int, float or str (or a one-element tensor)")
            return v.detach().item()
        return v


def track(model: Any, optimizer: Any = None, *,
          path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Tracker:
    """Start tracking `model` (and `optimizer`) and return a :class:`Tracker`.

    Without `path`: commits their current state in a new in-memory store. With `path`:
    opens (or creates) the repository there; if it holds a history, its HEAD is written
    into the model and optimizer in place (resume), else their state is committed; call
    ``tracker.save()`` to write new versions. The store gets a memory budget of
    ``DEFAULT_BUDGET_STATES`` (4) tracked states (the model's state_dict and the
    optimizer's state; it follows the state as the optimizer's appears), or
    ``memory_budget`` bytes (``None``: none; or pass ``store=``): a dense loop that keeps
    every step holds at most that many states, the oldest versions going (saved to the
    repository with `path`, else dropped unless a branch or tag holds them). Variables
    of the repository outside ``model/`` and ``optim/`` are kept. Other keyword
    arguments go to :class:`Tracker`. Raises ``CorruptObject`` when the repository's
    HEAD does not read (see ``tracker_store``)."""
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        budget = kwargs.pop("memory_budget", AUTO_BUDGET)
        kwargs["store"] = tracker_store(path, model_bytes(model), budget)
    return Tracker(model, optimizer, **kwargs)
