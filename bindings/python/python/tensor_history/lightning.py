"""Lightning checkpoints as versions of a tensor-history repository.

>>> import lightning as L, tensor_history as th
>>> trainer = L.Trainer(plugins=[th.lightning.CheckpointIO("runs/exp")])

:class:`CheckpointIO` is a Lightning ``CheckpointIO`` plugin. Every checkpoint Lightning
saves becomes one version of the repository at ``location`` on ``branch``:

- **Tensors** (the ``state_dict``, optimizer states, tensors nested in loops' and
  callbacks' state) are variables of the version, named by their place in the
  checkpoint dict (``state_dict/layer.weight``, ``optimizer_states/0/state/3/exp_avg``).
  A save writes over the previous checkpoint's variables, so only chunks that changed
  are copied in memory, and the repository stores them as it stores every save (deltas
  against the previous version where that is smaller).
- **Everything else** (epoch, global step, loop and callback state, hyper-parameters,
  scheduler state) is kept in the version as JSON (``.lightning/state``, ``uint8``)
  that refers to the tensors by name. Python values JSON cannot hold (tuples, dicts with
  non-string keys, ``OrderedDict`` with its ``_metadata``, ``torch.Size``, dtypes,
  devices, bytes, non-finite floats, classes by import path) have a safe form of their
  own. Any other object (an instance of a user class in the hyper-parameters, a sparse
  tensor) is pickled into ``.lightning/pickle/<n>``, and loading it needs
  ``weights_only=False``, as with ``torch.load``.
- **The file** Lightning asked for (``epoch=3-step=400.ckpt``, ``last.ckpt``) is a small
  JSON pointer: the repository's location, the version's content address and a tag named
  after the file (``epoch=3-step=400``). Lightning's own file checks, ``last.ckpt`` and
  ``trainer.fit(ckpt_path=...)`` work unchanged. The repository save is durable before
  the pointer is written, and the pointer is replaced atomically.
- ``remove_checkpoint`` (``ModelCheckpoint`` dropping a checkpoint out of its top k)
  deletes the pointer and the tag, and prunes versions that no tag or branch tip holds
  any more, as does saving again under a file name that named another version
  (``last.ckpt``); ``Store.gc`` (or the CLI's ``gc``) then deletes their data from the
  repository.

Lightning and torch are imported when first used: ``import tensor_history.lightning``
works without them, and using a name that needs them raises ``ImportError`` saying what
to install.
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from ._core import Store
from ._errors import InvalidArgument, NoRepository, TensorHistoryError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CheckpointIO",
    "load_checkpoint",
    "load_from_checkpoint",
    "read_pointer",
    "NotACheckpoint",
    "PickleRequired",
    "POINTER_FORMAT",
    "STATE_NAME",
]

#: The ``format`` field of every pointer file.
POINTER_FORMAT = "tensor-history-lightning"
#: The pointer format version this module writes and reads.
POINTER_VERSION = 1
#: The variable holding a checkpoint's non-tensor state (JSON, ``uint8``).
STATE_NAME = ".lightning/state"
_PICKLE_PREFIX = ".lightning/pickle/"
_STATE_VERSION = 1
#: A pointer file is a few hundred bytes; anything larger is not one.
_POINTER_MAX_BYTES = 64 * 1024
_MARK = "__th__"


class NotACheckpoint(TensorHistoryError, ValueError):
    """The file is not a tensor-history checkpoint pointer, or names a version its
    repository lacks (``path``, ``reason``)."""


class PickleRequired(TensorHistoryError, pickle.UnpicklingError):
    """The checkpoint holds pickled objects and the load did not ask for
    ``weights_only=False`` (``path``, ``objects``: where they sit in the checkpoint)."""


# --------------------------------------------------------------------------- imports


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the tier without torch
        raise ImportError("tensor_history.lightning needs torch: pip install torch") from e
    return torch


def _lightning_base() -> type:
    """Lightning's ``CheckpointIO`` base class (``lightning`` or ``lightning_fabric``)."""
    try:
        from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as base
    except ImportError:
        try:
            from lightning_fabric.plugins.io.checkpoint_io import (  # type: ignore
                CheckpointIO as base,
            )
        except ImportError as e:
            raise ImportError("tensor_history.lightning.CheckpointIO is a Lightning plugin "
                              "and needs Lightning: pip install lightning") from e
    return base


