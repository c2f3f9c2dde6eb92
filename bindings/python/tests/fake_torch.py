"""A duck-typed stand-in for the parts of torch that tensor_history.torch uses.

Tensors wrap NumPy arrays; `detach()` and `view(dtype)` share storage and the in-place
version counter, in-place ops advance it, and `autograd.graph.increment_version` bumps
it, as in torch. Models and optimizers are plain objects with `state_dict()`,
`param_groups` and `state`. It lets the adapter's logic run without torch installed.
"""

from __future__ import annotations

import types
from collections import defaultdict

import ml_dtypes
import numpy as np


class DType:
    def __init__(self, name: str, np_dtype) -> None:
        self.name, self.np = name, np.dtype(np_dtype)

    def __repr__(self) -> str:
        return f"fake_torch.{self.name}"


float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16)
uint16 = DType("uint16", np.uint16)
uint8 = DType("uint8", np.uint8)
int64 = DType("int64", np.int64)
bool = DType("bool", np.bool_)  # noqa: A001 - mirrors torch.bool
_BY_NP = {d.np: d for d in (float32, float64, bfloat16, uint16, uint8, int64, bool)}


class _Device:
    type = "cpu"

    def __str__(self) -> str:
        return "cpu"


class Tensor:
    def __init__(self, arr: np.ndarray, counter: list | None = None) -> None:
        self._arr = arr
        self._counter = counter if counter is not None else [0]
        self.device = _Device()

    @property
    def _version(self) -> int:
        return self._counter[0]

    @property
    def dtype(self) -> DType:
        return _BY_NP[self._arr.dtype]

    @property
    def shape(self) -> tuple:
        return self._arr.shape

    def numel(self) -> int:
        return self._arr.size

    def element_size(self) -> int:
        return self._arr.itemsize

    def stride(self) -> tuple:
        return tuple(s // self._arr.itemsize for s in self._arr.strides)

    def data_ptr(self) -> int:
        return self._arr.__array_interface__["data"][0]

    def detach(self) -> "Tensor":
        return Tensor(self._arr, self._counter)

    def view(self, dtype: DType) -> "Tensor":
        return Tensor(self._arr.view(dtype.np), self._counter)

    def numpy(self) -> np.ndarray:
        if self.dtype is bfloat16:
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self._arr

    # in-place ops advance the version counter, as torch's do
    def add_(self, other) -> "Tensor":
        self._arr += other._arr if isinstance(other, Tensor) else other
        self._counter[0] += 1
        return self

    def mul_(self, k) -> "Tensor":
        self._arr *= k
        self._counter[0] += 1
        return self


def from_numpy(a: np.ndarray) -> Tensor:
    return Tensor(a)


def _increment_version(t: Tensor) -> None:
    t._counter[0] += 1


autograd = types.SimpleNamespace(graph=types.SimpleNamespace(increment_version=_increment_version))


class Model:
    """Parameters and buffers by state_dict name; `tie` makes two names share storage."""

    def __init__(self, tensors: dict[str, Tensor], tie: dict[str, str] | None = None) -> None:
        self.tensors = dict(tensors)
        for alias, target in (tie or {}).items():
            self.tensors[alias] = self.tensors[target]

    def parameters(self) -> list[Tensor]:
        seen, out = set(), []
        for t in self.tensors.values():
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def state_dict(self, keep_vars: bool = False) -> dict[str, Tensor]:
        if keep_vars:
            return dict(self.tensors)
        return {k: t.detach() for k, t in self.tensors.items()}


class SGD:
    """Momentum SGD whose state appears at the first step, like torch's."""

    def __init__(self, params: list[Tensor], lr: float, momentum: float = 0.9) -> None:
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state: defaultdict = defaultdict(dict)

    def step(self, grads: list[np.ndarray]) -> None:
        g = self.param_groups[0]
        for p, grad in zip(g["params"], grads):
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = Tensor(np.zeros_like(p._arr))
                st["steps"] = 0
            buf = st["momentum_buffer"]
            buf.mul_(g["momentum"]).add_(Tensor(grad.astype(p._arr.dtype)))
            p.add_(Tensor((-g["lr"] * buf._arr.astype(np.float64)).astype(p._arr.dtype)))
            st["steps"] += 1
