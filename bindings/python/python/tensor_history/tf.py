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
  a Keras model (``model.variables``, trainable and not), plus a Keras optimizer's
  variables. Names in the store: ``model/<name>`` and ``optim/<name>``. Several models
  are tracked as one model that holds them (a list or dict of models raises
  ``TypeError``).
- A Keras model's variables are named by their Keras paths (``variable.path``:
  ``model/sequential/hidden/kernel`` for a ``Dense`` layer named ``hidden``), its
  optimizer's by theirs (``optim/adam/iteration``,
  ``optim/adam/sequential_hidden_kernel_momentum``), so a history reads by the model's
  own names in any process, framework or Keras backend. A path that several variables
  share (two sublayers given the same name; Adafactor's moments) is kept by the first
  and numbered ``<path>#1``, ``<path>#2`` for the others, in the order of
  ``model.variables`` / ``optimizer.variables`` (see :func:`keras_model_variables`).
  Keras numbers the layers it names itself with a process-wide counter, so the same
  architecture built again (in the same process, or after other models) has other
  paths (``sequential_1/dense_2/kernel``): a tracker that resumes a history (``track(...,
  path=)`` or ``store=``) matches such names by structure and goes on under the
  history's names, as it goes on under the structural names earlier versions wrote
  (``model/dense_1/kernel``, ``optim/dense_1/kernel/momentum``, ``optim/0/iteration``;
  see :func:`keras_structural_variables`).
- The Keras optimizer of plain ``tf.Variable``s (a ``tf.Module`` trained with
  ``keras.optimizers``): its slots are named after the variables' store names
  (``optim/layers/0/momentum``, ``optim/w/velocity``; see
  :func:`keras_optimizer_slots`), its other variables by position (``optim/0/iteration``,
  ``optim/1/learning_rate``).
- An optimizer that has not been built yet is built by ``track`` over the model's
  trainable variables, as its first ``apply`` would do, so that its state is part of
  the first version.
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
  ``trust_versions=False`` compares every variable's bytes.
- A variable that has been read or written sparsely (``tf.gather`` or
  ``embedding_lookup`` of it, ``sparse_read``, any ``scatter_*``, an optimizer step with
  a sparse gradient such as an embedding's) is in TensorFlow's copy-on-read mode from
  then on: every read gives a new copy, so its buffer proves nothing. The tracker reads
  every variable twice in its traced read (two reads of a variable share a buffer
  unless it is in that mode) and compares those variables by bytes, at each commit,
  trial and ``is_dirty()``: a cost of O(their bytes) each time, what copy-on-read
  already costs each read.
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
  ``DEFAULT_BUDGET_STATES`` (4) tracked states (the model's variables and the
  optimizer's), raised as the state grows: versions past it are kept encoded (lossless
  deltas, see ``Store(memory_budget=...)``). Pass ``store=`` to choose another.
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
from ._tracker import (AUTO_BUDGET, DEFAULT_BUDGET_MODELS, DEFAULT_BUDGET_STATES, AssignTracker,
                       Trial, tracker_store)

__all__ = ["DEFAULT_BUDGET_MODELS", "DEFAULT_BUDGET_STATES", "Tracker", "Trial", "keras_model_variables",
           "keras_optimizer_slots", "keras_optimizer_variables",
           "keras_structural_optimizer_variables", "keras_structural_variables",
           "model_variables", "track", "variables_bytes"]


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


def _keras_path(v: Any) -> str:
    """A Keras variable's path (a plain ``tf.Variable``, which has none: its name)."""
    path = getattr(v, "path", None)
    return path if isinstance(path, str) else str(v.name)


def _numbered(variables: List[Any]) -> List[Tuple[str, Any]]:
    """(name, variable) by Keras path; a path that several variables share is kept by
    the first and numbered ``<path>#<k>`` for the k-th repeat, in the order given (the
    smallest k free, should a path end in ``#<k>`` itself)."""
    paths = [_keras_path(v) for v in variables]
    taken = set(paths)
    seen: Dict[str, int] = {}
    out = []
    for p, v in zip(paths, variables):
        k = seen.get(p, 0)
        if k == 0:
            name = p
            k = 1
        else:
            while f"{p}#{k}" in taken:
                k += 1
            name = f"{p}#{k}"
            taken.add(name)
            k += 1
        seen[p] = k
        out.append((name, v))
    return out


def keras_model_variables(model: Any) -> List[Tuple[str, Any]]:
    """(name, variable) of every variable of a Keras model or layer, trainable and not,
    named by its Keras path (``variable.path``: ``sequential/hidden/kernel`` for a
    ``Dense`` layer named ``hidden``), so that a history reads by the model's own names
    in any process, framework or backend. Keras' paths are not always unique (two
    sublayers given the same name): a path that several variables share is kept by the
    first and numbered ``<path>#1``, ``<path>#2``, ... for the others, in the order of
    ``model.variables``.

    Keras numbers the names of layers it names itself with a process-wide counter
    (``dense``, then ``dense_1``, ...), so the same architecture built again has other
    paths: a tracker that resumes a history matches those by structure (see
    :class:`Tracker`)."""
    return _numbered(list(model.variables))


def keras_structural_variables(model: Any) -> List[Tuple[str, Any]]:
    """(name, variable) of every variable of a Keras model or layer by the structural
    names earlier versions stored them under; kept to read the histories they wrote.

    Each sublayer is named by its class in snake case, numbered within its parent
    (``dense``, ``dense_1``, ``batch_normalization``), and a variable by its own name
    within its layer: ``dense_1/kernel``."""
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


def _built(optimizer: Any, trainable: List[Any]) -> None:
    if not getattr(optimizer, "built", True):
        optimizer.build(trainable)


def _slot_key(v: Any) -> str:
    """What a Keras optimizer puts before a slot's name in the slot's variable name (see
    ``add_variable_from_reference``): the model variable's path, or a plain
    ``tf.Variable``'s name, with ``/`` and ``:`` as ``_``."""
    path = getattr(v, "path", None)
    if isinstance(path, str):
        return path.replace("/", "_")
    return str(v.name).replace("/", "_").replace(":", "_")


def keras_optimizer_slots(optimizer: Any, trainable: List[Any]) -> List[Tuple[Any, Any, str]]:
    """(variable, the model variable it is a slot of or ``None``, its slot's name, or its
    own name past the last ``/`` when it is not a slot) for every variable of a Keras
    optimizer, building it over `trainable` first if it has not been built.

    Keras names a slot ``<the model variable's path or name>_<slot>``: plain
    ``tf.Variable``s are all ``Variable:0`` unless named, so a name alone does not tell
    which variable a slot belongs to. The optimizer builds its slots in the order of
    the variables it was built over (``optimizer._trainable_variables``, else
    `trainable`), so the k-th slot ``momentum`` of the variables named ``Variable:0`` is
    that of the k-th of them."""
    _built(optimizer, trainable)
    over = list(getattr(optimizer, "_trainable_variables", None) or trainable)
    groups: Dict[str, List[Any]] = {}
    for r in over:
        if not getattr(r, "overwrite_with_gradient", False):  # such variables get no slots
            groups.setdefault(_slot_key(r), []).append(r)
    keys = sorted(groups, key=len, reverse=True)  # "a_b" before "a"
    used: Dict[Tuple[str, str], int] = {}
    out: List[Tuple[Any, Any, str]] = []
    for v in optimizer.variables:
        leaf = _keras_path(v).split("/")[-1]
        for key in keys:
            if leaf.startswith(key + "_"):
                slot = leaf[len(key) + 1:]
                j = used.get((key, slot), 0)
                if j < len(groups[key]):
                    used[(key, slot)] = j + 1
                    out.append((v, groups[key][j], slot))
                    break
        else:
            out.append((v, None, leaf))
    return out


def keras_optimizer_variables(optimizer: Any, trainable: List[Any],
                              model_names: Optional[Dict[int, str]] = None
                              ) -> List[Tuple[str, Any]]:
    """(name, variable) of a Keras optimizer's variables, building it over `trainable`
    first if it has not been built (as its first ``apply`` would).

    Without `model_names` (the optimizer of a Keras model): by Keras path, numbered as
    :func:`keras_model_variables` numbers paths that repeat (``adam/iteration``,
    ``adam/sequential_hidden_kernel_momentum``). With `model_names` (id(variable) ->
    store name; the optimizer of plain ``tf.Variable``s, which have no paths): a slot is
    ``<its variable's store name>/<slot>`` (``layers/0/momentum``, see
    :func:`keras_optimizer_slots`), another variable ``<position>/<name>``
    (``0/iteration``)."""
    if model_names is None:
        _built(optimizer, trainable)
        return _numbered(list(optimizer.variables))
    out = []
    for i, (v, ref, leaf) in enumerate(keras_optimizer_slots(optimizer, trainable)):
        if ref is not None and id(ref) in model_names:
            out.append((f"{model_names[id(ref)]}/{leaf}", v))
        else:
            out.append((f"{i}/{leaf}", v))
    return _unique(out, "the optimizer")


def keras_structural_optimizer_variables(optimizer: Any, trainable: List[Any],
                                         model_names: Dict[int, str]) -> List[Tuple[str, Any]]:
    """(name, variable) of a Keras optimizer's variables by the structural names earlier
    versions stored them under (`model_names`: id(variable) -> the structural names of
    :func:`keras_structural_variables`; `trainable`: the model's trainable variables,
    which the optimizer's slots follow); kept to read the histories they wrote.

    A slot of a model variable is ``<the variable's name>/<slot>`` (``dense/kernel/
    momentum``), others ``<position>/<name>`` (``0/iteration``)."""
    _built(optimizer, trainable)
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


_COUNTER = re.compile(r"^(.*)_(\d+)$")
_REPEAT = re.compile(r"^(.*)#(\d+)$")


def _counter_free(paths: List[str]) -> Dict[str, tuple]:
    """path -> its components with Keras' counters replaced by ranks: a component
    ``<base>_<n>`` (or ``<base>``, n = 0) is (base, its rank by n among the components
    of that base under the same parent). ``sequential_3/dense_7/kernel`` and
    ``sequential/dense/kernel`` both give ``((sequential, 0), (dense, 0), (kernel, 0))``
    when each is the first of its base in its model. Injective over `paths`."""
    split = {p: tuple(p.split("/")) for p in dict.fromkeys(paths)}
    children: Dict[tuple, set] = {}
    for parts in split.values():
        for i in range(len(parts)):
            children.setdefault(parts[:i], set()).add(parts[i])
    rank: Dict[tuple, tuple] = {}
    for parent, comps in children.items():
        bases: Dict[str, list] = {}
        for c in comps:
            m = _COUNTER.match(c)
            base, n = (m.group(1), int(m.group(2))) if m else (c, 0)
            bases.setdefault(base, []).append((n, c))
        for base, items in bases.items():
            for r, (_, c) in enumerate(sorted(items)):
                rank[parent + (c,)] = (base, r)
    return {p: tuple(rank[parts[:i + 1]] for i in range(len(parts)))
            for p, parts in split.items()}


def _optimizer_keys(names: List[str], model: List[str]) -> Dict[str, tuple]:
    """Optimizer name -> a key free of Keras' counters, read from the names alone: the
    path's parents by :func:`_counter_free`, and its last component as the slot of a
    model variable (by that variable's key) when it is ``<the variable's path with _>_
    <slot>``, else as it is; a repeat number (``#k``) is kept."""
    model_keys = _counter_free(model)
    refs = sorted(((m.replace("/", "_"), model_keys[m]) for m in model if "#" not in m),
                  key=lambda kv: -len(kv[0]))
    parsed = {}
    for n in names:
        m = _REPEAT.match(n)
        base, repeat = (m.group(1), int(m.group(2))) if m else (n, 0)
        parent, _, leaf = base.rpartition("/")
        for key, ref in refs:
            if leaf.startswith(key + "_"):
                what: tuple = ("slot", ref, leaf[len(key) + 1:])
                break
        else:
            what = ("var", leaf)
        parsed[n] = (parent, what, repeat)
    parents = _counter_free([p for p, _, _ in parsed.values() if p])
    return {n: (parents.get(p, ()), what, repeat) for n, (p, what, repeat) in parsed.items()}


def _distinct(names: List[str], alias: Dict[str, str]) -> Dict[str, str]:
    """`alias`, if it leaves `names` distinct, else nothing (names keep their paths)."""
    renamed = [alias.get(n, n) for n in names]
    return alias if len(set(renamed)) == len(renamed) else {}


def _match(live: Dict[str, tuple], stored: Dict[str, tuple]) -> Dict[str, str]:
    """live name -> stored name of the same key, for keys that one name holds on each
    side (and only where the names differ)."""
    def by_key(d: Dict[str, tuple]) -> Dict[tuple, str]:
        count: Dict[tuple, int] = {}
        for k in d.values():
            count[k] = count.get(k, 0) + 1
        return {k: n for n, k in d.items() if count[k] == 1}

    theirs = by_key(stored)
    return {n: theirs[k] for k, n in by_key(live).items() if k in theirs and theirs[k] != n}


def _variables_only(pairs: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """`pairs`, or ``TypeError`` naming an entry that is not a variable (a model)."""
    for key, v in pairs:
        if not (hasattr(v, "assign") and hasattr(v, "shape") and hasattr(v, "dtype")):
            raise TypeError(
                f"track() takes a list or dict of variables, and entry {key!r} is a "
                f"{type(v).__name__}; to track several models, track one model that holds "
                "them (a keras.Model or tf.Module with them as attributes)")
    return pairs


def model_variables(obj: Any) -> List[Tuple[str, Any]]:
    """(name, variable) of `obj`, what ``track`` takes: a dict name -> variable, a Keras
    model (see :func:`keras_model_variables`), a list or tuple of ``tf.Variable``s (named by
    ``Variable.name``, or ``<index>/<name>`` when two share a name), one ``tf.Variable``,
    or a ``tf.Module`` (by attribute paths).

    A list or dict must hold variables: several models (whose variables could share
    names: two Keras models of the same layer names have the same paths) raise
    ``TypeError``; track one model that holds them (a ``keras.Model`` or ``tf.Module``
    with them as attributes), whose repeated paths are numbered."""
    if isinstance(obj, dict):
        return _variables_only(list(obj.items()))
    if _is_keras(obj):
        return keras_model_variables(obj)
    tf = _tf()
    if isinstance(obj, (list, tuple)):
        _variables_only([(str(i), v) for i, v in enumerate(obj)])
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
    ``DEFAULT_BUDGET_STATES``)."""
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


def _address(t: Any) -> int:
    """The address of an eager tensor's buffer."""
    a = t._numpy()
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else 0


class Tracker(AssignTracker):
    """History of TensorFlow variables (a list, a dict, a ``tf.Module`` or a Keras model)
    and a Keras optimizer's variables in a :class:`Store`, restored with ``assign``.

    A Keras model's variables are named by Keras path (:func:`keras_model_variables`),
    unless the store's HEAD holds the model under other names: the structural names
    of earlier versions (:func:`keras_structural_variables`), or the paths of the same
    architecture numbered otherwise by Keras' counters; the tracker then names the
    variables as the history does (see :meth:`_adopt_names`). Usually made by
    :func:`track`.

    Args:
        variables: what is tracked: a list or dict of ``tf.Variable``s, one variable, a
            ``tf.Module`` or a Keras model (see :func:`model_variables`).
        optimizer: a Keras optimizer whose variables and hyper-parameters are tracked
            too (``None``: the variables only).
        store: the :class:`Store` to keep the history in (default: a new in-memory
            store with the default memory budget, see ``memory_budget``).
        message: the message of the first commit (when the tracker does not resume).
        trust_versions: skip, without comparing, tensors whose identity token (version
            counter, buffer) is unchanged since the last sync (default); ``False``
            compares every tensor's bytes.
        resume: put the store's HEAD into the variables instead of committing (default:
            when HEAD holds a model, as after ``Store.open``).
        memory_budget: bytes of history the store the tracker makes may hold in memory
            (default: ``DEFAULT_BUDGET_STATES`` tracked states; ``None``: no budget). Not
            with ``store=``: set ``Store(memory_budget=...)`` there.

    Raises:
        TrialError: ``resume=True`` and the store holds no model.
        TypeError: ``memory_budget`` together with ``store``.
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
        memory_budget: Any = AUTO_BUDGET,
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
        # A Keras model's names: by Keras path ("path") or by the structural names of
        # the history the tracker resumed ("structural"); and "model" / "optim" -> path
        # -> the name the history holds that variable under (see _adopt_names).
        self._naming = "path"
        self._alias: Dict[str, Dict[str, str]] = {}
        if not self._model_vars():
            raise TrialError("the model has no variables yet; build it first (call it once, "
                             "or model.build(input_shape))", reason="no variables")
        if optimizer is not None:
            self._optim_vars()  # builds a Keras optimizer that has not been built
        if store is not None:
            self._adopt_names(store)
        super().__init__(store=store, message=message, trust_versions=trust_versions,
                         resume=resume, memory_budget=memory_budget)

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

    def _adopt_names(self, store: Store) -> None:
        """Name a Keras model's variables as the history in `store` does, when its HEAD
        holds a model under other names than the variables' Keras paths:

        - the structural names earlier versions wrote (:func:`keras_structural_variables`,
          ``model/dense_1/kernel``): the tracker goes on under those;
        - the paths of the same architecture with other numbers from Keras' counters
          (``sequential_2/dense_5/kernel`` for ``sequential/dense/kernel``: the model built
          again in one process, or built after others): matched by structure (the
          counters of a name's components ranked among its siblings; a slot of the
          optimizer by its variable's match), and the tracker goes on under the
          history's names. Variables that match no name keep their paths (a restore
          then names them, as for any model of another structure).

        Reads only the names of HEAD's snapshot."""
        obj = self.variables
        head = store.head()
        if not _is_keras(obj) or head is None:
            return
        stored = store.snapshot(head).keys()
        model = [n[len("model/"):] for n in stored if n.startswith("model/")]
        live = [n for n, _ in self._model_vars()]
        if not model or set(live) <= set(model):
            return
        self._names = {}
        if {n for n, _ in keras_structural_variables(obj)} <= set(model):
            self._naming = "structural"
            return
        self._alias["model"] = _distinct(live, _match(_counter_free(live),
                                                      _counter_free(model)))
        if self.optimizer is not None and _is_keras(self.optimizer):
            optim = [n[len("optim/"):] for n in stored if n.startswith("optim/")]
            mine = [n for n, _ in keras_optimizer_variables(self.optimizer, self._trainable())]
            self._alias["optim"] = _distinct(mine, _match(_optimizer_keys(mine, live),
                                                          _optimizer_keys(optim, model)))

    def _aliased(self, slot: str, pairs: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
        """`pairs` under the history's names (see :meth:`_adopt_names`); a variable added
        since keeps its path (unless that is a name taken: a typed error)."""
        alias = self._alias.get(slot)
        if not alias:
            return pairs
        return _unique([(alias.get(n, n), v) for n, v in pairs],
                       "the model" if slot == "model" else "the optimizer")

    def _model_vars(self) -> List[Tuple[str, Any]]:
        obj = self.variables
        if not _is_keras(obj):
            return model_variables(obj)
        # Keras's own walk (model.variables) finds the variables; their names are worked
        # out again only when those change.
        if self._naming == "structural":
            return self._cached("model", list(obj.variables),
                                lambda: keras_structural_variables(obj))
        return self._cached("model", list(obj.variables),
                            lambda: self._aliased("model", keras_model_variables(obj)))

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

            def make() -> List[Tuple[str, Any]]:
                if not _is_keras(self.variables):  # plain tf.Variables: by their names
                    return keras_optimizer_variables(opt, trainable, names)
                if self._naming == "structural":
                    return keras_structural_optimizer_variables(opt, trainable, names)
                return self._aliased("optim", keras_optimizer_variables(opt, trainable))

            if not getattr(opt, "built", True):
                return make()  # builds it
            objs = [*opt.variables, None, *trainable, None, *(v for _, v in pairs)]
            return self._cached("optim", objs, make)
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
        synced = self._synced
        count = len(out)
        for i, (name, v) in enumerate(out.items()):
            if reads is None:
                tok = self._token(v)
            else:
                tok = self._token_of(v, reads[i])
                # A buffer other than the synced one: written since, or TensorFlow's
                # copy-on-read mode, where every read is a new copy (the second read
                # shows it). The latter are compared by bytes.
                if tok is not None and tok != synced.get(name) \
                        and _address(reads[count + i]) != tok[0]:
                    untrusted.add(name)
            tokens[name] = tok
            if tok is None:  # 0-d and empty variables: compared, which is cheap
                untrusted.add(name)
        return out, tokens, untrusted

    def _var(self, v: Any) -> Any:
        tf = _tf()
        return v if isinstance(v, tf.Variable) else v.value  # a Keras variable's tf.Variable

    def _read_all(self, variables: List[Any]) -> Optional[List[Any]]:
        """Every variable's value as an eager tensor sharing its buffer, twice (the n
        variables' first reads, then their second): read by one call of a concrete
        function (traced again only when the set of variables changes), a few
        microseconds per variable, where an eager ``read_value`` each costs tens. Two
        reads of a variable share a buffer unless it is in copy-on-read mode."""
        if not variables:
            return []
        # Keyed by the tracked objects (a built Keras variable keeps its tf.Variable).
        key = tuple(map(id, variables))
        if self._reader is None or self._reader[0] != key:
            tf = _tf()
            tvs = [self._var(v) for v in variables]
            fn = tf.function(lambda: [t.read_value() for t in tvs]
                             + [t.read_value() for t in tvs], autograph=False)
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
    budget of ``DEFAULT_BUDGET_STATES`` (4) tracked states (the variables and the
    optimizer's; it follows the state as the optimizer's is built), or ``memory_budget``
    bytes (``None``: none; or pass ``store=``). Other keyword arguments go to
    :class:`Tracker`. Raises ``CorruptObject`` when the repository's HEAD does not read."""
    if path is not None:
        if "store" in kwargs:
            raise TypeError("track() takes path= or store=, not both")
        kwargs["store"] = tracker_store(path, variables_bytes(model_variables(variables)),
                                        kwargs.pop("memory_budget", AUTO_BUDGET))
    return Tracker(variables, optimizer, **kwargs)