# ----------------------------------------------------------------- tensors <-> arrays

_NATIVE = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64")
_STORE_DTYPE = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _to_array(t: "torch.Tensor") -> Tuple[np.ndarray, Optional[str], bool]:
    """(array, dtype tag for the store or None, raw): the tensor's bytes as NumPy. Dtypes
    the store has no type for (bool, complex, 8-bit floats) go as raw ``uint8`` bytes."""
    torch = _torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    name = _dtype_name(t.dtype)
    if name == "bfloat16":
        return t.view(torch.uint16).numpy(), "bfloat16", False
    if name in _NATIVE:
        return t.numpy(), None, False
    flat = t.reshape(-1)
    raw = flat.view(torch.uint8) if t.element_size() == 1 else \
        flat.view(torch.uint8).reshape(-1, t.element_size())
    return raw.numpy(), None, True


def _from_array(a: np.ndarray, rec: Dict[str, Any]) -> "torch.Tensor":
    tm = _torch()
    dtype = getattr(tm, rec["dtype"], None)
    if not isinstance(dtype, tm.dtype):
        raise NotACheckpoint(f"unknown dtype {rec['dtype']!r} for {rec['name']!r}",
                             path=None, reason="dtype")
    shape = tuple(rec["shape"])
    if rec.get("raw"):
        u8 = tm.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
        raw: torch.Tensor = u8.view(dtype).reshape(shape)
        return raw
    if a.dtype.name == "bfloat16":
        t = tm.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(tm.bfloat16)
    else:
        t = tm.from_numpy(np.ascontiguousarray(a))
    if t.dtype == dtype and tuple(t.shape) != shape and t.numel() == math.prod(shape):
        t = t.reshape(shape)  # a repository gives 0-d arrays back as shape (1,)
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise NotACheckpoint(f"variable {rec['name']!r} is {t.dtype} {tuple(t.shape)}, the "
                             f"checkpoint says {dtype} {shape}", path=None, reason="tensor")
    out: torch.Tensor = t
    return out


def _put(store: Store, name: str, arr: np.ndarray, tag: Optional[str]) -> None:
    """Set `name` to `arr`: written over (only changed chunks copied) when the store holds
    it with the same dtype and shape, else inserted anew."""
    if name in store:
        dtype, shape = store.info(name)
        if dtype == _STORE_DTYPE.get(tag or arr.dtype.name) and tuple(shape) == arr.shape:
            if tag:
                store.write(name, arr, dtype=tag)
            else:
                store.write(name, arr)
            return
        store.remove(name)
    if tag:
        store.insert(name, arr, dtype=tag)
    else:
        store.insert(name, arr)


# --------------------------------------------------------------------- the encoding


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _qualname(obj: Any) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


#: Classes a checkpoint may name (``hparams_type``) that load without pickle.
_SAFE_GLOBALS = {
    "builtins.dict", "collections.OrderedDict",
    "lightning.fabric.utilities.data.AttributeDict",
    "lightning_fabric.utilities.data.AttributeDict",
}


