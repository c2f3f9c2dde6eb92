"""Version history for TensorFlow variables (and a Keras model's), restored in place.

>>> W = tf.Variable(tf.zeros((5, 5))); b = tf.Variable(tf.zeros(5))
>>> tracker = tensor_history.tf.track([W, b])    # remembers the values, nothing on disk
>>> W.assign(tf.ones((5, 5))); b.assign(tf.ones(5))
>>> tracker.restore(tracker.log()[0].id)          # W and b are zeros again, in place

The same trials, commits, undo, redo, branches and saves as ``tensor_history.torch``:

>>> tracker = tensor_history.tf.track(model, optimizer)  # a tf.Module or a Keras model
>>> with tracker.trial("step") as t:
...     loss = train_step(x, y)                         # eager or a tf.function
...     if loss < best:
...         t.keep(loss=loss)                            # commits the changed chunks only
>>> # left without keep() (or on an exception): every variable whose value changed is
>>> # assigned its old value back.

How it works, and what to know:

- What is tracked: a list (named by ``Variable.name``, or ``<index>/<name>`` when two
  share a name) or a dict name -> variable of ``tf.Variable``s, every variable
  of a ``tf.Module`` (found again at each commit, so variables created after tracking
  are picked up; names are their attribute paths, ``layers/0/w``), or every variable of
  a Keras model (``model.variables``, trainable and not, by structural names the same
  in every process and on every backend: ``dense_1/kernel``, see
  :func:`keras_model_variables`), plus a Keras optimizer's variables
  (``0/iteration``, ``1/learning_rate``, slots as ``dense_1/kernel/momentum``). An
  optimizer that has not been built yet is built by ``track`` over the model's
  trainable variables, as its first ``apply`` would do, so that its state is part of
  the first version. Names in the store: ``model/<name>`` and ``optim/<path>``.
- Restores go through ``Variable.assign``: the same ``tf.Variable`` objects, so graphs,
  ``tf.function``s and optimizers holding them stay valid. Only variables that may
  differ from the target are assigned; a restore first checks that every variable has
  the target's shape and dtype and raises ``TrialError(reason="model structure")``
  before it assigns anything otherwise.
- Variables untouched since the last commit are found without copying them: reading a
  variable gives a tensor that shares its buffer, and TensorFlow's variable updates
  (``assign*``, optimizer kernels, inside ``tf.function`` or not) write into a new
  buffer while another tensor holds the old one (copy on write). The tracker holds the
  tensors it read at the last commit or restore, so a variable whose buffer is the same
  is unchanged, and only the others are compared chunk by chunk. The cost: the first
  update of each variable after a commit copies it once inside TensorFlow (what the
  ``[v.numpy() for v in variables]`` idiom pays, but only for variables that change).
  Variables in TensorFlow's copy-on-read mode (after sparse updates such as
  ``scatter_update``) get a new buffer at each read and are always compared.
  ``trust_versions=False`` compares every variable's bytes.
- The held tensors are also what a trial's revert puts back: a variable TensorFlow
  wrote since the last sync, whose target value is the one it had then (every variable
  in a revert; in a restore, those the target holds as the synced version does), is
  assigned the tensor the tracker held, which the variable then shares: no copy, no
  read of the store, no comparison. Others are compared with the store's values and
  assigned only where they differ. With ``trust_versions=False`` the held tensors are
  not trusted either (a write that bypasses TensorFlow could have changed them).
- Every variable is read by one call of a traced function (traced again when the set of
  variables changes): a commit or a trial costs a few microseconds per variable that
  did not change, where an eager read each costs tens.
- The store ``track`` makes (in memory, or opened at ``path``) has a memory budget of
  ``DEFAULT_BUDGET_MODELS`` (4) times the model's variables' bytes (not the
  optimizer's): versions past it are kept encoded (lossless deltas, see
  ``Store(memory_budget=...)``). Pass ``store=`` to choose another.
- Variables added after tracking (a Keras layer built later, a new attribute of a
  ``tf.Module``) are recorded by the next commit. A trial's revert that meets one puts
  back everything else, then raises ``TrialError(reason="model structure")`` naming it;
  a restore to a version that lacks one raises the same before it changes anything.
- Optimizer variables that a version lacks are left as they are; optimizer
  hyper-parameters that are Python floats (Adam's ``beta_1``) are not recorded (the
  learning rate is a variable and is).
- CPU variables of the numeric dtypes, bfloat16 and float16 included; bool variables
  are stored as bytes.

TensorFlow is imported on first use; nothing here needs it at import time.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._core import Store
from ._errors import TrialError
from ._tracker import DEFAULT_BUDGET_MODELS, AssignTracker, Trial, tracker_store

__all__ = ["DEFAULT_BUDGET_MODELS", "Tracker", "Trial", "keras_model_variables",
           "keras_optimizer_variables", "model_variables", "track", "variables_bytes"]


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _is_keras(obj: Any) -> bool:
    """A Keras 3 model, layer or optimizer (its variables have paths)."""
    return type(obj).__module__.startswith("keras") or any(
        c.__module__.startswith("keras") for c in type(obj).__mro__)


def _unique(pairs: List[Tuple[str, Any]], what: str) -> List[Tuple[str, Any]]:
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise TrialError(f"{what} has several variables named {dup[:5]}; pass a dict "
                         "name -> variable", reason="names")
    return pairs


def _snake(name: str) -> str:
    out = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", out).lower()


def keras_model_variables(model: Any) -> List[Tuple[str, Any]]:
    """(name, variable) of every variable of a Keras model or layer, trainable and not.

    Names are structural, so that they are the same in every process and on every
    backend for the same architecture (Keras's own paths carry global counters,
    ``sequential_3/dense_7/kernel``): each sublayer is named by its class in snake case,
    numbered within its parent (``dense``, ``dense_1``, ``batch_normalization``), and a
    variable by its own name within its layer: ``dense_1/kernel``."""
    names: Dict[int, str] = {}

    def walk(layer: Any, prefix: str) -> None:
        counts: Dict[str, int] = {}
        inner = set()
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            base = _snake(type(sub).__name__)
            k = counts.get(base, 0)
            counts[base] = k + 1
            walk(sub, f"{prefix}{base if k == 0 else f'{base}_{k}'}/")
            inner.update(id(v) for v in sub.variables)
        seen: Dict[str, int] = {}
        for v in layer.variables:
            if id(v) in inner or id(v) in names:
                continue
            k = seen.get(v.name, 0)
            seen[v.name] = k + 1
            names[id(v)] = f"{prefix}{v.name if k == 0 else f'{v.name}_{k}'}"

    walk(model, "")
    return _unique([(names[id(v)], v) for v in model.variables], "the model")


def keras_optimizer_variables(optimizer: Any, trainable: List[Any],
                              model_names: Dict[int, str]) -> List[Tuple[str, Any]]:
    """(name, variable) of a Keras optimizer's variables, building it over `trainable`
    first if it has not been built (as its first ``apply`` would).

    A slot of a model variable is ``<the variable's name>/<slot>`` (``dense/kernel/
    momentum``), others ``<position>/<name>`` (``0/iteration``): the same in every
    process and on every backend for the same model and optimizer class."""
    if not getattr(optimizer, "built", True):
        optimizer.build(trainable)
    keys = sorted(((v.path.replace("/", "_"), model_names[id(v)]) for v in trainable
                   if id(v) in model_names), key=lambda kv: -len(kv[0]))
    out = []
    for i, v in enumerate(optimizer.variables):
        tail = v.path.split("/")[-1]
        for key, name in keys:
            if tail.startswith(key + "_"):
                out.append((f"{name}/{tail[len(key) + 1:]}", v))
                break
        else:
            out.append((f"{i}/{tail}", v))
    return _unique(out, "the optimizer")


def model_variables(obj: Any) -> List[Tuple[str, Any]]:
    """(name, variable) of what ``track`` takes: a dict name -> variable, a Keras model
    (see :func:`keras_model_variables`), a list or tuple of ``tf.Variable``s (named by
    ``Variable.name``, or ``<index>/<name>`` when two share a name), one ``tf.Variable``,
    or a ``tf.Module`` (by attribute paths)."""
    if isinstance(obj, dict):
        return list(obj.items())
    if _is_keras(obj):
        return keras_model_variables(obj)
    tf = _tf()
    if isinstance(obj, (list, tuple)):
        names = [v.name.split(":")[0] for v in obj]
        if len(set(names)) != len(names):  # unnamed variables are all "Variable"
            names = [f"{i}/{n}" for i, n in enumerate(names)]
        return list(zip(names, obj))
    if isinstance(obj, tf.Variable):
        return [(obj.name.split(":")[0], obj)]
    if isinstance(obj, tf.Module):
        pairs = obj._flatten(predicate=lambda x: isinstance(x, tf.Variable), with_path=True)
        return _unique([("/".join(str(p) for p in path), v) for path, v in pairs],
                       "the module")
    raise TypeError("track() takes a tf.Variable, a list or dict of them, a tf.Module or "
                    f"a Keras model, not {type(obj).__name__}")


def variables_bytes(pairs: List[Tuple[str, Any]]) -> int:
    """The bytes of the variables of `pairs` (each once), from their shapes and dtypes:
    what the default memory budget of a tracker is computed from (see
    ``DEFAULT_BUDGET_MODELS``)."""
    seen = set()
    total = 0
    for _, v in pairs:
        if id(v) in seen:
            continue
        seen.add(id(v))
        size = getattr(v.dtype, "size", None)  # a tf.DType; Keras gives the name
        if size is None:
            size = np.dtype(str(v.dtype)).itemsize
        try:
            n = int(np.prod([int(d) for d in v.shape], dtype=np.int64))
        except (TypeError, ValueError):  # a tf.Variable of dynamic shape: its value's
            n = int(np.size(v.numpy()))
        total += n * size
    return total


class Tracker(AssignTracker):
    """History of TensorFlow variables (a list, a dict, a ``tf.Module`` or a Keras model)
    and a Keras optimizer's variables in a :class:`Store`, restored with ``assign``.

    ``resume``: put the store's HEAD into the variables instead of committing them
    (default: when the store's HEAD holds a model, as after ``Store.open``).
    """

    SCALARS_KEY = "_tf.scalars"

    def __init__(
        self,
        variables: Any,
        optimizer: Any = None,
        *,
        store: Optional[Store] = None,
        message: str = "track",
        trust_versions: bool = True,
        resume: Optional[bool] = None,
    ) -> None:
        self.variables = variables
        self.optimizer = optimizer
        # id(variable) -> (token, tensor) of the reads since the last sync, and of the
        # reads whose tokens the last sync recorded (held: TensorFlow copies on write
        # while they are, so they keep the synced values and their buffers' addresses).
        self._pending: Dict[int, Tuple[Any, Any]] = {}
        self._keep: Dict[int, Tuple[Any, Any]] = {}
        # id(variable) -> the tensor the running operation's _live read (nothing has
        # assigned the variable since).
        self._fresh: Dict[int, Any] = {}
        # id(variable) -> the (token, tensor) of _keep that _held_value gave for it, until
        # the restore records the variable's token (see _token).
        self._gave_held: Dict[int, Tuple[Any, Any]] = {}
        self._kinds: Dict[str, np.dtype] = {}
        # (ids of the variables, a concrete function reading them all, the variables)
        self._reader: Optional[Tuple[tuple, Any, list]] = None
        # "model" / "optim" -> (ids of the objects the names were worked out from, those
        # objects, the (name, variable) pairs)
        self._names: Dict[str, Tuple[tuple, list, List[Tuple[str, Any]]]] = {}
        if not self._model_vars():
            raise TrialError("the model has no variables yet; build it first (call it once, "
                             "or model.build(input_shape))", reason="no variables")
        if optimizer is not None:
            self._optim_vars()  # builds a Keras optimizer that has not been built
        super().__init__(store=store, message=message, trust_versions=trust_versions,
                         resume=resume)

    # ---- the variables -----------------------------------------------------------------

    def _cached(self, slot: str, objs: List[Any], make: Any) -> List[Tuple[str, Any]]:
        """``make()``, or what it gave last time for the same `objs` (by identity; the
        cache holds them, so that their ids cannot be reused)."""
        key = tuple(map(id, objs))
        hit = self._names.get(slot)
        if hit is not None and hit[0] == key:
            return hit[2]
        pairs = make()
        self._names[slot] = (key, objs, pairs)
        return pairs

    def _model_vars(self) -> List[Tuple[str, Any]]:
        obj = self.variables
        if not _is_keras(obj):
            return model_variables(obj)
        # Keras's own walk (model.variables) finds the variables; their structural names
        # are worked out again only when those change.
        return self._cached("model", list(obj.variables), lambda: keras_model_variables(obj))

    def _trainable(self) -> List[Any]:
        obj = self.variables
        if hasattr(obj, "trainable_variables"):
            return list(obj.trainable_variables)
        return [v for _, v in self._model_vars() if getattr(v, "trainable", True)]

    def _optim_vars(self, model: Optional[List[Tuple[str, Any]]] = None) -> List[Tuple[str, Any]]:
        """The optimizer's variables by name; `model`: :meth:`_model_vars`, if known."""
        opt = self.optimizer
        if opt is None:
            return []
        if _is_keras(opt):
            pairs = self._model_vars() if model is None else model
            trainable = self._trainable()
            names = {id(v): n for n, v in pairs}
            if not getattr(opt, "built", True):
                return keras_optimizer_variables(opt, trainable, names)  # builds it
            objs = [*opt.variables, None, *trainable, None, *(v for _, v in pairs)]
            return self._cached("optim", objs,
                                lambda: keras_optimizer_variables(opt, trainable, names))
        return _unique([(v.name.split(":")[0], v) for v in opt.variables], "the optimizer")

    def _model_bytes(self) -> int:
        return variables_bytes(self._model_vars())

    def _live(self) -> Tuple[Dict[str, Any], Dict[str, Any], set]:
        self._fresh = {}
        self._gave_held = {}  # (what an operation that raised midway left)
        out: Dict[str, Any] = {}
        seen = set()
        model = self._model_vars()
        for prefix, pairs in (("model/", model), ("optim/", self._optim_vars(model))):
            for key, v in pairs:
                if id(v) in seen:
                    continue
                seen.add(id(v))
                out[prefix + key] = v
        reads = self._read_all(list(out.values()))
        tokens: Dict[str, Any] = {}
        untrusted: set = set()
        for i, (name, v) in enumerate(out.items()):
            tokens[name] = tok = self._token(v) if reads is None else self._token_of(v, reads[i])
            if tok is None:  # 0-d and empty variables: compared, which is cheap
                untrusted.add(name)
        return out, tokens, untrusted

    def _var(self, v: Any) -> Any:
        tf = _tf()
        return v if isinstance(v, tf.Variable) else v.value  # a Keras variable's tf.Variable

    def _read_all(self, variables: List[Any]) -> Optional[List[Any]]:
        """Every variable's value as an eager tensor sharing its buffer, read by one call
        of a concrete function (traced again only when the set of variables changes): a
        few microseconds per variable, where an eager ``read_value`` each costs tens."""
        if not variables:
            return []
        # Keyed by the tracked objects (a built Keras variable keeps its tf.Variable).
        key = tuple(map(id, variables))
        if self._reader is None or self._reader[0] != key:
            tf = _tf()
            tvs = [self._var(v) for v in variables]
            fn = tf.function(lambda: [t.read_value() for t in tvs], autograph=False)
            self._reader = (key, fn.get_concrete_function(), list(variables))
        return self._reader[1]()

    def _read(self, v: Any) -> Any:
        """The variable's value as an eager tensor sharing its buffer: the one read by
        the running operation's ``_live`` (nothing assigned it since), else read now."""
        t = self._fresh.get(id(v))
        return t if t is not None else self._var(v).read_value()

    def _token(self, v: Any) -> Any:
        given = self._gave_held.pop(id(v), None)
        if given is not None:
            # Assigned a held tensor: the variable shares its buffer (unless TensorFlow
            # copied, in copy-on-read mode: then the next read shows another address and
            # the variable is compared), and that tensor holds the synced values.
            self._pending[id(v)] = given
            return given[0]
        return self._token_of(v, self._var(v).read_value())

    def _token_of(self, v: Any, t: Any) -> Any:
        """The token of `t`, just read from `v`: its buffer's address, shape and dtype."""
        self._fresh[id(v)] = t
        a = t._numpy()
        if not isinstance(a, np.ndarray) or not a.size:
            tok = None  # a 0-d value comes as a NumPy scalar (a copy): always compared
        else:
            tok = (a.__array_interface__["data"][0], a.shape, a.dtype.str)
        self._pending[id(v)] = (tok, t)  # held: the buffer cannot be reused while we compare
        return tok

    def _synced_now(self) -> None:
        self._keep, self._pending = self._pending, {}
        self._gave_held = {}

    def _held_value(self, name: str, var: Any) -> Any:
        """The tensor read at the last sync, when its token is the one recorded for
        `name` (TensorFlow copied on write since: it still holds the synced values)."""
        kept = self._keep.get(id(var))
        if kept is None or kept[0] is None or kept[0] != self._synced.get(name):
            return None
        self._gave_held[id(var)] = kept
        return kept[1]

    def _np(self, name: str, v: Any) -> np.ndarray:
        """A read-only NumPy view of the variable's current buffer (bool as uint8)."""
        t = self._read(v)
        if t.device and not t.device.endswith("CPU:0"):
            raise TrialError(f"`{name}` is on {t.device}; only CPU variables are tracked",
                             reason="device")
        a = np.asarray(t._numpy())
        self._kinds.setdefault(name, a.dtype)
        if a.dtype == np.bool_:
            a = a.view(np.uint8)
        a = a.view()
        a.flags.writeable = False
        return a

    def _assign(self, name: str, var: Any, value: Any) -> None:
        """Assign a NumPy array (shape and dtype checked against the target; bool stored
        as bytes) or a held tensor (which the variable then shares: no copy)."""
        if isinstance(value, np.ndarray) and self._kinds.get(name) == np.bool_:
            value = value.view(np.bool_)
        self._fresh.pop(id(var), None)
        self._var(var).assign(value)

    def _plain(self, key: str, v: Any) -> Any:
        if hasattr(v, "numpy") and not isinstance(v, (bool, int, float, str)):
            a = np.asarray(v.numpy())
            if a.size != 1:
                raise TypeError(f"metadata `{key}` is a tensor of {a.size} elements; give a "
                                "bool, int, float or str (or a one-element tensor)")
            return a.reshape(()).item()
        return v


def track(variables: Any, optimizer: Any = None, *,
          path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Tracker:
    """Start tracking TensorFlow `variables` (a ``tf.Variable``, a list or dict of them, a
    ``tf.Module`` or a Keras model) and a Keras `optimizer`; returns a :class:`Tracker`.

    Without `path`: commits their current values in a new in-memory store (nothing is
    written to disk). With `path`: opens (or creates) the repository there; if it holds
    a history, its HEAD is assigned to the variables (resume), else their values are
    committed; call ``tracker.save()`` to write new versions. The store gets a memory
    budget of ``DEFAULT_BUDGET_MODELS`` (4) times the bytes of `variables` (pass
    ``store=`` to choose another). Other keyword arguments go to :class:`Tracker`."""
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        kwargs["store"] = tracker_store(path, variables_bytes(model_variables(variables)))
    return Tracker(variables, optimizer, **kwargs)
