"""The torch tracker's staged path: tensors on a device (or CPU tensors with
``staged=True``) reach the store through a host staging area, and reverts write back
only the chunks that differ (see ``_device`` for the streams and the staging area).

What moves where:

- **Commit** (``commit()``, ``keep()``, a trial's base): the changed tensors (found as on
  the CPU path: version counters, the fused optimizers' step hook, buffers always) are
  copied device->host into the staging area in batches that fit ``staging_bytes`` (a
  tensor larger than it goes in pieces into a host buffer of its size); the store takes
  each batch once its token completed. With ``copy_in_background=True`` the last batch
  of the tensors only the optimizer writes is not waited for: the store's copy thread
  waits for its token (``Store.commit_later``'s ``ready``) and copies it from the
  staging area while the next forward and backward run, and the optimizer's next step
  waits for that copy (its pre-hook). Buffers are copied before ``keep()`` returns.
- **Revert** (a rejected trial, ``restore``, ``undo``, ``redo``, ``checkout``): a tensor
  known to hold the version the tracker last synced gets only the chunks that differ
  between that version and the target (``Store.diff``'s element ranges), host->device
  through the staging area on the compute stream; a tensor that changed since gets the
  whole target.
- **Device trial base** (``trial_base="device"``): at a trial's entry, device clones of
  the tracked tensors are made (or kept from the last trial, when still current); a
  reject copies the changed tensors back from them device to device, and a commit
  compares each changed tensor with its clone chunk by chunk on the device and copies
  only the changed chunks to the host. Falls back to the host path, with one warning,
  when the tensors do not fit ``device_budget`` bytes.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._tracker import Trial
from . import _device
from ._device import DEFAULT_STAGING_BYTES, Device, device_for, flat_bytes, pack

STAGED_ENV = "TH_TORCH_STAGED"
"""Environment variable: ``1`` makes ``track()`` stage CPU tensors too (the default of
``staged=``)."""

TRIAL_BASES = ("host", "device")


def _torch() -> Any:
    import torch

    return torch


_NP_DTYPES: Dict[Any, np.dtype] = {}


def np_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype the tracker stores a torch dtype as (bf16 as ``ml_dtypes``'
    bfloat16, bool as uint8), as the CPU path's views give it."""
    got = _NP_DTYPES.get(dtype)
    if got is None:
        torch = _torch()
        if dtype == torch.bfloat16:
            import ml_dtypes

            got = np.dtype(ml_dtypes.bfloat16)
        elif dtype == torch.bool:
            got = np.dtype(np.uint8)
        else:
            got = torch.empty(0, dtype=dtype).numpy().dtype
        _NP_DTYPES[dtype] = got
    return got


class DeviceArray:
    """What the tracker's ``_np`` gives for a tensor on the staged path: its shape and
    NumPy dtype without reading it; ``np.asarray`` reads it through the device
    (counted by ``transfers()``)."""

    __slots__ = ("tracker", "name", "tensor", "shape", "dtype")

    def __init__(self, tracker: Any, name: str, tensor: Any) -> None:
        self.tracker = tracker
        self.name = name
        self.tensor = tensor.detach()
        self.shape = tuple(tensor.shape)
        self.dtype = np_dtype(tensor.dtype)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def size(self) -> int:
        return self.tensor.numel()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.tracker._read_host({self.name: self})[self.name]
        return a if dtype is None else a.astype(dtype)


class _Wrote:
    """What a staged write did to one tensor (``WriteStats``' field the tracker reads)."""

    __slots__ = ("chunks_changed",)

    def __init__(self, n: int) -> None:
        self.chunks_changed = n


_INT_OF_WIDTH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(t: Any) -> Any:
    """A flat integer view of contiguous `t` (compared bit for bit: NaN equals NaN)."""
    torch = _torch()
    flat = t.detach().reshape(-1)
    width = flat.element_size()
    return flat.view(getattr(torch, _INT_OF_WIDTH.get(width, "uint8")))


