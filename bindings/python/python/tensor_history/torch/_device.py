"""Moving tensor bytes between a device and the host for the torch tracker's staged path.

A :class:`Device` owns one host **staging area** (pinned memory for an accelerator),
allocated when first needed and reused by every copy after: it grows to the largest
batch asked for, never past ``staging_bytes``. The tracker packs what a commit copies
into batches that fit (a tensor larger than the area is split over several batches).

Ordering, as ``torch.distributed.checkpoint``'s staging does it (``DefaultStager``:
a side stream and non-blocking copies into pinned memory), plus an event so that a copy
never reads memory the compute stream is still writing:

- :meth:`Device.to_host` records an event on the compute stream (the tensor's device's
  current stream), makes a **side stream** wait for it, queues the device->host copies
  there (``copy_(non_blocking=True)`` into pinned memory) and returns a :class:`Token`
  that completes when they did. The host reads the staging area only after
  ``token.wait()`` (which waits for that event alone, not for the device).
- :meth:`Device.to_device` queues host->device copies from the staging area **on the
  compute stream**, so the kernels queued after see the bytes; its token says when the
  staging area may be written again.
- The staging area is written only after the previous batch's token completed
  (:meth:`Device.staging` waits for it).

Two implementations run the same logic. :class:`AcceleratorDevice` uses torch's
device-generic ``torch.Stream`` / ``torch.Event`` and pinned memory
(``torch.empty(..., pin_memory=True)``): CUDA, and any accelerator torch gives the same
calls (XPU, MPS). :class:`CpuDevice` stands for a device with CPU tensors: its side
stream is a worker thread that runs copies in order, after an optional latency, so that
its tokens really complete later and a host read that does not wait for one reads stale
bytes (tests set :data:`CPU_LATENCY_S`). Nothing here calls ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["AcceleratorDevice", "CpuDevice", "DEFAULT_STAGING_BYTES", "Device", "Token",
           "device_for"]

#: Default ``staging_bytes``: the most host (pinned) memory one device's staging area
#: takes.
DEFAULT_STAGING_BYTES = 256 << 20

#: Seconds a :class:`CpuDevice` copy waits on its worker before it runs (tests raise it
#: so that a missing wait shows up as wrong bytes).
CPU_LATENCY_S = 0.0

#: Offsets in the staging area are multiples of this (alignment of every dtype).
ALIGN = 64


def _torch() -> Any:
    import torch

    return torch


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Token:
    """Completion of a batch of copies queued by :meth:`Device.to_host` or
    :meth:`Device.to_device`."""

    def done(self) -> bool:
        """Whether the copies completed (never blocks)."""
        raise NotImplementedError

    def wait(self) -> None:
        """Block the host until the copies completed (raises their error, if any)."""
        raise NotImplementedError


class _Done(Token):
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


DONE: Token = _Done()


class _EventToken(Token):
    """An accelerator event recorded after the copies; the tensors they read or write
    are held until it completed."""

    def __init__(self, event: Any, keep: Any) -> None:
        self._event = event
        self._keep = keep

    def done(self) -> bool:
        if self._keep is None:
            return True
        if self._event.query():
            self._keep = None
            return True
        return False

    def wait(self) -> None:
        if self._keep is not None:
            self._event.synchronize()
            self._keep = None


class _ThreadToken(Token):
    def __init__(self) -> None:
        self._event = threading.Event()
        self._error: Optional[BaseException] = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self) -> None:
        self._event.wait()
        if self._error is not None:
            raise self._error


class _Worker:
    """A FIFO of jobs on one daemon thread: the CPU device's side stream."""

    def __init__(self) -> None:
        self._q: "queue.SimpleQueue[Tuple[Callable[[], None], _ThreadToken]]" = \
            queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> Token:
        token = _ThreadToken()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="th-cpu-stream",
                                                daemon=True)
                self._thread.start()
        self._q.put((job, token))
        return token

    def _run(self) -> None:
        while True:
            job, token = self._q.get()
            try:
                if CPU_LATENCY_S:
                    time.sleep(CPU_LATENCY_S)
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                token._error = e
            token._event.set()


