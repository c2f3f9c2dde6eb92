"""A tensor-history repository as a ``torch.distributed.checkpoint`` (DCP) storage layer.

>>> import torch.distributed.checkpoint as dcp
>>> from tensor_history.torch.dcp import StorageReader, StorageWriter
>>> dcp.save(state_dict, storage_writer=StorageWriter("runs/ckpt", step=100))
>>> dcp.load(state_dict, storage_reader=StorageReader("runs/ckpt"))

Every DCP save becomes one version of the repository's history, on ``branch``:

- **Each rank** (``write_data``) puts the items of its plan (tensors, DTensor /
  ShardedTensor shards, bytes items) into a throwaway in-memory store and writes them as
  one *part* (``Store.write_part``): only the chunks the repository lacks are written,
  in packs of this rank, so a save in which 1% of the chunks changed writes about 1% of
  the bytes. Chunk ids are the same BLAKE3 content addresses as everywhere else: a DCP
  version and a tracker version of the same weights share storage.
- **The coordinator** (``finish``) writes DCP's ``Metadata`` (pickled, as a ``uint8``
  tensor named ``.dcp/metadata``) as a part of its own, then commits one version naming
  every rank's items (``Store.commit_parts``) and saves it: the branch moves with a
  create-if-absent write, so two concurrent saves to one branch cannot both win (the
  loser raises ``BranchMoved``, through DCP's ``CheckpointException``).
- A version exists only when every rank's part is durable. A rank that fails in
  ``write_data`` makes DCP skip ``finish``: no version, the previous one intact, and
  what the other ranks wrote is garbage that ``Store.gc`` deletes after its grace
  period (docs/FORMAT.md, "Several writers, one version").

Items are stored under readable names: a tensor saved whole under its fully qualified
name (``layer.weight``), a shard under ``<fqn>@<offsets>`` (``layer.weight@256,0``), a
bytes item under its name as ``uint8``. Dtypes the store has no type for (``bool``,
complex, 8-bit floats) are kept as their raw bytes (``uint8``, one more axis).

Loading reads only the items of the rank's plan, each once; DCP's planner reshards from
the stored metadata, so a checkpoint saved by 4 ranks loads into 2 or 1.

Reading never creates: ``StorageReader``, ``whole_tensors`` and ``export_safetensors``
open the repository with ``Store.open(..., create=False)``, so a mistyped location raises
``NoRepository`` (a ``FileNotFoundError``) and is left as it was (no directory, no
``config.json``; on a URL, nothing written to the bucket), and ``validate_checkpoint_id``
stays false there. A ref the repository lacks raises ``UnknownRef`` naming the branches
and tags it has; a version that is not a DCP save (no ``.dcp/metadata``) raises
``NotADcpSave``. Only a ``StorageWriter`` creates a repository (its coordinator, before
any rank writes).

``StorageWriter`` checks ``branch`` with the core's ref-name rules when it is made
(``InvalidRefName``) and again on every rank when a save starts, and the coordinator
refuses a ``branch`` that is a tag of the repository (``WrongRefKind``) before any rank
writes. Through ``dcp.load`` and ``dcp.save`` these errors reach every rank inside DCP's
``CheckpointException``, whose text names the error's type and message (a failed
``read_metadata`` only by its message: recent torch retries it for rank-local metadata and
then raises an ``AssertionError`` quoting it).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

try:
    import torch
except ImportError as _e:  # the module is torch's storage layer: nothing here works without it
    raise ImportError("tensor_history.torch.dcp is a storage layer of torch.distributed."
                      "checkpoint and needs torch: pip install torch") from _e
from torch.distributed._shard._utils import narrow_tensor_by_index as _narrow
from torch.distributed.checkpoint import StorageReader as _DcpReader
from torch.distributed.checkpoint import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .._core import Store
from .._errors import (
    DTypeMismatch,
    InvalidRefName,
    RefExists,
    ShapeMismatch,
    TensorHistoryError,
    UnknownRef,
    UnknownVariable,
    WrongRefKind,
)

__all__ = ["StorageWriter", "StorageReader", "METADATA_NAME", "VersionMismatch",
           "NotADcpSave", "whole_tensors", "export_safetensors"]

#: The name of the tensor holding DCP's pickled ``Metadata`` in every DCP version.
METADATA_NAME = ".dcp/metadata"

_NATIVE = {
    torch.float16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
}


@dataclass(frozen=True)
class _Item:
    """Where one write item went: its tensor's name in the version, its manifest id,
    and for raw-byte tensors the dtype and shape to view them back as."""

    name: str
    manifest: str
    raw_dtype: Optional[torch.dtype] = None
    raw_shape: Optional[tuple] = None


def _item_name(item) -> str:
    fqn = item.index.fqn
    td = item.tensor_data
    if td is None:
        return fqn
    offsets = tuple(td.chunk.offsets)
    whole = all(o == 0 for o in offsets) and tuple(td.chunk.sizes) == tuple(td.size)
    if whole:
        return fqn
    return fqn + "@" + ",".join(str(o) for o in offsets)


def _to_numpy(t: torch.Tensor):
    """(array, dtype tag or None, raw dtype or None): the tensor's bytes as NumPy, without
    a copy where torch allows."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy(), "bfloat16", None
    if t.dtype in _NATIVE:
        return t.numpy(), None, None
    flat = t.reshape(-1)
    if t.element_size() == 1:
        raw = flat.view(torch.uint8)
    else:
        raw = flat.view(torch.uint8).reshape(-1, t.element_size())
    return raw.numpy(), None, t.dtype