class _Encoder:
    """Turns a checkpoint dict into JSON-able structure, tensors and pickles."""

    def __init__(self) -> None:
        self.torch = _torch()
        self.tensors: Dict[str, "torch.Tensor"] = {}
        self.seen: Dict[int, str] = {}
        self.pickles: List[bytes] = []
        self.pickled_at: List[str] = []

    def _name(self, path: List[str]) -> str:
        base = "/".join(path) or "tensor"
        if base.startswith(".lightning"):
            base = "~" + base
        name, n = base, 1
        while name in self.tensors:
            name = f"{base}~{n}"
            n += 1
        return name

    def _pickle(self, x: Any, path: List[str]) -> Dict[str, Any]:
        try:
            data = pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise InvalidArgument(
                f"checkpoint value at {'/'.join(path) or '<root>'} ({_qualname(x)}) has no "
                f"safe form and cannot be pickled: {e}", reason="unpicklable") from e
        name = f"{_PICKLE_PREFIX}{len(self.pickles)}"
        self.pickles.append(data)
        self.pickled_at.append("/".join(path))
        return {_MARK: "pickle", "name": name, "type": _qualname(x), "at": "/".join(path)}

    def _tensor(self, t: "torch.Tensor", path: List[str]) -> Dict[str, Any]:
        torch = self.torch
        if (type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided
                or t.is_quantized or t.device.type == "meta"):
            return self._pickle(t, path)
        key = id(t)
        if key in self.seen:  # the same tensor object twice (tied weights): one variable
            name = self.seen[key]
        else:
            name = self._name(path)
            self.tensors[name] = t
            self.seen[key] = name
        rec: Dict[str, Any] = {_MARK: "tensor", "name": name, "dtype": _dtype_name(t.dtype),
                               "shape": list(t.shape), "device": str(t.device)}
        if rec["dtype"] not in _NATIVE and rec["dtype"] != "bfloat16":
            rec["raw"] = True  # kept as its bytes (uint8)
        if type(t) is torch.nn.Parameter:
            rec["param"] = True
            rec["requires_grad"] = bool(t.requires_grad)
        elif t.requires_grad:
            rec["requires_grad"] = True
        return rec

    def encode(self, x: Any, path: List[str]) -> Any:
        t = type(x)
        if x is None or t is bool or t is str or t is int:
            return x
        if t is float:
            return x if math.isfinite(x) else {_MARK: "float", "v": repr(x)}
        torch = self.torch
        if isinstance(x, torch.Tensor):
            return self._tensor(x, path)
        if t is list:
            return [self.encode(v, path + [str(i)]) for i, v in enumerate(x)]
        if t is tuple:
            return {_MARK: "tuple",
                    "items": [self.encode(v, path + [str(i)]) for i, v in enumerate(x)]}
        kind = _dict_kind(x)
        if kind is not None:
            attrs = dict(vars(x)) if kind != "dict" and hasattr(x, "__dict__") else {}
            if kind == "dict" and all(type(k) is str for k in x) and _MARK not in x:
                return {k: self.encode(v, path + [_escape(k)]) for k, v in x.items()}
            items = [[self.encode(k, path + ["#key"]),
                      self.encode(v, path + [_escape(k) if type(k) is str else str(k)])]
                     for k, v in x.items()]
            out: Dict[str, Any] = {_MARK: "dict", "kind": kind, "items": items}
            if attrs:
                out["attrs"] = {k: self.encode(v, path + ["#" + _escape(k)])
                                for k, v in attrs.items() if type(k) is str}
            return out
        if t is torch.Size:
            return {_MARK: "size", "v": list(x)}
        if t is torch.dtype:
            return {_MARK: "dtype", "v": _dtype_name(x)}
        if t is torch.device:
            return {_MARK: "device", "v": str(x)}
        if t is bytes:
            return {_MARK: "bytes", "b64": base64.b64encode(x).decode("ascii")}
        if isinstance(x, type):
            return {_MARK: "global", "v": _qualname(x)}
        return self._pickle(x, path)


def _dict_kind(x: Any) -> Optional[str]:
    t = type(x)
    if t is dict:
        return "dict"
    if t is OrderedDict:
        return "odict"
    if _qualname(x) in ("lightning.fabric.utilities.data.AttributeDict",
                        "lightning_fabric.utilities.data.AttributeDict"):
        return "attrdict"
    return None