_WORKER = _Worker()


def check_staging_bytes(staging_bytes: Any) -> None:
    """``InvalidArgument`` unless `staging_bytes` is an int of at least :data:`ALIGN`."""
    if not isinstance(staging_bytes, int) or isinstance(staging_bytes, bool) \
            or staging_bytes < ALIGN:
        from .._errors import InvalidArgument

        raise InvalidArgument(f"staging_bytes must be an int >= {ALIGN}, got "
                              f"{staging_bytes!r}", reason="staging_bytes")


class Device:
    """One device's staging area, streams and transfer counts (see the module docs).

    `device` is the ``torch.device`` whose tensors this moves; `staging_bytes` bounds
    the staging area. ``to_host_bytes`` and ``to_device_bytes`` count what moved through
    it; ``device_copy_bytes`` what :meth:`copy` moved within the device."""

    def __init__(self, device: Any, staging_bytes: int) -> None:
        check_staging_bytes(staging_bytes)
        self.device = device
        self.staging_bytes = staging_bytes
        self._area: Any = None  # a uint8 host tensor
        self._area_np: Optional[np.ndarray] = None
        self._busy: Token = DONE
        self.to_host_bytes = 0
        self.to_device_bytes = 0
        self.device_copy_bytes = 0
        self.allocations = 0

    # ---- what an implementation supplies ------------------------------------------

    def _allocate(self, nbytes: int) -> Any:
        raise NotImplementedError

    def _queue_to_host(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        """Queue `(src device uint8, dst staging uint8)` copies after the compute
        stream's work so far."""
        raise NotImplementedError

    def _queue_to_device(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        """Queue `(src staging uint8, dst device uint8)` copies on the compute stream."""
        raise NotImplementedError

    # ---- the staging area ---------------------------------------------------------

    def capacity(self) -> int:
        return self.staging_bytes

    def staging(self, nbytes: int) -> np.ndarray:
        """The staging area as host bytes, at least `nbytes` (<= ``staging_bytes``) long,
        once the copies that used it before completed. Allocated on first use and when
        a larger batch than before comes (at most ``staging_bytes``)."""
        if nbytes > self.staging_bytes:
            from .._errors import InternalError

            raise InternalError(f"a batch of {nbytes} bytes does not fit staging_bytes="
                                f"{self.staging_bytes}", reason="staging batch")
        self._busy.wait()
        self._busy = DONE
        if self._area is None or self._area.numel() < nbytes:
            self._area = None
            self._area_np = None
            self._area = self._allocate(max(nbytes, ALIGN))
            self._area_np = self._area.numpy()
            self.allocations += 1
        assert self._area_np is not None
        return self._area_np

    def to_host(self, copies: Sequence[Tuple[Any, int]]) -> Token:
        """Copy each `(src, offset)` (a flat uint8 view of device memory) into the
        staging area at `offset`, after the work queued so far on the compute stream,
        on the side stream. Call :meth:`staging` first (for the area's size)."""
        area = self._area
        pairs = [(src, area[off:off + src.numel()]) for src, off in copies]
        token = self._queue_to_host(pairs)
        self.to_host_bytes += sum(src.numel() for src, _ in copies)
        self._busy = token
        return token

    def to_device(self, copies: Sequence[Tuple[Any, int]]) -> Token:
        """Copy each `(dst, offset)`: the staging area's bytes at `offset` into `dst` (a
        flat uint8 view of device memory), on the compute stream."""
        area = self._area
        pairs = [(area[off:off + dst.numel()], dst) for dst, off in copies]
        token = self._queue_to_device(pairs)
        self.to_device_bytes += sum(dst.numel() for dst, _ in copies)
        self._busy = token
        return token

    def copy(self, dst: Any, src: Any) -> None:
        """``dst.copy_(src)`` within the device, on the compute stream."""
        with _torch().no_grad():
            dst.copy_(src)
        self.device_copy_bytes += dst.numel() * dst.element_size()

    def clone(self, t: Any) -> Any:
        """A copy of `t` on the device (the trial base)."""
        with _torch().no_grad():
            c = t.detach().clone(memory_format=_torch().contiguous_format)
        self.device_copy_bytes += c.numel() * c.element_size()
        return c


class AcceleratorDevice(Device):
    """A CUDA (or other torch accelerator) device: pinned staging, a side stream for
    device->host copies ordered after the compute stream by an event, host->device
    copies on the compute stream."""

    def __init__(self, device: Any, staging_bytes: int) -> None:
        super().__init__(device, staging_bytes)
        self._side: Any = None

    def _compute(self) -> Any:
        return _torch().accelerator.current_stream(self.device)

    def _allocate(self, nbytes: int) -> Any:
        torch = _torch()
        # Pinned for the accelerator: non_blocking copies from and into it are truly
        # asynchronous (a pageable buffer would make them synchronous).
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _queue_to_host(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        torch = _torch()
        if self._side is None:
            # Made on the caller's thread after the compute stream exists, as
            # DefaultStager does, so it is never the compute stream itself.
            self._side = torch.Stream(device=self.device)
        compute = self._compute()
        ready = torch.Event(device=self.device)
        ready.record(compute)
        self._side.wait_event(ready)
        with self._side:
            for src, dst in copies:
                dst.copy_(src, non_blocking=True)
        done = torch.Event(device=self.device)
        done.record(self._side)
        # The sources stay referenced until `done`: their memory cannot be handed to
        # another tensor by the caching allocator while the side stream reads it.
        return _EventToken(done, [s for s, _ in copies])

    def _queue_to_device(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        torch = _torch()
        compute = self._compute()
        with torch.no_grad():
            for src, dst in copies:
                dst.copy_(src, non_blocking=True)
        done = torch.Event(device=self.device)
        done.record(compute)
        return _EventToken(done, [d for _, d in copies])


class CpuDevice(Device):
    """The same logic for CPU tensors: a separate staging buffer; the side stream is a
    worker thread whose copies run in order, later (``CPU_LATENCY_S``); the compute
    stream is the caller's thread."""

    def _allocate(self, nbytes: int) -> Any:
        return _torch().empty(nbytes, dtype=_torch().uint8)

    def _queue_to_host(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        torch = _torch()

        def job() -> None:
            with torch.no_grad():
                for src, dst in copies:
                    dst.copy_(src)

        # The caller's thread is the compute stream: the work queued on it so far has
        # run, so the "event" is already complete.
        return _WORKER.submit(job)

    def _queue_to_device(self, copies: Sequence[Tuple[Any, Any]]) -> Token:
        # On the compute stream, which is the caller's thread: done when this returns.
        with _torch().no_grad():
            for src, dst in copies:
                dst.copy_(src)
        return DONE


def device_for(device: Any, staging_bytes: int) -> Device:
    """The :class:`Device` implementation for tensors on `device`."""
    if device.type == "cpu":
        return CpuDevice(device, staging_bytes)
    return AcceleratorDevice(device, staging_bytes)


def flat_bytes(t: Any) -> Any:
    """A flat uint8 view of a contiguous tensor's memory (same storage)."""
    torch = _torch()
    return t.detach().reshape(-1).view(torch.uint8)


def pack(sizes: Sequence[Tuple[Any, int, int]], capacity: int) -> List[List[Tuple[Any, int, int, int]]]:
    """Batches of `(key, start, stop)` byte ranges that fit `capacity` bytes of staging:
    each batch a list of `(key, start, stop, offset)`; a range longer than the capacity
    is split over batches."""
    batches: List[List[Tuple[Any, int, int, int]]] = []
    batch: List[Tuple[Any, int, int, int]] = []
    used = 0
    for key, start, stop in sizes:
        while start < stop:
            room = capacity - used
            if room < min(ALIGN, stop - start):
                batches.append(batch)
                batch, used = [], 0
                room = capacity
            n = min(stop - start, room)
            batch.append((key, start, start + n, used))
            used = aligned(used + n)
            start += n
            if used >= capacity:
                batches.append(batch)
                batch, used = [], 0
    if batch:
        batches.append(batch)
    return batches
