"""Shared helpers: dtypes, memory layouts and bitwise comparison."""

from __future__ import annotations

import os

# TensorFlow and JAX read these when first imported: one thread each (the machine is
# small and shared), and quiet logs.
for _k, _v in {"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
               "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
               "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               "JAX_PLATFORMS": "cpu"}.items():
    os.environ.setdefault(_k, _v)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

DTYPES = [
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int8),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.uint8),
    np.dtype(np.uint16),
    np.dtype(np.uint32),
    np.dtype(np.uint64),
]

LAYOUTS = ["C", "F", "strided", "reversed", "misaligned"]
OUT_LAYOUTS = ["C", "F", "strided", "reversed"]


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """Arbitrary bit patterns (NaNs, infinities, negative zeros included), C order."""
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return rng.integers(0, 256, size=n, dtype=np.uint8).view(dtype).reshape(shape)


def with_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """The same values as `a` in another memory layout (a fresh buffer)."""
    if layout == "C":
        return np.array(a, order="C", copy=True)
    if layout == "F":
        return np.array(a, order="F", copy=True)
    if layout == "strided":
        if a.ndim == 0:
            return a.copy()
        big = np.zeros((a.shape[0] * 2,) + a.shape[1:], dtype=a.dtype)
        out = big[::2]
        out[...] = a
        return out
    if layout == "reversed":
        if a.ndim == 0:
            return a.copy()
        big = np.array(a[::-1], order="C", copy=True)
        return big[::-1]
    if layout == "misaligned":
        buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
        out = buf[1:].view(a.dtype).reshape(a.shape) if a.dtype.itemsize > 1 and a.size > 0 else a.copy()
        out[...] = a
        return out
    raise ValueError(layout)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaN payloads and signed zeros included)."""
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