class _Decoder:
    def __init__(self, snap: Any, path: str, map_location: Any, weights_only: bool) -> None:
        self.torch = _torch()
        self.snap = snap
        self.path = path
        self.map_location = map_location
        self.weights_only = weights_only
        self.tensors: Dict[str, "torch.Tensor"] = {}

    def _device(self, saved: str) -> Any:
        ml = self.map_location
        torch = self.torch
        if ml is None:
            return saved
        if isinstance(ml, (str, torch.device)):
            return ml
        if isinstance(ml, dict):
            return ml.get(saved, saved)
        if callable(ml):
            probe = torch.empty(0, dtype=torch.uint8)
            r = ml(probe.untyped_storage(), saved)
            if r is None:
                return saved
            dev = getattr(r, "device", None)
            return dev if dev is not None else saved
        raise InvalidArgument(f"map_location {ml!r} is not a device, dict or callable",
                              reason="map_location")

    def _tensor(self, rec: Dict[str, Any]) -> "torch.Tensor":
        name = rec.get("name")
        if not isinstance(name, str):
            raise NotACheckpoint("a tensor record without a name", path=self.path,
                                 reason="state")
        if name in self.tensors:
            return self.tensors[name]
        if name not in self.snap:
            raise NotACheckpoint(f"the version lacks tensor {name!r}", path=self.path,
                                 reason="tensor")
        t = _from_array(self.snap[name], rec)
        dev = self._device(str(rec.get("device", "cpu")))
        if str(dev) != "cpu":
            t = t.to(dev)
        if rec.get("param"):
            t = self.torch.nn.Parameter(t, requires_grad=bool(rec.get("requires_grad")))
        elif rec.get("requires_grad"):
            t.requires_grad_(True)
        self.tensors[name] = t
        return t

    def decode(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self.decode(v) for v in x]
        if not isinstance(x, dict):
            return x
        mark = x.get(_MARK)
        if mark is None:
            return {k: self.decode(v) for k, v in x.items()}
        torch = self.torch
        if mark == "tensor":
            return self._tensor(x)
        if mark == "float":
            return float(x["v"])
        if mark == "tuple":
            return tuple(self.decode(v) for v in x["items"])
        if mark == "dict":
            kind = x.get("kind")
            pairs = [(self.decode(k), self.decode(v)) for k, v in x["items"]]
            if kind == "odict":
                out: Any = OrderedDict(pairs)
            elif kind == "attrdict":
                out = _attribute_dict()(pairs)
            else:
                out = dict(pairs)
            for k, v in x.get("attrs", {}).items():
                setattr(out, k, self.decode(v))
            return out
        if mark == "size":
            return torch.Size(x["v"])
        if mark == "dtype":
            return getattr(torch, x["v"])
        if mark == "device":
            return torch.device(x["v"])
        if mark == "bytes":
            return base64.b64decode(x["b64"])
        if mark == "global":
            return self._global(x["v"])
        if mark == "pickle":
            if self.weights_only:  # checked for the whole checkpoint before decoding
                raise PickleRequired("pickled object", path=self.path, objects=[x.get("at")])
            data = self.snap[x["name"]]
            return pickle.loads(np.ascontiguousarray(data).tobytes())
        raise NotACheckpoint(f"unknown value kind {mark!r} in the checkpoint state",
                             path=self.path, reason="state")

    def _global(self, qualname: str) -> Any:
        if self.weights_only and qualname not in _SAFE_GLOBALS:
            raise PickleRequired(
                f"{self.path}: the checkpoint names the class {qualname}, which loads only "
                "with weights_only=False", path=self.path, objects=[qualname])
        import importlib

        module, _, name = qualname.rpartition(".")
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj


def _attribute_dict() -> Any:
    try:
        from lightning.fabric.utilities.data import AttributeDict
    except ImportError:
        from lightning_fabric.utilities.data import AttributeDict  # type: ignore
    return AttributeDict


# ------------------------------------------------------------------------- pointers


def _location_of(location: Union[str, "os.PathLike[str]"]) -> str:
    loc = os.fspath(location)
    if "://" in loc:
        return loc
    return os.path.abspath(loc)


def _tag_for(path: str) -> str:
    """The tag a checkpoint file's version gets: its file name without ``.ckpt``, white
    space replaced by ``_``."""
    name = os.path.basename(os.fspath(path))
    if name.endswith(".ckpt"):
        name = name[: -len(".ckpt")]
    tag = "".join("_" if c.isspace() else c for c in name) or "checkpoint"
    if tag == "HEAD":
        tag = "HEAD_"
    return tag