def _from_numpy(a: np.ndarray, item: _Item) -> torch.Tensor:
    if item.raw_dtype is not None:
        u8 = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
        return u8.view(item.raw_dtype).reshape(item.raw_shape)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


_STORE_DTYPE = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
}


def _put(store: Store, name: str, arr: np.ndarray, tag: Optional[str]) -> None:
    """Set `name` to `arr`: written over in place (only changed chunks copied) when the
    store holds it with the same dtype and shape, else inserted anew."""
    if name in store:
        dtype, shape = store.info(name)
        if dtype == _STORE_DTYPE.get(tag or arr.dtype.name) and tuple(shape) == arr.shape:
            store.write(name, arr, dtype=tag) if tag else store.write(name, arr)
            return
        store.remove(name)
    store.insert(name, arr, dtype=tag) if tag else store.insert(name, arr)


def _location(x) -> str:
    return os.fspath(x)


def _open_existing(location: str) -> Store:
    """The repository at `location`, for reading: ``NoRepository`` where there is none,
    and nothing is created there (no directory, no ``config.json``)."""
    return Store.open(location, create=False)


#: How many names of each kind a missing ref's message lists.
_REFS_LISTED = 20


def _names(names: list) -> str:
    shown = ", ".join(names[:_REFS_LISTED])
    more = len(names) - _REFS_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _resolve(store: Store, location: str, ref) -> str:
    """The content address of the version `ref` names. A branch or tag the repository
    lacks is ``UnknownRef`` (``name``), its message naming the branches and tags the
    repository has."""
    try:
        return store.version_hash(ref)
    except UnknownRef:
        refs = store.refs()
    branches = sorted(name for name, kind, _ in refs if kind == "branch")
    tags = sorted(name for name, kind, _ in refs if kind == "tag")
    if not branches and not tags:
        there = ": it has no branch or tag (nothing was saved there yet)"
    else:
        there = " (" + "; ".join(f"its {label}: {_names(names)}" for label, names in
                                 (("branches", branches), ("tags", tags)) if names) + ")"
    raise UnknownRef(f"no branch or tag {ref!r} in the repository at `{location}`{there}",
                     name=ref)


class NotADcpSave(TensorHistoryError, KeyError):
    """The version a DCP read was given is not a DCP save: it has no ``.dcp/metadata``
    tensor (``location``, ``ref``, ``version``: its content address)."""


def _read_metadata(store: Store, version: str, location: str = "", ref=None) -> Metadata:
    """The DCP ``Metadata`` of `version` (a content address); ``NotADcpSave`` if it has
    none."""
    try:
        blob = store.get(METADATA_NAME, at=version)
    except UnknownVariable as e:
        if getattr(e, "name", None) != METADATA_NAME:
            raise
        what = f"{ref!r} (version {version})" if ref not in (None, version) else version
        raise NotADcpSave(
            f"{what} of the repository at `{location}` is not a DCP save: it has no "
            f"{METADATA_NAME!r} tensor (a version saved by another writer than "
            "tensor_history.torch.dcp.StorageWriter)",
            location=location, ref=ref if ref is not None else version, version=version,
        ) from None
    return pickle.loads(blob.tobytes())


