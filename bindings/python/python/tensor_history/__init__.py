"""tensor_history: version history for named arrays, in memory and on disk.

Commits are O(1) and share unchanged chunks; restore, undo and redo repoint to any
version and can write it back into your arrays in place, only where chunks differ.

>>> import numpy as np, tensor_history as th
>>> store = th.Store()
>>> store.insert("w", np.zeros(4, dtype=np.float32))
>>> v0 = store.commit("init")
>>> store.write("w", np.ones(4, dtype=np.float32)).chunks_changed
1
>>> v1 = store.commit("ones")
>>> w = store.get("w")
>>> _ = store.restore(v0, into={"w": w})
>>> w.tolist()
[0.0, 0.0, 0.0, 0.0]

``store.save_as(path)`` writes the history to a directory (only chunks it lacks, crash
safe); ``Store.open(path)`` brings it back, mapping chunk data on first use.
"""

from __future__ import annotations

# ml_dtypes registers NumPy's `bfloat16` dtype, which the core looks up by name.
import ml_dtypes as _ml_dtypes  # noqa: F401

from . import _errors
from ._core import (
    DEFAULT_CHUNK_BYTES,
    Change,
    GcStats,
    LogEntry,
    OpenFallback,
    PartStats,
    PendingSave,
    PruneStats,
    RefreshStats,
    SaveStats,
    Snapshot,
    Stats,
    Store,
    Version,
    WriteStats,
)
from ._errors import *  # noqa: F401,F403

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Change",
    "GcStats",
    "LogEntry",
    "OpenFallback",
    "PartStats",
    "PendingSave",
    "PruneStats",
    "RefreshStats",
    "SaveStats",
    "Snapshot",
    "Stats",
    "Store",
    "Version",
    "WriteStats",
    *[n for n in dir(_errors) if isinstance(getattr(_errors, n), type)
      and issubclass(getattr(_errors, n), Exception)],
]


def __getattr__(name: str):
    # The framework modules import their framework lazily, on first use of the attribute.
    if name in ("torch", "tf", "keras", "jax", "lightning", "ray"):
        import importlib

        return importlib.import_module("." + name, __name__)
    if name in _errors._DEPRECATED:
        return getattr(_errors, name)  # warns
    raise AttributeError(f"module 'tensor_history' has no attribute {name!r}")
