"""How small any lossless store of a set of checkpoints could be, under two simple models
of their bytes: the floor that `trainers_report.py --floor` puts beside the store's bytes.

Each checkpoint's tensors are coded one tensor at a time, either whole or as a
difference against the same tensor of one earlier checkpoint of the set (whichever is
smallest, chosen per tensor; the store itself takes the previous kept version). A tensor
of `n` elements of `w` bytes is split into `w` byte planes (byte `p` of every element),
as the store's codec splits it; a difference is the wrapping difference of the
elements read as unsigned integers, zigzag-mapped, as the codec's difference delta.
Then:

- `h0`: the order-0 entropy of each plane (the bits per byte that a static entropy
  coder of that plane needs at least, as the codec's zstd stage codes planes);
- `h1`: each plane's entropy given the byte above it in the same element (the top
  plane's order-0), as a context-modelling coder of the planes could reach.

Both are computed over whole tensors (one model per tensor, its table not counted), so
they are below what a coder working chunk by chunk pays; on small tensors the plug-in
estimate of `h1` (65,536 joint counts per plane) runs lower still. They are floors of these
models, not of every conceivable coder: a coder that predicted values from optimizer
arithmetic (Adam's decay of moments, weight decay) could go below them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

import numpy as np

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def flat_tensors(obj: Any, prefix: str = "") -> Dict[str, np.ndarray]:
    """Every torch tensor (or NumPy array) inside nested dicts, lists and tuples, by
    path, as contiguous 1-D arrays."""
    out: Dict[str, np.ndarray] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{prefix}/{i}"))
    elif hasattr(obj, "detach") and hasattr(obj, "numpy"):
        out[prefix] = np.ascontiguousarray(obj.detach().cpu().reshape(-1).numpy())
    elif isinstance(obj, np.ndarray):
        out[prefix] = np.ascontiguousarray(obj.reshape(-1))
    return out


def _entropy_bits(counts: np.ndarray) -> float:
    n = counts.sum()
    if n == 0:
        return 0.0
    p = counts[counts > 0] / n
    return float(-(counts[counts > 0] * np.log2(p)).sum())


def _planes(words: np.ndarray, width: int) -> np.ndarray:
    """(width, n) uint8: byte p of every element, least significant first."""
    return words.view(np.uint8).reshape(-1, width).T


def bound_bytes(words: np.ndarray, width: int) -> Tuple[float, float]:
    """(h0, h1) in bytes of `words` (unsigned integers `width` bytes wide)."""
    planes = _planes(words, width)
    h0 = sum(_entropy_bits(np.bincount(planes[p], minlength=256)) for p in range(width))
    top = planes[width - 1]
    h1 = _entropy_bits(np.bincount(top, minlength=256))
    for p in range(width - 1):
        joint = np.bincount(planes[p + 1].astype(np.uint32) * 256 + planes[p],
                            minlength=65536)
        ctx = np.bincount(planes[p + 1], minlength=256)
        h1 += _entropy_bits(joint) - _entropy_bits(ctx)
    return h0 / 8, h1 / 8


def _words(a: np.ndarray) -> Tuple[np.ndarray, int]:
    width = a.dtype.itemsize
    if width not in _UINT:
        return a.view(np.uint8), 1
    return a.view(_UINT[width]), width


def _zigzag_diff(cur: np.ndarray, base: np.ndarray, width: int) -> np.ndarray:
    d = (cur - base).view(_INT[width])  # wrapping
    bits = 8 * width
    return ((d << 1) ^ (d >> (bits - 1))).view(_UINT[width])


def floor_of(checkpoints: Sequence[Dict[str, np.ndarray]],
             bases: Callable[[int], Iterable[int]]) -> Dict[str, float]:
    """Raw bytes and the `h0` and `h1` floors (bytes) of `checkpoints` (tensors by path,
    in saving order), each tensor coded whole or against the same path in one of the
    checkpoints `bases(i)` names (earlier ones), whichever is smallest."""
    raw = h0 = h1 = 0.0
    for i, ck in enumerate(checkpoints):
        for path, a in ck.items():
            raw += a.nbytes
            if a.size == 0:
                continue
            w, width = _words(a)
            best0, best1 = bound_bytes(w, width)
            for j in bases(i):
                b = checkpoints[j].get(path)
                if b is None or b.dtype != a.dtype or b.shape != a.shape:
                    continue
                bw, _ = _words(b)
                if np.array_equal(bw, w):
                    best0 = best1 = 0.0
                    break
                d0, d1 = bound_bytes(_zigzag_diff(w, bw, width), width)
                best0, best1 = min(best0, d0), min(best1, d1)
            h0 += best0
            h1 += best1
    return {"raw": raw, "h0": h0, "h1": h1}


def earlier(i: int) -> List[int]:
    """Every earlier checkpoint: the most generous choice of bases."""
    return list(range(i))