def _check_branch(name) -> str:
    """`name` if it can be a branch by the core's rules (``Store.branch``'s:
    ``InvalidRefName`` for an empty name, ``HEAD``, white space or control characters, a
    version id such as ``v12``, more than 255 bytes as a repository key); ``TypeError``
    for a name that is not a ``str``. Reads and writes nothing."""
    if not isinstance(name, str):
        raise TypeError(f"StorageWriter: branch must be a str, not {type(name).__name__}")
    probe = Store()
    probe.commit("probe")
    try:
        probe.branch(name)
    except RefExists:
        pass  # the probe's own branch: a valid name
    except InvalidRefName as e:
        raise InvalidRefName(f"StorageWriter's branch: {e}",
                             **vars(e)) from None
    return name


def _version_key(t: torch.Tensor):
    """What ``trust_versions`` compares between saves: memory, layout and in-place
    version counter of a contiguous CPU tensor (``None`` for any other)."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_sparse:
        return None
    return (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype)


class StorageWriter(_DcpWriter):
    """Write DCP checkpoints as versions of the tensor-history repository at
    ``location`` (a directory, created if absent, or a URL such as ``s3://bucket/p``),
    one version per ``dcp.save`` on ``branch``, with ``message`` (default
    ``"dcp save"``) and ``meta`` (bool, int, float, str) as the version's metadata.

    After a save, ``last_version`` is the new version's content address (on the
    coordinator) and ``last_part`` this rank's ``PartStats`` (bytes written and chunks
    the repository held already).

    Reuse one writer for every save of a run: it keeps a copy of the rank's items of its
    last save (memory: the rank's state dict), so that the next save copies and hashes
    only the chunks that changed (a compare of the rest). A new writer hashes everything
    once and still writes only the chunks the repository lacks.

    ``compress=True`` stores the new chunks byte-plane coded where that saves at least
    4% (float32 shards about 15% smaller on disk), at the cost of encoding on every
    rank's save and decoding on load; by default they are stored as they are, as fast as
    DCP's own writer for a save in which everything changed. Either way a chunk already
    in the repository is not written again.

    ``trust_versions=True`` skips, without reading it, a CPU tensor that is the same
    memory (data pointer, shape, strides, dtype) with the same in-place version counter
    (``tensor._version``) as at this writer's last save: torch advances the counter on
    every in-place op (``add_``, ``copy_``, optimizers' ``foreach`` updates), so only the
    tensors that changed are compared. The writer holds those tensors, so their memory
    is not reused by others meanwhile. Writes that bypass the counter are missed and
    the save stores the old values: through ``.numpy()`` views or ``.data``, and fused
    optimizers (``Adam(fused=True)``) that leave the counters alone. Off by default.

    ``branch`` must be a valid branch name by the core's rules (``InvalidRefName`` here
    otherwise; ``TypeError`` for a name that is not a ``str``); a ``branch`` set after
    construction is checked on every rank when a save starts, before any I/O, so every
    rank fails alike. The coordinator opens (or creates) the repository before any rank
    writes and refuses a ``branch`` that is a tag there (``WrongRefKind``); a tag made
    under that name by another process after this writer's last save is found when the
    version is committed (``WrongRefKind`` from ``finish``: no version, the ranks' parts
    are garbage for ``Store.gc``).
    """

    def __init__(self, location, branch: str = "main", message: Optional[str] = None,
                 compress: bool = False, trust_versions: bool = False, **meta: Any) -> None:
        super().__init__()
        self.branch = _check_branch(branch)
        self.compress = bool(compress)
        self.trust_versions = bool(trust_versions)
        self.location = _location(location)
        self.message = message if message is not None else "dcp save"
        self.meta = meta
        self.is_coordinator = False
        self.rank = None
        self.save_id = uuid.uuid4().hex
        self.last_version: Optional[str] = None
        self.last_part = None
        #: Seconds this rank's last save spent in each step of ``write_data`` and (on the
        #: coordinator) ``finish``: for profiling.
        self.times: dict = {}
        self._store: Optional[Store] = None
        # trust_versions: item name -> (tensor, _version_key) at the last save
        self._seen: dict = {}
        self._repo: Optional[Store] = None  # the coordinator's, kept from save to save

    def reset(self, checkpoint_id=None) -> None:
        """DCP's call at the start of each save (not for user code).

        Args:
            checkpoint_id: where to save this time (``dcp.save(checkpoint_id=...)``);
                ``None`` keeps ``location``.
        """
        if checkpoint_id and _location(checkpoint_id) != self.location:
            self.location = _location(checkpoint_id)
            self._store = None
            self._seen = {}
            if self._repo is not None:
                self._repo.close()
                self._repo = None
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """DCP's call on every rank before a save; checks ``branch`` (not for user code).

        Args:
            is_coordinator: whether this rank commits the version (in ``finish``).
        """
        # Every rank, before any I/O: a branch set after construction fails every rank.
        _check_branch(self.branch)
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """DCP's call on every rank: `plan` is returned as it is (not for user code)."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's call on the coordinator: opens (or creates) the repository and refuses a
        ``branch`` that is a tag there; `plans` are returned as they are (not for user
        code).

        Raises:
            WrongRefKind: ``branch`` is a tag of the repository.
        """
        # The coordinator, before any rank's write_data: open the repository, creating
        # it if it is absent, so that the ranks do not all create it at once. (Creation
        # by concurrent writers is not safe on an object store: a writer that finds no
        # config.json but another writer's first object raises UnsupportedFormat.) It
        # stays open for finish (which takes in the ranks' parts with a refresh). A
        # branch that is a tag there fails the save here, before any rank writes (DCP
        # raises it on every rank).
        if self._repo is None:
            self._repo = Store.open(self.location)
        for name, kind, _ in self._repo.refs():
            if name == self.branch and kind != "branch":
                raise WrongRefKind(
                    f"`{self.branch}` is a {kind} of the repository at `{self.location}`, "
                    "not a branch: a DCP save moves a branch (StorageWriter(branch=...))",
                    name=self.branch, expected="branch")
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """DCP's call on every rank: write the items of `plan` (resolved by `planner`) as
        this rank's part of the version (only the chunks the repository lacks). Not for
        user code."""
        # The rank's items of the last save stay in this writer's store: an item written
        # again keeps its unchanged chunks (and their hashes), so only changed chunks are
        # copied and hashed. A failed write starts from an empty store next time.
        t0 = time.perf_counter()
        store, self._store = self._store or Store(), None
        last_seen, self._seen = self._seen, {}
        seen = {}
        pending = []
        for item in plan.items:
            data = planner.resolve_data(item)
            name = _item_name(item)
            if item.type == WriteItemType.BYTE_IO:
                buf = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(data)
                _put(store, name, np.frombuffer(buf, dtype=np.uint8), None)
                size = buf.nbytes
                raw = (None, None)
            else:
                key = _version_key(data) if self.trust_versions else None
                if key is not None:
                    seen[name] = (data, key)
                if not (key is not None and name in store
                        and name in last_seen and last_seen[name][1] == key):
                    arr, tag, _ = _to_numpy(data)
                    _put(store, name, arr, tag)
                raw_dtype = None if data.dtype in _NATIVE or data.dtype == torch.bfloat16 \
                    else data.dtype
                size = data.numel() * data.element_size()
                raw = (raw_dtype, tuple(data.shape)) if raw_dtype is not None else (None, None)
            pending.append((item, name, size, raw))
        names = {name for _, name, _, _ in pending}
        for stale in [n for n in store.names() if n not in names]:
            store.remove(stale)
        t1 = time.perf_counter()
        stats = store.write_part(self.location, compress=self.compress)
        self.times = {"write_data.put": t1 - t0, "write_data.write_part": time.perf_counter() - t1}
        self._store = store
        self._seen = seen
        manifests = dict(stats.items)
        self.last_part = stats
        results = [
            WriteResult(index=item.index, size_in_bytes=size,
                        storage_data=_Item(name, manifests[name], raw[0], raw[1]))
            for item, name, size, raw in pending
        ]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """DCP's call on the coordinator once every rank's part is durable: write
        `metadata` and commit one version naming the items of every rank's `results`
        onto ``branch``, then save it (not for user code).

        Raises:
            BranchMoved: another save moved ``branch`` meanwhile.
            WrongRefKind: ``branch`` became a tag meanwhile.
        """
        storage_md = {}
        items = []
        for wr_list in results:
            for wr in wr_list:
                storage_md[wr.index] = wr.storage_data
                items.append((wr.storage_data.name, wr.storage_data.manifest))
        t0 = time.perf_counter()
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata)
        meta_store = Store()
        meta_store.insert(METADATA_NAME, np.frombuffer(blob, dtype=np.uint8))
        items.extend(meta_store.write_part(self.location, compress=self.compress).items)
        t1 = time.perf_counter()
        # The coordinator keeps the repository open from one save to the next and takes
        # in what other processes saved since (refresh: new refs, versions and index
        # files only) instead of opening it again (every version and index file, HEAD's
        # manifests: on S3 a request each). After an error it is opened afresh.
        repo, self._repo = self._repo, None
        try:
            if repo is None:
                repo = Store.open(self.location)
            else:
                repo.refresh()
            t2 = time.perf_counter()
            v = repo.commit_parts(self.branch, [items], self.message, **self.meta)
            t3 = time.perf_counter()
            repo.save()
            self.last_version = repo.version_hash(v)
        except BaseException:
            if repo is not None:
                repo.close()
            raise
        self._repo = repo
        self.times.update({"finish.metadata_part": t1 - t0, "finish.open_or_refresh": t2 - t1,
                           "finish.commit_parts": t3 - t2,
                           "finish.save": time.perf_counter() - t3})

    def storage_meta(self) -> Optional[StorageMeta]:
        """The save's ``StorageMeta`` (location and save id), for DCP's metadata."""
        return StorageMeta(checkpoint_id=self.location, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether a tensor-history repository is at ``checkpoint_id`` (see
        ``StorageReader.validate_checkpoint_id``); creates nothing."""
        return _is_repository(checkpoint_id)


def _is_repository(checkpoint_id) -> bool:
    """Whether a repository is at `checkpoint_id`, creating nothing: a local directory's
    ``config.json`` is read; a URL is opened with ``create=False``."""
    try:
        location = os.fspath(checkpoint_id)
    except TypeError:
        return False
    if isinstance(location, bytes):
        return False
    if "://" in location:
        try:
            _open_existing(location).close()
        except (TensorHistoryError, OSError, ValueError):
            return False
        return True
    try:
        with open(os.path.join(location, "config.json"), "rb") as f:
            return b'"tensor-history"' in f.read(4096)
    except OSError:
        return False


class StorageReader(_DcpReader):
    """Load DCP checkpoints from the tensor-history repository at ``location``: the
    version ``ref`` names (a branch, a tag, a content address; default ``"main"``).

    Every rank reads only the stored items its load plan names, each once (chunks read
    from the repository on demand, checked against their hash). The version is resolved
    once per ``dcp.load`` on each rank. If a save moved ``ref`` between the ranks' reads,
    the coordinator pins its own version for every rank when that is valid: when each
    version's DCP metadata describes the same items (``state_dict_metadata`` equal, and
    ``storage_data`` naming the same stored items with the same dtypes, which is what
    the ranks' plans were made from), so every rank loads that one version. Otherwise
    (another layout, such as a save by another world size) the load raises
    ``VersionMismatch`` (a ``RuntimeError``, in DCP's ``CheckpointException``): load a
    fixed version (a tag or a content address) instead.

    The reader never creates: where there is no repository at ``location``, a load
    raises ``NoRepository`` and leaves the location as it was. A ``ref`` the repository
    lacks raises ``UnknownRef`` naming the branches and tags it has; a version that is
    not a DCP save raises ``NotADcpSave``. (Through ``dcp.load``, in DCP's
    ``CheckpointException`` on every rank.)
    """

    def __init__(self, location, ref: str = "main") -> None:
        super().__init__()
        self.location = _location(location)
        self.ref = ref
        self.version: Optional[str] = None
        self.storage_data: dict = {}
        self._store = None
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id=None) -> None:
        """DCP's call at the start of each load (not for user code).

        Args:
            checkpoint_id: where to load from this time (``dcp.load(checkpoint_id=...)``);
                ``None`` keeps ``location``.
        """
        if checkpoint_id:
            self.location = _location(checkpoint_id)
        self.storage_data = {}
        self._store = None
        self.version = None
        self.load_id = uuid.uuid4().hex

    def _open(self) -> Store:
        if self._store is None:
            self._store = _open_existing(self.location)
        return self._store

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's call: resolve ``ref`` and read that version's DCP ``Metadata`` (not for
        user code).

        Raises:
            NoRepository: there is no repository at ``location``.
            UnknownRef: the repository has no ``ref``.
            NotADcpSave: the version is not a DCP save.
        """
        store = self._open()
        self.version = _resolve(store, self.location, self.ref)
        metadata = _read_metadata(store, self.version, self.location, self.ref)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """DCP's call on every rank before a load (not for user code).

        Args:
            metadata: the version's DCP metadata (from ``read_metadata``).
            is_coordinator: whether this rank plans the load for all.
        """
        if metadata.storage_data is None:
            raise ValueError("the checkpoint's metadata has no storage data")
        self.storage_data = metadata.storage_data
        if self.version is None:
            self.version = _resolve(self._open(), self.location, self.ref)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """DCP's call on every rank: `plan`, naming the version this rank resolved (not
        for user code)."""
        return dataclasses.replace(plan, storage_data=self.version)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """DCP's call on the coordinator: `plans` pinned to one version when the ranks
        resolved ``ref`` to different ones (not for user code).

        Raises:
            VersionMismatch: those versions' DCP metadata differ.
        """
        seen = {p.storage_data for p in plans}
        if len(seen) <= 1:
            return plans
        # A save moved `ref` between the ranks' read_metadata. Every rank's plan was made
        # from the metadata it read; pinning this coordinator's version for all is valid
        # when every version's metadata describes the same stored items. (A fresh
        # store: the other ranks' versions may be newer than this one's open.)
        store = _open_existing(self.location)
        mine = _layout(_read_metadata(store, self.version, self.location))
        differ = sorted(v for v in seen - {self.version}
                        if _layout(_read_metadata(store, v, self.location)) != mine)
        if differ:
            raise VersionMismatch(
                f"ranks resolved {self.ref!r} to different versions {sorted(seen)} (it moved "
                f"during the load) whose DCP metadata differ from the coordinator's "
                f"{self.version} ({', '.join(differ)}): no one version fits every rank's "
                "plan; load a fixed version (a tag or a content address)"
            )
        return [dataclasses.replace(p, storage_data=self.version) for p in plans]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """DCP's call on every rank: read the stored items `plan` names, each once, into
        the tensors `planner` gives (not for user code)."""
        if plan.storage_data is not None and plan.storage_data != self.version:
            # The coordinator pinned its version (ref moved between the ranks' reads):
            # read that version's items, named by its own metadata (reopened: the
            # version may be newer than this rank's open).
            self._store = None
            self.version = plan.storage_data
            self.storage_data = _read_metadata(self._open(), self.version,
                                               self.location).storage_data
        store = self._open()
        by_name: dict[str, list] = {}
        for req in plan.items:
            by_name.setdefault(self.storage_data[req.storage_index].name, []).append(req)
        for name, reqs in by_name.items():
            item: _Item = self.storage_data[reqs[0].storage_index]
            if len(reqs) == 1 and self._read_whole_into(store, name, item, reqs[0], planner):
                continue
            arr = store.get(name, at=self.version)
            for req in reqs:
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(arr.tobytes()))
                    continue
                tensor = _narrow(_from_numpy(arr, item), req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise RuntimeError(
                        f"{req.storage_index}: stored {tuple(tensor.size())}, "
                        f"expected {tuple(target.size())}"
                    )
                target.copy_(tensor)
                planner.commit_tensor(req, target)
            del arr
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_whole_into(self, store: Store, name: str, item: _Item, req,
                         planner: LoadPlanner) -> bool:
        """Copy a stored item straight into the rank's tensor when it is the whole item
        (the same sharding as the save) and a contiguous CPU tensor of a NumPy dtype:
        one copy, no intermediate array. ``False`` (nothing done) otherwise."""
        if req.type == LoadItemType.BYTE_IO or item.raw_dtype is not None:
            return False
        target = planner.resolve_tensor(req).detach()
        if (target.device.type != "cpu" or not target.is_contiguous()
                or target.dtype not in _NATIVE or tuple(target.size()) != tuple(req.lengths)
                or any(req.storage_offsets)):
            return False
        try:
            store.write_into({name: target.numpy()}, at=self.version)
        except (ShapeMismatch, DTypeMismatch):
            return False  # another shape or dtype than the rank's: the general path
        planner.commit_tensor(req, target)
        return True

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether a tensor-history repository is at ``checkpoint_id``: a local
        directory with a tensor-history ``config.json``, or a URL that opens as one.
        Creates nothing."""
        return _is_repository(checkpoint_id)


