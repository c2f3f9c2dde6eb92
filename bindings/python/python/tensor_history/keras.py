"""Version history for a Keras 3 model and optimizer on any backend, restored in place.

>>> tracker = tensor_history.keras.track(model, optimizer)   # a built model
>>> with tracker.trial("step") as t:
...     loss = model.train_on_batch(x, y)                    # or any custom step
...     if loss < best:
...         t.keep(loss=loss)
>>> # left without keep(): every variable whose value changed is assigned its old value.

The same trials, commits, undo, redo, branches and saves as ``tensor_history.tf``, over
``model.variables`` (trainable and not) and ``optimizer.variables``, on the backend
Keras runs on (``KERAS_BACKEND=tensorflow|jax|torch``). Names in the store are the
variables' Keras paths (``variable.path``), the same on every backend:
``model/sequential/hidden/kernel`` for a ``Dense`` layer named ``hidden``,
``optim/adam/iteration``, ``optim/adam/sequential_hidden_kernel_momentum``; a path that
several variables share is numbered ``<path>#1``, ... after the first, in the order of
``model.variables`` (see :func:`tensor_history.tf.keras_model_variables`). A history
saved under one backend opens under another. The same architecture built again has
other paths where Keras named the layers with its process-wide counter
(``sequential_1/dense_2/kernel``): resuming a history matches those by structure, and
the tracker goes on under the history's names (so too for histories written under
the structural names of earlier versions, ``model/dense_1/kernel``). An optimizer not
built yet is built by ``track`` over the model's trainable variables, as its first
step would.

How unchanged variables are found without copying them, per backend:

- tensorflow: the variable's buffer (TensorFlow copies on write while the tracker holds
  the tensor it read at the last sync), as in ``tensor_history.tf``; a variable in
  TensorFlow's copy-on-read mode (an embedding table updated by SGD's sparse step,
  any ``scatter_*`` or ``tf.gather`` of it) is compared by bytes.
- jax: the identity of the variable's value (a new immutable array at every update;
  the tracker holds the arrays it synced).
- torch: the tensor's storage, layout and in-place version counter, as in
  ``tensor_history.torch``.

Restores go through ``Variable.assign`` (the same Keras variables, so a compiled model
and its optimizer stay valid), only for variables whose values differ, after checking
that every variable has the target's shape and dtype (``TrialError(reason="model
structure")`` before anything is assigned otherwise). On the tensorflow backend a
trial's revert gives each variable TensorFlow wrote back the tensor held since the last
sync, without a copy, and every variable is read by one traced call, as in
``tensor_history.tf``.

The store ``track`` makes (in memory, or opened at ``path``) has a memory budget of
``DEFAULT_BUDGET_STATES`` (4) tracked states (the model's variables and the
optimizer's), raised as the state grows; versions past it are kept encoded. Pass
``store=`` to choose another.

Buffer donation on the JAX backend: Keras's JAX trainer (``fit``, ``train_on_batch``)
passes the variables' arrays to a jitted step that donates them, so an array the tracker
held from the last sync may be deleted by the next step. The tracker never reads those
arrays (it only compares their identity with the variables' current values, and reads
the current values and the store), so donation costs nothing and breaks nothing. Inside
``fit`` the Keras variables are only brought up to date at the end of an epoch or when
a callback asks for them: commit or start trials between ``fit`` / ``train_on_batch``
calls, not from inside a jitted step.

Keras is imported on first use; nothing here needs it at import time.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Union

import numpy as np

from ._core import Store
from ._errors import TrialError
from ._tracker import AUTO_BUDGET, DEFAULT_BUDGET_MODELS, DEFAULT_BUDGET_STATES, Trial, tracker_store
from .tf import Tracker as _TfTracker
from .tf import model_variables, variables_bytes

__all__ = ["DEFAULT_BUDGET_MODELS", "DEFAULT_BUDGET_STATES", "Tracker", "Trial", "track"]


def backend() -> str:
    """The backend Keras runs on (``tensorflow``, ``jax`` or ``torch``)."""
    import keras

    return keras.backend.backend()


class Tracker(_TfTracker):
    """History of a Keras model's variables and its optimizer's in a :class:`Store`,
    restored with ``assign``, on the backend Keras runs on. Usually made by
    :func:`track`.

    Args:
        model: the ``keras.Model`` whose variables are tracked.
        optimizer: a Keras optimizer whose variables and hyper-parameters are tracked
            too (``None``: the model only).
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        trust_versions: skip, without comparing, tensors whose identity token (version
            counter, buffer) is unchanged since the last sync (default); ``False``
            compares every tensor's bytes.
        resume: put the store's HEAD into the model and optimizer instead of committing
            (default: when HEAD holds a model, as after ``Store.open``).
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.

    Raises:
        TrialError: ``resume=True`` and the store holds no model.
        TypeError: ``memory_budget`` together with ``store``.
        TrialError: Keras runs on a backend other than tensorflow, jax or torch.
    """

    SCALARS_KEY = "_keras.scalars"

    def __init__(self, model: Any, optimizer: Any = None, *, store: Optional[Store] = None,
                 message: str = "track", trust_versions: bool = True,
                 resume: Optional[bool] = None, memory_budget: Any = AUTO_BUDGET) -> None:
        self.backend = backend()
        if self.backend not in ("tensorflow", "jax", "torch"):
            raise TrialError(f"the Keras backend {self.backend!r} is not supported "
                             "(tensorflow, jax or torch)", reason="backend")
        super().__init__(model, optimizer, store=store, message=message,
                         trust_versions=trust_versions, resume=resume,
                         memory_budget=memory_budget)

    @property
    def model(self) -> Any:
        """The tracked ``keras.Model``."""
        return self.variables

    def _trainable(self) -> List[Any]:
        return list(self.variables.trainable_variables)

    # ---- per-backend reads and identity tokens -----------------------------------------

    def _read_all(self, variables: List[Any]) -> Optional[List[Any]]:
        if self.backend == "tensorflow":
            return super()._read_all(variables)
        return None  # reading a JAX or torch value costs nothing: per variable

    def _read(self, v: Any) -> Any:
        if self.backend == "tensorflow":
            return super()._read(v)
        return v.value

    def _token(self, v: Any) -> Any:
        if self.backend == "tensorflow":
            return super()._token(v)
        value = v.value
        if self.backend == "jax":
            tok: Any = id(value)
        else:
            tok = (value._version, value.data_ptr(), tuple(value.shape), value.stride(),
                   value.dtype)
        self._pending[id(v)] = (tok, value)  # held: its identity or storage cannot be reused
        return tok

    def _held_value(self, name: str, var: Any) -> Any:
        if self.backend == "tensorflow":
            return super()._held_value(name, var)
        return None  # the store's values (a torch tensor held is written in place)

    def _np(self, name: str, v: Any) -> np.ndarray:
        if self.backend == "tensorflow":
            return super()._np(name, v)
        value = self._read(v)
        if self.backend == "jax":
            from .jax import leaf_to_numpy

            a = leaf_to_numpy(value)
        else:
            import torch

            t = value.detach()
            if t.device.type != "cpu":
                raise TrialError(f"`{name}` is on {t.device}; only CPU variables are tracked",
                                 reason="device")
            if t.dtype == torch.bfloat16:
                import ml_dtypes

                a = t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
            elif t.dtype == torch.bool:
                a = t.view(torch.uint8).numpy()
            else:
                a = t.numpy()
            self._kinds.setdefault(name, np.dtype(np.bool_) if t.dtype == torch.bool else a.dtype)
            a = a.view()
            a.flags.writeable = False
        return a

    def _assign(self, name: str, var: Any, value: np.ndarray) -> None:
        if self.backend == "tensorflow":
            return super()._assign(name, var, value)
        if str(var.dtype) == "bool":
            value = value.view(np.bool_)
        var.assign(value)


def track(model: Any, optimizer: Any = None, *,
          path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Tracker:
    """Start tracking a built Keras `model` (and `optimizer`); returns a :class:`Tracker`.

    Without `path`: commits the current values in a new in-memory store. With `path`:
    opens (or creates) the repository there; if it holds a history, its HEAD is assigned
    to the model and optimizer (resume), else their values are committed; call
    ``tracker.save()`` to write new versions. The store gets a memory budget of
    ``DEFAULT_BUDGET_STATES`` (4) tracked states (the model's variables and the
    optimizer's), or ``memory_budget`` bytes (``None``: none; or pass ``store=``). Other
    keyword arguments go to :class:`Tracker`. Raises ``CorruptObject`` when the
    repository's HEAD does not read."""
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        kwargs["store"] = tracker_store(path, variables_bytes(model_variables(model)),
                                        kwargs.pop("memory_budget", AUTO_BUDGET))
    return Tracker(model, optimizer, **kwargs)