def changed_byte_ranges(t: Any, base: Any, chunk_bytes: int) -> List[Tuple[int, int]]:
    """Byte ranges (merged runs of `chunk_bytes`-byte chunks) where contiguous `t` and
    `base` (same shape and dtype, same device) differ, compared on their device. One
    small device->host read: the indices of the changed chunks."""
    a, b = _bits(t), _bits(base)
    width = a.element_size()
    n = a.numel()
    if n == 0:
        return []
    per = max(1, chunk_bytes // width)
    ne = a.ne(b)
    full = n // per
    flags = []
    if full:
        flags.append(ne[:full * per].view(full, per).any(1))
    if full * per < n:
        flags.append(ne[full * per:].any().reshape(1))
    torch = _torch()
    idx = torch.cat(flags).nonzero().reshape(-1).tolist() if len(flags) > 1 \
        else flags[0].nonzero().reshape(-1).tolist()
    nbytes = n * width
    out: List[Tuple[int, int]] = []
    for i in idx:
        s, e = i * per * width, min((i + 1) * per * width, nbytes)
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class DeviceTrial(Trial):
    """A trial that, with ``trial_base="device"``, keeps its base on the device."""

    def __enter__(self) -> "DeviceTrial":
        super().__enter__()
        try:
            self._tracker._device_base_enter()
        except BaseException:
            self._tracker._trial = None
            self._ended = True
            raise
        return self


class StagedMixin:
    """The staged path of the torch tracker (see the module docs). The tracker class
    lists it before ``tensor_history._tracker.Tracker``."""

    store: Any
    _trial: Any

    def _init_staged(self, staged: Optional[bool], staging_bytes: int, trial_base: str,
                     device_budget: Optional[int]) -> None:
        from .._errors import InvalidArgument

        if staged is None:
            staged = os.environ.get(STAGED_ENV, "") == "1"
        if trial_base not in TRIAL_BASES:
            raise InvalidArgument(f"trial_base must be one of {TRIAL_BASES}, got "
                                  f"{trial_base!r}", reason="trial_base")
        _device.check_staging_bytes(staging_bytes)
        if device_budget is not None and (not isinstance(device_budget, int)
                                          or isinstance(device_budget, bool)
                                          or device_budget < 0):
            raise InvalidArgument(f"device_budget must be a byte count or None, got "
                                  f"{device_budget!r}", reason="device_budget")
        self.staged = bool(staged)
        self.staging_bytes = staging_bytes
        self.trial_base = trial_base
        self.device_budget = device_budget
        self._devices: Dict[Any, Device] = {}
        # name -> the device its tensor was on when the tracker first saw it
        self._where: Dict[str, Any] = {}
        # trial_base="device": name -> clone on the device, holding version
        # `_dbase_version` of that name (None: no clone is current).
        self._dbase: Dict[str, Any] = {}
        self._dbase_version: Any = None
        self._dbase_fresh = False
        self._dbase_warned = False
        # Tokens of device->host copies the last commit left for Store.commit_later.
        self._ready_tokens: List[Any] = []

    # ---- routing ------------------------------------------------------------------

    def _routes(self, t: Any) -> bool:
        """Whether tensor `t` goes through the staged path."""
        return self.staged or t.device.type != "cpu"

    def _device(self, dev: Any) -> Device:
        key = str(dev)
        d = self._devices.get(key)
        if d is None:
            d = self._devices[key] = device_for(dev, self.staging_bytes)
        return d

    def _check_device(self, name: str, t: Any) -> None:
        """``TrialError(reason="device")`` if `name`'s tensor is on another device than
        when the tracker first saw it."""
        from .._errors import TrialError

        was = self._where.get(name)
        if was is None:
            self._where[name] = t.device
        elif str(was) != str(t.device):
            raise TrialError(
                f"`{name}` moved from {was} to {t.device} since the tracker first saw it; "
                "nothing was changed. Track the model again after moving it "
                "(track(model, optimizer) on its new device)", reason="device")

    def transfers(self) -> Dict[str, Any]:
        """Bytes moved through the device path since ``track()``: ``{"staged": bool,
        "to_host_bytes": int, "to_device_bytes": int}`` (``staged``: whether the
        tracker stages any tensor; 0s and False on the plain CPU path). O(devices)."""
        devs = list(self._devices.values())
        return {"staged": self.staged or bool(devs),
                "to_host_bytes": sum(d.to_host_bytes for d in devs),
                "to_device_bytes": sum(d.to_device_bytes for d in devs)}

    def trial(self, message: str = "trial") -> Trial:
        """A ``with`` block whose changes are kept only if ``keep()`` is called (with
        ``trial_base="device"``, its base is kept on the device).

        Args:
            message: the message of the version ``keep()`` commits.

        Returns:
            A :class:`Trial` to enter with ``with``.
        """
        return DeviceTrial(self, message)

    # ---- device -> host --------------------------------------------------------------

    def _settle_staging(self) -> None:
        """A commit in flight may still read a staging area: make it first."""
        if getattr(self, "_bg_pending", None) is not None:
            self._settle()  # type: ignore[attr-defined]

    def _pull(self, items: Dict[str, DeviceArray],
              ranges: Dict[str, List[Tuple[int, int]]], bufs: Dict[str, np.ndarray],
              take: Any,
              deferred: Optional[List[Any]] = None) -> Dict[str, np.ndarray]:
        """Copy byte `ranges` of each item's tensor device->host through its device's
        staging area, batch by batch. After each batch completed, ``take(arrays)`` gets
        the tensors whose bytes are all on the host now, before the staging area is
        reused: a tensor whose bytes arrived in one batch and that has no buffer in
        `bufs` as a view of the staging area, others assembled in their buffer (made
        here when missing). With `deferred`, each device's last batch is returned
        instead, still in its staging area: the caller must let the store copy it
        before that area is used again. A last batch of whole tensors is not even
        waited for: ``(token, names)`` is appended to `deferred`, and the caller must
        wait for the token before the returned arrays are read (``Store.commit_later``'s
        ``ready``) and keep those tensors unwritten until then."""
        last: Dict[str, np.ndarray] = {}
        by_dev: Dict[Any, List[str]] = {}
        empty = {}
        for n, a in items.items():
            if a.nbytes == 0:
                empty[n] = np.empty(a.shape, dtype=a.dtype)
            elif ranges[n]:
                by_dev.setdefault(a.tensor.device, []).append(n)
        if empty:
            take(empty)
        for dev_key, names in by_dev.items():
            dev = self._device(dev_key)
            srcs: Dict[str, Any] = {}
            left: Dict[str, int] = {}
            plan = []
            for n in names:
                t = items[n].tensor
                if not t.is_contiguous():
                    t = t.contiguous()  # a device copy: only contiguous bytes are ranges
                srcs[n] = flat_bytes(t)
                left[n] = sum(e - s for s, e in ranges[n])
                plan.extend((n, s, e) for s, e in ranges[n])
            batches = pack(plan, dev.capacity())
            for i, batch in enumerate(batches):
                area = dev.staging(max(off + e - s for _, s, e, off in batch))
                token = dev.to_host([(srcs[n][s:e], off) for n, s, e, off in batch])
                final = deferred is not None and i == len(batches) - 1
                if (final and all(n not in bufs and s == 0 and e == items[n].nbytes
                                for n, s, e, off in batch)):
                    # Only views of the staging area are made below: the bytes are read
                    # once the token completed (the store's copy waits for it).
                    deferred.append((token, [n for n, _, _, _ in batch]))
                else:
                    token.wait()  # the host reads the staging area only after this
                out: Dict[str, np.ndarray] = {}
                for n, s, e, off in batch:
                    a = items[n]
                    nbytes = a.nbytes
                    if n not in bufs and s == 0 and e == nbytes:
                        out[n] = area[off:off + e].view(a.dtype).reshape(a.shape)
                        continue
                    buf = bufs.get(n)
                    if buf is None:
                        buf = bufs[n] = np.empty(nbytes, dtype=np.uint8)
                    buf[s:e] = area[off:off + e - s]
                    left[n] -= e - s
                    if left[n] == 0:
                        out[n] = buf.view(a.dtype).reshape(a.shape)
                if final:
                    last.update(out)
                elif out:
                    take(out)
        return last

    def _read_host(self, items: Dict[str, DeviceArray]) -> Dict[str, np.ndarray]:
        """Host copies of the items' tensors (read through the staging areas)."""
        self._settle_staging()
        bufs: Dict[str, np.ndarray] = {n: np.empty(a.nbytes, dtype=np.uint8)
                                       for n, a in items.items()}
        ranges = {n: [(0, a.nbytes)] for n, a in items.items()}
        done: Dict[str, np.ndarray] = {}
        self._pull(items, ranges, bufs, done.update)
        return done

    def _sync_changed(self, arrays: Dict[str, Any], untrusted: set,
                      defer: bool) -> Tuple[Dict[str, np.ndarray], List[str]]:
        staged = {n: a for n, a in arrays.items() if isinstance(a, DeviceArray)}
        if not staged:
            # No staged tensor changed: current clones hold the new version too.
            self._dbase_fresh = self._dbase_current()
            return super()._sync_changed(arrays, untrusted, defer)  # type: ignore[misc]
        plain = {n: a for n, a in arrays.items() if n not in staged}
        self._settle_staging()
        store = self.store
        ranges: Dict[str, List[Tuple[int, int]]] = {}
        bufs: Dict[str, np.ndarray] = {}
        compared = self._dbase_current()
        chunk = store.chunk_bytes
        for n, a in staged.items():
            clone = self._dbase.get(n) if compared else None
            if clone is not None and n in store and clone.shape == a.tensor.shape \
                    and clone.dtype == a.tensor.dtype and a.tensor.is_contiguous():
                rs = changed_byte_ranges(a.tensor, clone, chunk)
                if rs:
                    # The store's working state holds what the clone holds: patch it.
                    held = store.get(n)
                    if not (held.flags.c_contiguous and held.flags.writeable):
                        held = np.ascontiguousarray(held).copy()
                    bufs[n] = held.reshape(-1).view(np.uint8)
                ranges[n] = rs
            else:
                ranges[n] = [(0, a.nbytes)] if a.nbytes else []
        # Batch by batch into the store's working state. With `defer`, each device's
        # last batch of tensors only the optimizer writes (their version counters are
        # trusted) is left in its staging area for the commit to copy on another thread,
        # without waiting for its device->host copy (the copy thread waits for it, as
        # the optimizer's next step does through its pre-hook); buffers, which the next
        # forward may write, are all copied now.
        tokens: List[Tuple[Any, List[str]]] = []
        self._pull({n: a for n, a in staged.items() if not defer or n in untrusted},
                   ranges, bufs, store.sync)
        last = self._pull({n: a for n, a in staged.items() if defer and n not in untrusted},
                          ranges, bufs, store.sync, deferred=tokens)
        self._ready_tokens = [token for token, _ in tokens]
        if compared:
            # The clones follow the tensors they compared with (device to device).
            for n, rs in ranges.items():
                clone = self._dbase.get(n)
                if rs and clone is not None and clone.shape == staged[n].tensor.shape:
                    self._device(clone.device).copy(clone, staged[n].tensor)
            self._dbase_fresh = True
        later, watched = super()._sync_changed(plain, untrusted, defer)  # type: ignore[misc]
        later.update(last)
        # Tensors whose bytes may still be in flight must not be written until the copy
        # ended: checked by their version counters, as on the CPU path.
        for _, names in tokens:
            watched.extend(names)
        return later, watched

    def _ready(self) -> Any:
        """``Store.commit_later``'s ``ready``: waits for the device->host copies the last
        commit left in flight (``None`` when there are none)."""
        tokens, self._ready_tokens = self._ready_tokens, []
        if not tokens:
            return None

        def ready() -> None:
            for t in tokens:
                t.wait()
        return ready

    # ---- host -> device --------------------------------------------------------------

    def _write(self, into: dict, known: Any, written: dict, mismatched: list,
               entries: Dict[str, Any]) -> None:
        staged = {n: a for n, a in into.items() if isinstance(a, DeviceArray)}
        plain = {n: a for n, a in into.items() if n not in staged}
        if plain:
            super()._write(plain, known, written, mismatched, entries)  # type: ignore[misc]
        if staged:
            self._write_staged(staged, known, written, mismatched)

    def _write_staged(self, items: Dict[str, DeviceArray], known: Any, written: dict,
                      mismatched: list) -> None:
        """Write the store's working state (the target, HEAD after the move) into the
        items' tensors: from the device base when it holds the target, else host->device
        only the element ranges that differ from `known` (every element without it)."""
        from .._tracker import _dtype_name

        self._settle_staging()
        store = self.store
        head = store.head()
        diff = None
        if known is not None and known != head:
            diff = store.diff(known, head)
        use_base = self._dbase_version is not None and self._dbase_version == head
        ranges: Dict[str, List[Tuple[int, int]]] = {}
        partial: set = set()  # names whose ranges are the chunks known to differ
        for n, a in items.items():
            dtype, shape = store.info(n)
            if tuple(shape) != a.shape or dtype != _dtype_name(a.dtype):
                mismatched.append(n)
                continue
            clone = self._dbase.get(n) if use_base else None
            if clone is not None and clone.shape == a.tensor.shape \
                    and clone.dtype == a.tensor.dtype:
                dev = self._device(clone.device)
                same = a.nbytes == 0 or bool(_bits(a.tensor.contiguous()).equal(_bits(clone)))
                if not same:
                    dev.copy(a.tensor, clone)
                written[n] = _Wrote(0 if same else 1)
                continue
            width = a.dtype.itemsize
            if known is None:
                rs = [(0, a.nbytes)]
            elif known == head:
                rs = []
            else:
                ch = diff.get(n) if diff is not None else None
                if ch is None or ch.kind == "unchanged":
                    rs = []
                elif ch.kind == "changed" and not ch.layout_changed:
                    rs = [(s * width, e * width) for s, e in ch.elements]
                    partial.add(n)
                else:
                    rs = [(0, a.nbytes)]
            rs = [(s, e) for s, e in rs if e > s]
            if rs:
                ranges[n] = rs
            written[n] = _Wrote(len(rs))
        if use_base:
            self._dbase_fresh = True
        if ranges:
            self._push({n: items[n] for n in ranges}, ranges, partial & ranges.keys(), known)

    def _push(self, items: Dict[str, DeviceArray], ranges: Dict[str, List[Tuple[int, int]]],
              partial: set, known: Any) -> None:
        """Copy byte `ranges` of the store's working state into the items' tensors,
        host->device through the staging areas, on the compute streams. For the
        `partial` names (ranges: the chunks that differ from version `known`) only those
        chunks are read from the store, into a scratch buffer: ``write_into`` with
        `known` skips the chunks the versions share, without reading or writing them."""
        hosts: Dict[str, np.ndarray] = {}
        if partial:
            scratch = {n: np.empty(items[n].shape, dtype=items[n].dtype) for n in partial}
            self.store.write_into(scratch, known=known)
            hosts = {n: a.reshape(-1).view(np.uint8) for n, a in scratch.items()}
        by_dev: Dict[Any, List[str]] = {}
        for n, a in items.items():
            by_dev.setdefault(a.tensor.device, []).append(n)
        for dev_key, names in by_dev.items():
            dev = self._device(dev_key)
            dsts: Dict[str, Any] = {}
            temps = []
            plan = []
            for n in names:
                t = items[n].tensor
                if not t.is_contiguous():
                    tmp = t.contiguous()  # patched on the device, then copied back
                    temps.append((t, tmp))
                    t = tmp
                dsts[n] = flat_bytes(t)
                if n not in hosts:
                    hosts[n] = np.ascontiguousarray(self.store.get(n)).reshape(-1).view(np.uint8)
                plan.extend((n, s, e) for s, e in ranges[n])
            for batch in pack(plan, dev.capacity()):
                area = dev.staging(max(off + e - s for _, s, e, off in batch))
                for n, s, e, off in batch:
                    area[off:off + e - s] = hosts[n][s:e]
                dev.to_device([(dsts[n][s:e], off) for n, s, e, off in batch])
            for t, tmp in temps:
                with _torch().no_grad():
                    t.copy_(tmp)

    def _new_on_device(self, name: str, t: Any, fallback: Any) -> Any:
        """CPU tensor `t` (optimizer state made from the store) on the device `name` was
        on (else `fallback`'s), counted as moved to the device."""
        dev = self._where.get(name, getattr(fallback, "device", None))
        if dev is None or str(dev) == str(t.device):
            return t
        out = t.to(dev)
        self._device(dev).to_device_bytes += t.numel() * t.element_size()
        return out

    # ---- the device trial base -------------------------------------------------------

    def _dbase_current(self) -> bool:
        """Whether the clones hold the version the tensors were last synced to, which is
        the store's HEAD."""
        v = self._dbase_version
        return (v is not None and v == getattr(self, "_synced_head", None)
                and v == self._head())  # type: ignore[attr-defined]

    def _synced_now(self) -> None:
        super()._synced_now()  # type: ignore[misc]
        head = self._synced_head  # type: ignore[attr-defined]
        if self._dbase_fresh:
            self._dbase_version = head
        elif self._dbase_version != head:
            self._dbase_version = None  # the tensors moved to a version the clones lack
        self._dbase_fresh = False

    def _device_base_enter(self) -> None:
        """At a trial's entry (its base just synced): make the device clones current."""
        if self.trial_base != "device":
            return
        entries, _, _ = self._live()  # type: ignore[attr-defined]
        routed = {n: t for n, t in entries.items() if self._routes(t)}
        total = sum(t.numel() * t.element_size() for t in routed.values())
        if self.device_budget is not None and total > self.device_budget:
            if not self._dbase_warned:
                self._dbase_warned = True
                warnings.warn(
                    f"trial_base='device': the tracked tensors ({total} bytes) do not fit "
                    f"device_budget={self.device_budget}; trials keep their base on the "
                    "host instead", RuntimeWarning, stacklevel=3)
            self._dbase = {}
            self._dbase_version = None
            return
        current = self._dbase_current()
        fresh: Dict[str, Any] = {}
        for n, t in routed.items():
            c = self._dbase.get(n)
            if c is not None and current and c.shape == t.shape and c.dtype == t.dtype \
                    and c.device == t.device:
                fresh[n] = c  # holds this version already (kept up by commits)
            elif c is not None and c.shape == t.shape and c.dtype == t.dtype \
                    and c.device == t.device:
                self._device(t.device).copy(c, t)
                fresh[n] = c
            else:
                fresh[n] = self._device(t.device).clone(t)
        self._dbase = fresh
        self._dbase_version = self._synced_head  # type: ignore[attr-defined]


__all__ = ["DEFAULT_STAGING_BYTES", "DeviceArray", "DeviceTrial", "STAGED_ENV",
           "StagedMixin", "changed_byte_ranges", "np_dtype"]