class VersionMismatch(RuntimeError):
    """The ranks of one ``dcp.load`` resolved the reader's ``ref`` to versions whose DCP
    metadata differ (a save of another layout moved the ref during the load), so no one
    version fits every rank's plan."""


def _layout(md: Metadata):
    """What a load plan depends on in a version's DCP metadata: the items and their
    chunks (``state_dict_metadata``) and, per item, the stored tensor's name and raw
    dtype and shape. Not the manifest ids (they change with the data, which the pinned
    version supplies) nor ``storage_meta`` (the save's ids)."""
    items = {idx: (it.name, it.raw_dtype, it.raw_shape)
             for idx, it in (md.storage_data or {}).items()}
    return md.state_dict_metadata, items


def whole_tensors(location, ref: str = "main") -> dict:
    """The DCP version ``ref`` of the repository at ``location`` in one process, without
    ``torch.distributed``: every tensor whole (its shards assembled, ``torch.Tensor`` of
    its saved dtype) and every bytes item as ``bytes``, by fully qualified name (nested
    state dicts flattened with dots, as DCP stores them).

    Reads every stored item once; memory: the whole state dict. Creates nothing.

    Raises ``NoRepository`` (a ``FileNotFoundError``) where there is no repository;
    ``UnknownRef`` for a ref the repository lacks (its message names the refs it has);
    ``NotADcpSave`` (a ``KeyError``) for a version that is not a DCP save (no
    ``.dcp/metadata``).
    """
    location = _location(location)
    store = _open_existing(location)
    try:
        return _whole_tensors(store, location, ref)
    finally:
        store.close()