def read_pointer(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """The fields of the pointer file at ``path``: ``location``, ``version`` (the content
    address, 64 hex digits), ``tag`` and ``branch``. Raises ``NotACheckpoint`` for a file
    that is not a pointer (a ``torch.save`` checkpoint, say) and ``FileNotFoundError``
    where there is no file. Reads at most 64 KiB."""
    p = os.fspath(path)
    with open(p, "rb") as f:
        data = f.read(_POINTER_MAX_BYTES + 1)
    if data[:2] == b"PK":
        raise NotACheckpoint(
            f"{p} is a torch.save checkpoint (a zip file), not a tensor-history pointer: "
            "load it with torch.load or Lightning's TorchCheckpointIO", path=p,
            reason="zip")
    if len(data) > _POINTER_MAX_BYTES:
        raise NotACheckpoint(f"{p} is larger than a pointer file can be", path=p,
                             reason="size")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise NotACheckpoint(f"{p} is not a tensor-history pointer (not JSON: {e})",
                             path=p, reason="json") from e
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT:
        raise NotACheckpoint(f"{p} is not a tensor-history pointer (no format "
                             f"{POINTER_FORMAT!r})", path=p, reason="format")
    if doc.get("format_version") != POINTER_VERSION:
        raise NotACheckpoint(f"{p}: pointer format version {doc.get('format_version')!r}, "
                             f"this build reads {POINTER_VERSION}", path=p, reason="version")
    for key in ("location", "version", "tag", "branch"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise NotACheckpoint(f"{p}: pointer field {key!r} is missing or not a string",
                                 path=p, reason=key)
    v = doc["version"]
    if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise NotACheckpoint(f"{p}: pointer version {v!r} is not a 64-digit content "
                             "address", path=p, reason="version")
    return doc


def _write_pointer(path: str, doc: Dict[str, Any]) -> None:
    """Write `doc` at `path` atomically and durably (temporary file, fsync, rename,
    directory fsync)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- save / load


def _save(store: Store, branch: str, checkpoint: Dict[str, Any], path: str,
          prune: bool = False) -> Dict[str, Any]:
    """Commit `checkpoint` as one version on `branch`, tag it after `path`, save the
    repository, then write the pointer; with `prune`, if the tag named another version
    before, prune what no tag, branch tip or HEAD holds and save. Returns the pointer's
    fields."""
    if not isinstance(checkpoint, dict):
        raise InvalidArgument(f"a checkpoint is a dict, not {type(checkpoint).__name__}",
                              reason="checkpoint")
    enc = _Encoder()
    state = enc.encode(checkpoint, [])
    doc = {"format": POINTER_FORMAT, "state_version": _STATE_VERSION, "state": state,
           "pickled": enc.pickled_at}
    blob = np.frombuffer(json.dumps(doc, allow_nan=False).encode("utf-8"), dtype=np.uint8)
    wanted: Dict[str, Tuple[np.ndarray, Optional[str]]] = {STATE_NAME: (blob, None)}
    for i, data in enumerate(enc.pickles):
        wanted[f"{_PICKLE_PREFIX}{i}"] = (np.frombuffer(data, dtype=np.uint8), None)
    for name, t in enc.tensors.items():
        arr, tag, _raw = _to_array(t)
        wanted[name] = (arr, tag)
    tag = _tag_for(path)
    head = store.head()
    if head is not None and store.current_branch() != branch:
        # another branch is checked out (a load moved HEAD): continue on `branch`
        if branch in [n for n, kind, _ in store.refs() if kind == "branch"]:
            store.checkout(branch)
        else:
            store.branch(branch, at=head)
            store.checkout(branch)
    try:
        for name in store.names():
            if name not in wanted:
                store.remove(name)
        for name, (arr, dtag) in wanted.items():
            _put(store, name, arr, dtag)
        meta: Dict[str, Any] = {"tag": tag}
        for key in ("epoch", "global_step"):
            if type(checkpoint.get(key)) is int:
                meta[key] = checkpoint[key]
        if head is None and branch != "main":
            # the first commit creates `main`: move it to `branch`
            v = store.commit(f"checkpoint {tag}", **meta)
            store.branch(branch, at=v)
            store.checkout(branch)
            store.delete_branch("main")
        else:
            v = store.commit(f"checkpoint {tag}", **meta)
    except BaseException:
        if store.head() is not None:
            store.discard()
        raise
    old = {n: ver for n, kind, ver in store.refs() if kind == "tag"}.get(tag)
    try:
        if old is not None:
            store.delete_tag(tag)
        store.tag(tag, at=v)
        store.save()
    except BaseException:
        _roll_back(store, tag, old, v, head)
        raise
    ptr = {"format": POINTER_FORMAT, "format_version": POINTER_VERSION,
           "location": store.location, "version": store.version_hash(v), "tag": tag,
           "branch": branch}
    _write_pointer(path, ptr)
    if old is not None and prune:
        # The path named another version before (``last.ckpt``, saved again at every
        # checkpoint): that version goes unless another tag holds it. The checkpoint is
        # durable already; a failure here leaves the pruning to the next save.
        store.prune(keep_last=1)
        store.save()
    return ptr


def _roll_back(store: Store, tag: str, old: Any, v: Any, head: Any) -> None:
    """After a failed save: the tag back where it was, HEAD (and its branch) back to
    `head`, and the refs saved again where the failed save wrote some of them (a
    ``BranchMoved`` save writes every ref but the moved branch)."""
    try:
        tags = {n: ver for n, kind, ver in store.refs() if kind == "tag"}
        if tags.get(tag) == v:
            store.delete_tag(tag)
        if old is not None and tag not in {n for n, _, _ in store.refs()}:
            store.tag(tag, at=old)
        if head is not None:
            store.restore(head)
        store.save()
    except TensorHistoryError:
        pass  # the original error is what the caller needs; the refs are as saved


def _load(store: Store, ptr: Dict[str, Any], path: str, map_location: Any,
          weights_only: Optional[bool]) -> Dict[str, Any]:
    from ._errors import AmbiguousRef, PrunedVersion, UnknownRef, UnknownVersion

    missing = NotACheckpoint(
        f"{path}: the repository at {ptr['location']} has no version {ptr['version']} "
        f"(tag {ptr['tag']!r}; deleted and collected?)", path=path, reason="version")
    try:
        v = store.resolve(ptr["version"])
        if store.version_hash(v) != ptr["version"]:
            raise missing
        snap = store.snapshot(v)
    except (UnknownRef, AmbiguousRef, UnknownVersion, PrunedVersion) as e:
        raise missing from e
    if STATE_NAME not in snap:
        raise NotACheckpoint(f"{path}: version {ptr['version'][:12]} is not a Lightning "
                             "checkpoint (no .lightning/state)", path=path, reason="state")
    try:
        doc = json.loads(np.ascontiguousarray(snap[STATE_NAME]).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise NotACheckpoint(f"{path}: the checkpoint state does not parse: {e}",
                             path=path, reason="state") from e
    if not isinstance(doc, dict) or doc.get("state_version") != _STATE_VERSION:
        raise NotACheckpoint(f"{path}: checkpoint state version "
                             f"{doc.get('state_version') if isinstance(doc, dict) else None!r}"
                             f", this build reads {_STATE_VERSION}", path=path,
                             reason="state")
    strict = weights_only is None or bool(weights_only)
    pickled = doc.get("pickled") or []
    if strict and pickled:
        raise PickleRequired(
            f"{path}: the checkpoint holds pickled objects at {', '.join(pickled)}; load it "
            "with weights_only=False if you trust its source", path=path, objects=pickled)
    try:
        out = _Decoder(snap, path, map_location, strict).decode(doc.get("state"))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        if isinstance(e, TensorHistoryError):
            raise
        raise NotACheckpoint(f"{path}: the checkpoint state is malformed ({type(e).__name__}: "
                             f"{e})", path=path, reason="state") from e
    if not isinstance(out, dict):
        raise NotACheckpoint(f"{path}: the checkpoint state is not a dict", path=path,
                             reason="state")
    return out


def _open_for(ptr: Dict[str, Any], path: str) -> Store:
    try:
        return Store.open(ptr["location"], create=False)
    except NoRepository as e:
        raise NoRepository(f"{path} points to the repository at {ptr['location']}, which "
                           "does not exist (moved or deleted?)",
                           location=ptr["location"]) from e


def load_checkpoint(path: Union[str, "os.PathLike[str]"], map_location: Any = None,
                    weights_only: Optional[bool] = None) -> Dict[str, Any]:
    """The checkpoint dict the pointer file at ``path`` names, as ``torch.load`` would
    return the file ``TorchCheckpointIO`` writes: tensors bit for bit (dtype, shape, 0-d tensors), on the
    devices ``map_location`` asks for (``None``: where they were saved; a device; a dict
    from saved to wanted device; a callable ``(storage, location)``).

    ``weights_only`` (``None`` means ``True``, as in ``torch.load``): a checkpoint that
    holds pickled objects raises ``PickleRequired`` unless ``weights_only=False``. Reads
    the repository without creating anything (``NoRepository`` where it is gone).
    """
    p = os.fspath(path)
    ptr = read_pointer(p)
    store = _open_for(ptr, p)
    try:
        return _load(store, ptr, p, map_location, weights_only)
    finally:
        store.close()


def load_from_checkpoint(model_class: Any, path: Union[str, "os.PathLike[str]"],
                         map_location: Any = None, hparams_file: Any = None,
                         strict: Optional[bool] = None, weights_only: Optional[bool] = None,
                         **kwargs: Any) -> Any:
    """``model_class.load_from_checkpoint(path, ...)`` for a pointer file: the module
    built from the saved hyper-parameters (``kwargs`` override them), its
    ``on_load_checkpoint`` called, the state dict loaded (``strict`` as in Lightning),
    on the device of the saved tensors (or ``map_location``'s). ``hparams_file``: a
    ``.yaml`` or ``.csv`` file of hyper-parameters to use instead of the saved ones, as
    in Lightning; ``weights_only``: as in :func:`load_checkpoint`."""
    import lightning.pytorch as pl
    from lightning.pytorch.core import saving

    checkpoint = load_checkpoint(path, map_location=map_location or saving._default_map_location,
                                 weights_only=weights_only)
    if hparams_file is not None:
        ext = str(hparams_file).rsplit(".", 1)[-1].lower()
        if ext == "csv":
            hparams: Any = saving.load_hparams_from_tags_csv(hparams_file)
        elif ext in ("yml", "yaml"):
            hparams = saving.load_hparams_from_yaml(hparams_file)
        else:
            raise InvalidArgument(".csv, .yml or .yaml is required for `hparams_file`",
                                  reason="hparams_file")
        checkpoint[model_class.CHECKPOINT_HYPER_PARAMS_KEY] = hparams
    checkpoint.setdefault(model_class.CHECKPOINT_HYPER_PARAMS_KEY, {})
    checkpoint[model_class.CHECKPOINT_HYPER_PARAMS_KEY].update(kwargs)
    if issubclass(model_class, pl.LightningDataModule):
        return saving._load_state(model_class, checkpoint, **kwargs)
    model: Any = saving._load_state(model_class, checkpoint, strict=strict, **kwargs)
    state_dict = checkpoint.get("state_dict") or {}
    torch = _torch()
    device = next((t for t in state_dict.values() if isinstance(t, torch.Tensor)),
                  torch.tensor(0)).device
    return model.to(device)


class _CheckpointIOImpl:
    """The plugin's logic; :data:`CheckpointIO` adds Lightning's base class."""

    def __init__(self, location: Union[str, "os.PathLike[str]"], branch: str = "main",
                 prune: bool = True) -> None:
        super().__init__()
        if not isinstance(branch, str) or not branch:
            raise InvalidArgument("branch must be a non-empty string", reason="branch")
        self.location = _location_of(location)
        self.branch = branch
        self.prune = prune
        self._store: Optional[Store] = None
        self._lock = threading.RLock()
        self._saver: Optional[int] = None  # the thread of the last save
        self._removed_early: set[str] = set()

    @property
    def store(self) -> Store:
        """The store bound to the repository (opened, and created, on first use)."""
        with self._lock:
            if self._store is None or self._store.closed:
                self._store = Store.open(self.location)
            return self._store

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        """Commit ``checkpoint`` as one version on ``branch``, tagged after ``path``'s
        file name, save the repository (durable on return), then write the pointer file
        at ``path``. ``storage_options`` is not supported (``InvalidArgument``)."""
        if storage_options is not None:
            raise InvalidArgument(
                "tensor_history.lightning.CheckpointIO takes no storage_options "
                f"(got {storage_options!r})", reason="storage_options")
        p = os.fspath(path)
        with self._lock:
            self._saver = threading.get_ident()
            _save(self.store, self.branch, checkpoint, p, self.prune)
            key = os.path.abspath(p)
            if key in self._removed_early:
                # AsyncCheckpointIO: Lightning removed this checkpoint while its save was
                # still queued; honour the order in which the calls were made
                self._removed_early.discard(key)
                self._remove_locked(p)
    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint dict the pointer at ``path`` names, its tensors on the devices
        ``map_location`` asks for; pickled objects only with ``weights_only=False`` (see
        the module's :func:`load_checkpoint`)."""
        p = os.fspath(path)
        ptr = read_pointer(p)
        with self._lock:
            if _location_of(ptr["location"]) == self.location:
                store = self.store
                try:
                    store.refresh()
                except TensorHistoryError:
                    pass
                return _load(store, ptr, p, map_location, weights_only)
        return load_checkpoint(p, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the pointer file at ``path`` and its tag (when the tag still names the
        pointer's version), then, with ``prune`` (default), prune the versions no tag,
        branch tip or HEAD holds and save; ``Store.gc`` deletes their data. A missing
        file is not an error (as for ``TorchCheckpointIO``); under ``AsyncCheckpointIO``
        (saves on another thread) a checkpoint removed while its save is still queued is
        removed once that save ends."""
        p = os.fspath(path)
        with self._lock:
            if not os.path.lexists(p):
                if self._saver is not None and self._saver != threading.get_ident():
                    self._removed_early.add(os.path.abspath(p))
                return
            self._remove_locked(p)

    def _remove_locked(self, p: str) -> None:
        ptr = read_pointer(p)
        store = self.store
        own = _location_of(ptr["location"]) == self.location
        os.unlink(p)
        if not own or ptr["tag"] != _tag_for(p):
            return  # a copy of another checkpoint's pointer, or another repository's
        tags = {n: v for n, kind, v in store.refs() if kind == "tag"}
        if ptr["tag"] in tags and store.version_hash(tags[ptr["tag"]]) == ptr["version"]:
            store.delete_tag(ptr["tag"])
            if self.prune:
                store.prune(keep_last=1)
            store.save()

    def teardown(self) -> None:
        """Close the store (saves were durable when they returned)."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


_CLASS: Optional[type] = None


def _checkpoint_io_class() -> type:
    global _CLASS
    if _CLASS is None:
        base = _lightning_base()
        _CLASS = type("CheckpointIO", (_CheckpointIOImpl, base), {
            "__doc__": _CHECKPOINT_IO_DOC, "__module__": __name__})
    return _CLASS


_CHECKPOINT_IO_DOC = """A Lightning ``CheckpointIO`` plugin that keeps every checkpoint as a
version of the tensor-history repository at ``location`` (a path, or an ``s3://`` URL),
committed on ``branch``; the checkpoint file is a small pointer to it.

``Trainer(plugins=[tensor_history.lightning.CheckpointIO("runs/exp")])``. Works with
``ModelCheckpoint`` (top k, ``save_last``, ``every_n_train_steps``),
``trainer.fit(ckpt_path=...)`` and ``AsyncCheckpointIO``. ``prune=False`` keeps every
version in the history when Lightning removes or overwrites a checkpoint (only the tag
goes or moves).
"""


if TYPE_CHECKING:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningBase

    class CheckpointIO(_CheckpointIOImpl, _LightningBase):  # noqa: D101
        ...


def __getattr__(name: str) -> Any:
    if name == "CheckpointIO":
        # Made when first asked for (it subclasses Lightning's), then a module global.
        cls = _checkpoint_io_class()
        globals()["CheckpointIO"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