def _whole_tensors(store: Store, location: str, ref) -> dict:
    version = _resolve(store, location, ref)
    md = _read_metadata(store, version, location, ref)
    out: dict = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            item = md.storage_data[MetadataIndex(fqn)]
            out[fqn] = store.get(item.name, at=version).tobytes()
            continue
        full = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for c in m.chunks:
            item = md.storage_data[MetadataIndex(fqn, c.offsets)]
            piece = _from_numpy(store.get(item.name, at=version), item)
            where = tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes))
            full[where] = piece.reshape(tuple(c.sizes))
        out[fqn] = full
    return out


def export_safetensors(location, path, ref: str = "main") -> list[str]:
    """Write the DCP version ``ref`` of the repository at ``location`` to ``path`` as one
    ``.safetensors`` file of whole tensors (see ``whole_tensors``), atomically. Bytes
    items, and tensors of a dtype the store has no type for (``bool``, complex, 8-bit
    floats), are left out: their names are returned. Raises as ``whole_tensors`` does,
    and then writes nothing.
    """
    left_out = []
    out = Store()
    for name, value in whole_tensors(location, ref).items():
        if isinstance(value, bytes) or (value.dtype not in _NATIVE
                                        and value.dtype != torch.bfloat16):
            left_out.append(name)
            continue
        arr, tag, _ = _to_numpy(value)
        out.insert(name, arr, dtype=tag) if tag else out.insert(name, arr)
    out.commit("export")
    out.export_safetensors(os.fspath(path))
    return sorted(left_out)
