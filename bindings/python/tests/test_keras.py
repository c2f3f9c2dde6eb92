"""The Keras tracker with real Keras 3 on the backend KERAS_BACKEND names (tensorflow when
unset; CI runs this file once per backend): skipped when Keras or the backend is not
installed, unless TH_REQUIRE_KERAS=1 (CI's keras tier), where that is a failure."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

BACKEND = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
_MODULE = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(BACKEND, BACKEND)
if os.environ.get("TH_REQUIRE_KERAS") == "1":
    __import__(_MODULE)
    import keras
else:
    pytest.importorskip(_MODULE, reason=f"the Keras backend {BACKEND} is not installed")
    keras = pytest.importorskip("keras", reason="Keras is not installed")

from hypothesis import HealthCheck, settings  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.keras  # noqa: E402,F401
from conftest import same  # noqa: E402
from framework_machine import TrackerMachine  # noqa: E402

if BACKEND == "torch":
    import torch

    torch.set_num_threads(1)


def test_keras_runs_on_the_backend_asked_for():
    assert keras.backend.backend() == BACKEND


def values(v):
    return np.array(keras.ops.convert_to_numpy(v.value))


def model(seed=0, dtype="float32", width=8):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)),
                          keras.layers.Dense(width, activation="tanh", dtype=dtype),
                          keras.layers.BatchNormalization(dtype=dtype),
                          keras.layers.Dense(3, dtype=dtype)])
    return m


def all_values(m, opt=None):
    vs = list(m.variables) + (list(opt.variables) if opt is not None else [])
    return [values(v) for v in vs]


def data(i, dtype="float32"):
    rng = np.random.default_rng(i)
    return rng.standard_normal((16, 4)).astype(dtype), rng.standard_normal((16, 3)).astype(dtype)


def compiled(m, opt):
    m.compile(optimizer=opt, loss="mse")
    return m


def test_a_reverted_train_on_batch_puts_model_and_optimizer_back():
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    tr = th.keras.track(m, opt)
    before = all_values(m, opt)
    with tr.trial():
        m.train_on_batch(*data(0))
        assert int(values(opt.iterations)) == 1
    for a, b in zip(all_values(m, opt), before):
        assert same(a, b)
    with tr.trial() as t:
        loss = m.train_on_batch(*data(0))
        t.keep(loss=loss)
    assert tr.store.metadata(t.kept)["loss"] == pytest.approx(float(loss))
    assert {"optim/" + v.path for v in opt.variables} <= set(tr.store.names())


def optimizer_names():
    out = []
    for name in sorted(dir(keras.optimizers)):
        cls = getattr(keras.optimizers, name)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer) \
                and cls is not keras.optimizers.Optimizer \
                and "learning_rate" in inspect.signature(cls.__init__).parameters:
            out.append(name)
    return out


@pytest.mark.parametrize("name", optimizer_names())
def test_training_with_accept_reject_matches_numpy_copies_bit_for_bit(name):
    """Every optimizer Keras ships, through train_on_batch: the tracker's run and the run
    with NumPy copies of every variable (assigned back on rejection) end bit-identical."""
    o1 = getattr(keras.optimizers, name)(learning_rate=0.01)
    o2 = getattr(keras.optimizers, name)(learning_rate=0.01)
    m1, m2 = compiled(model(), o1), compiled(model(), o2)
    m2.set_weights(m1.get_weights())
    o2.build(m2.trainable_variables)
    tr = th.keras.track(m1, o1)
    ref = list(m2.variables) + list(o2.variables)
    for i in range(5):
        accept = i % 3 != 1
        saved = [values(v) for v in ref]
        m2.train_on_batch(*data(i))
        if not accept:
            for v, a in zip(ref, saved):
                v.assign(a)
        with tr.trial() as t:
            m1.train_on_batch(*data(i))
            if accept:
                t.keep()
        for a, b in zip(all_values(m1, o1), all_values(m2, o2)):
            assert same(a, b), name
    tr.store.verify()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_variables_revert_bit_for_bit(dtype):
    opt = keras.optimizers.SGD(0.01)
    m = compiled(model(dtype=dtype), opt)
    tr = th.keras.track(m, opt)
    with tr.trial() as t:
        m.train_on_batch(*data(0, dtype))
        t.keep()
    kept = all_values(m, opt)
    with tr.trial():
        m.train_on_batch(*data(1, dtype))
    for a, b in zip(all_values(m, opt), kept):
        assert same(a, b)
    assert str(tr.store.get("model/" + m.layers[0].kernel.path).dtype) == dtype


def test_an_unbuilt_optimizer_is_built_by_track():
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    assert not opt.built
    tr = th.keras.track(m, opt)
    assert opt.built and "optim/" + opt.iterations.path in tr.store.names()
    before = all_values(m, opt)
    with tr.trial():
        m.train_on_batch(*data(0))
    for a, b in zip(all_values(m, opt), before):
        assert same(a, b)


def test_a_layer_added_inside_a_trial_is_named_after_the_rest_is_reverted():
    m = model()
    tr = th.keras.track(m)
    before = all_values(m)
    with pytest.raises(th.TrialError) as e:
        with tr.trial():
            m.layers[0].kernel.assign(values(m.layers[0].kernel) * 2)
            m.add(keras.layers.Dense(2))
    assert e.value.reason == "model structure"
    assert "model/" + m.layers[-1].kernel.path in str(e.value)
    for a, b in zip(all_values(m)[:len(before)], before):
        assert same(a, b)


def test_resuming_into_a_model_of_another_shape_raises_before_assigning(tmp_path):
    m = model()
    tr = th.keras.track(m, path=tmp_path / "run")
    tr.save()
    wide = model(seed=1, width=9)
    mine = all_values(wide)
    with pytest.raises(th.TrialError) as e:
        th.keras.track(wide, path=tmp_path / "run")
    assert e.value.reason == "model structure"
    for a, b in zip(all_values(wide), mine):
        assert same(a, b)


def test_a_tracker_without_a_store_gets_a_budget_of_four_states(tmp_path):
    """A state: the model's variables and the optimizer's (built by track)."""
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    tr = th.keras.track(m, opt)
    state = sum(values(v).nbytes for v in [*m.variables, *opt.variables])
    assert tr.store.memory_budget == max(th.keras.DEFAULT_BUDGET_MODELS * state, 64 << 20)
    assert th.keras.track(m, opt, path=tmp_path / "run").store.memory_budget == max(4 * state, 64 << 20)
    assert th.keras.track(m, opt, store=th.Store()).store.memory_budget is None
    assert th.keras.track(m, opt, memory_budget=4321).store.memory_budget == 4321
    assert th.keras.track(m, opt, path=tmp_path / "r2", memory_budget=None).store.memory_budget is None
    with pytest.raises(TypeError):
        th.keras.track(m, opt, store=th.Store(), memory_budget=1)


def test_a_history_past_the_default_budget_reads_back_bit_for_bit():
    """Dense Adam steps outgrow four model sizes, so old versions are kept encoded; every
    version comes back into the model and optimizer bit for bit against NumPy copies."""
    opt = keras.optimizers.Adam(1e-4)
    m = compiled(model(), opt)
    tr = th.keras.track(m, opt)
    copies = [(tr.store.head(), all_values(m, opt))]
    for i in range(6):
        with tr.trial() as t:
            m.train_on_batch(*data(i))
            copies.append((t.keep(), all_values(m, opt)))
    # A small model stays under the default budget's 64 MiB floor: encode every old
    # version now (enforcing encodes; only a commit lets versions go).
    tr.store.memory_budget = 0
    tr.store.enforce_memory_budget()
    st = tr.stats()
    assert st.encoded_bytes > 0 and st.encoded_held_bytes < st.encoded_bytes
    for v, want in copies:
        tr.restore(v)
        for a, b in zip(all_values(m, opt), want):
            assert same(a, b)
    tr.store.verify()


# ---- store names: the variables' Keras paths --------------------------------------------


def named_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="hidden"),
                             keras.layers.Dense(3, name="out")], name="net")


def test_variables_are_named_by_their_keras_paths():
    """A layer named ``hidden`` is stored as ``model/net/hidden/kernel``: the history reads
    by the model's own names (``variable.path``), the optimizer's by theirs."""
    opt = keras.optimizers.Adam(0.01)
    m = compiled(named_model(), opt)
    tr = th.keras.track(m, opt)
    want = {"model/" + v.path for v in m.variables} | {"optim/" + v.path for v in opt.variables}
    assert set(tr.store.names()) == want
    assert {"model/net/hidden/kernel", "model/net/out/bias"} <= want
    assert [n for n, _ in th.tf.keras_model_variables(m)] == [v.path for v in m.variables]
    for v in m.variables:
        assert same(tr.store.get("model/" + v.path), values(v))


class Twins(keras.Model):
    """Two sublayers given the same name: Keras gives their variables the same paths."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.first = keras.layers.Dense(3, name="same")
        self.second = keras.layers.Dense(3, name="same")

    def call(self, x):
        return self.second(self.first(x))


class Block(keras.Model):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.hidden = keras.layers.Dense(3, name="hidden")

    def call(self, x):
        return self.hidden(x)


class TwoBlocks(keras.Model):
    """Two sub-models of the same name, with the same layer names."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.encode = Block(name="block")
        self.decode = Block(name="block")

    def call(self, x):
        return self.decode(self.encode(x))


def numbered(paths):
    """The documented rule: the first variable of a path keeps it, the k-th repeat (in
    the order of ``model.variables`` / ``optimizer.variables``) is ``<path>#<k>``."""
    seen: dict = {}
    out = []
    for p in paths:
        k = seen.get(p, 0)
        seen[p] = k + 1
        out.append(p if k == 0 else f"{p}#{k}")
    return out


@pytest.mark.parametrize("cls", [Twins, TwoBlocks])
def test_variables_that_share_a_keras_path_are_numbered_in_order(cls, tmp_path):
    keras.utils.set_random_seed(0)
    m = cls()
    m(np.ones((2, 3), "float32"))
    paths = [v.path for v in m.variables]
    assert len(set(paths)) < len(paths)  # Keras' paths repeat
    tr = th.keras.track(m, path=tmp_path / "run")
    want = numbered(paths)
    assert [n for n, _ in th.tf.keras_model_variables(m)] == want
    assert sorted(tr.store.names()) == sorted("model/" + n for n in want)
    for n, v in zip(want, m.variables):
        assert same(tr.store.get("model/" + n), values(v))
    before = all_values(m)
    last = m.variables[-2]  # the second layer's kernel
    with tr.trial():
        last.assign(values(last) + 1)
    for a, b in zip(all_values(m), before):
        assert same(a, b)
    tr.save()
    # the same model built again (Keras numbers its name on: other paths) resumes it
    keras.utils.set_random_seed(1)
    m2 = cls()
    m2(np.ones((2, 3), "float32"))
    assert m2.variables[0].path != m.variables[0].path
    th.keras.track(m2, path=tmp_path / "run")
    for a, b in zip(all_values(m2), before):
        assert same(a, b)


class Pair(keras.Model):
    def __init__(self, first, second, **kw):
        super().__init__(**kw)
        self.first = first
        self.second = second

    def call(self, x):
        return self.second(self.first(x))


def test_two_models_of_the_same_names_are_tracked_as_one_model_that_holds_them(tmp_path):
    """Two models built apart with the same names have the same paths: a list or dict of
    them is refused with a TypeError that says what to track; a model holding both is
    tracked, the second model's paths numbered."""
    def net(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, name="hidden")],
                                name="net")

    a, b = net(0), net(1)
    assert [v.path for v in a.variables] == [v.path for v in b.variables]
    for several in ([a, b], {"a": a, "b": b}):
        with pytest.raises(TypeError, match="one model"):
            th.keras.track(several)
        with pytest.raises(TypeError, match="one model"):
            th.keras.track(several, path=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []  # refused before a repository is made
    pair = Pair(a, b)
    tr = th.keras.track(pair)
    assert sorted(tr.store.names()) == sorted(
        ["model/net/hidden/kernel", "model/net/hidden/bias",
         "model/net/hidden/kernel#1", "model/net/hidden/bias#1"])
    assert same(tr.store.get("model/net/hidden/kernel#1"), values(b.layers[0].kernel))
    assert same(tr.store.get("model/net/hidden/kernel"), values(a.layers[0].kernel))
    before = all_values(pair)
    with tr.trial():
        b.layers[0].kernel.assign(values(b.layers[0].kernel) * 3)
    for x, y in zip(all_values(pair), before):
        assert same(x, y)


def test_optimizer_variables_that_share_a_keras_path_are_numbered_in_order():
    """Adafactor names its factored moments after the variable's name alone: the kernels'
    moments share ``adafactor/kernel``."""
    opt = keras.optimizers.Adafactor(0.01)
    m = compiled(model(), opt)
    tr = th.keras.track(m, opt)
    paths = [v.path for v in opt.variables]
    assert len(set(paths)) < len(paths)
    want = numbered(paths)
    assert [n for n, _ in th.tf.keras_optimizer_variables(opt, m.trainable_variables)] == want
    assert sorted(n for n in tr.store.names() if n.startswith("optim/")) == \
        sorted("optim/" + n for n in want)


def test_a_model_built_again_in_the_same_process_resumes_its_history(tmp_path):
    """Keras numbers auto-named layers with a process-wide counter, so the same
    architecture built again has other paths (``dense_4`` for ``dense``): it resumes the
    history, and its commits go on under the history's names."""
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    tr = th.keras.track(m, opt, path=tmp_path / "run")
    for i in range(2):
        with tr.trial() as t:
            m.train_on_batch(*data(i))
            t.keep()
    tr.save()
    names = set(tr.store.names())
    want = all_values(m, opt)
    opt2 = keras.optimizers.Adam(0.01)
    m2 = compiled(model(seed=4), opt2)
    assert {v.path for v in m2.variables}.isdisjoint(v.path for v in m.variables)
    tr2 = th.keras.track(m2, opt2, path=tmp_path / "run")
    for a, b in zip(all_values(m2, opt2), want):
        assert same(a, b)
    with tr2.trial() as t:
        m2.train_on_batch(*data(2))
        t.keep()
    assert set(tr2.store.names()) == names
    assert not tr2.is_dirty()
    tr2.undo()
    for a, b in zip(all_values(m2, opt2), want):
        assert same(a, b)


def test_names_numbered_otherwise_match_in_the_order_of_their_numbers(tmp_path):
    """Twelve layers of one shape, numbered as Keras' counter numbers them: 0 to 11 in the
    history, 95 to 106 in the model that resumes it (numbers of other widths, so the
    order is by number, not by text); each layer gets its own values back."""
    def deep(first, seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((3,))] + [
            keras.layers.Dense(3, name=f"dense_{first + i}") for i in range(12)])

    m = deep(0, 0)
    tr = th.keras.track(m, path=tmp_path / "run")
    tr.save()
    want = all_values(m)
    m2 = deep(95, 1)
    tr2 = th.keras.track(m2, path=tmp_path / "run")
    for a, b in zip(all_values(m2), want):
        assert same(a, b)
    assert set(tr2.store.names()) == set(tr.store.names())


def test_a_history_written_under_the_structural_names_resumes_and_goes_on(tmp_path):
    """Histories written with the structural names (``model/dense_1/kernel``,
    ``optim/dense_1/kernel/momentum``, ``optim/0/iteration``) still resume, and the
    tracker goes on under those names."""
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    m.train_on_batch(*data(0))
    pairs = th.tf.keras_structural_variables(m)
    optim = th.tf.keras_structural_optimizer_variables(
        opt, m.trainable_variables, {id(v): n for n, v in pairs})
    assert "dense_1/kernel" in dict(pairs) and "dense/kernel/momentum" in dict(optim)
    store = th.Store()
    store.sync({**{"model/" + n: values(v) for n, v in pairs},
                **{"optim/" + n: values(v) for n, v in optim}})
    store.commit("written under the structural names")
    store.save_as(str(tmp_path / "run"))
    names = set(store.names())
    want = all_values(m, opt)
    opt2 = keras.optimizers.Adam(0.01)
    m2 = compiled(model(seed=3), opt2)
    tr = th.keras.track(m2, opt2, path=tmp_path / "run")
    for a, b in zip(all_values(m2, opt2), want):
        assert same(a, b)
    assert not tr.is_dirty()
    with tr.trial() as t:
        m2.train_on_batch(*data(1))
        t.keep()
    assert set(tr.store.names()) == names
    tr.restore(tr.store.parent(t.kept))
    for a, b in zip(all_values(m2, opt2), want):
        assert same(a, b)


# ---- variables TensorFlow keeps in copy-on-read mode -----------------------------------


def test_an_embedding_trained_with_sgd_is_clean_after_a_kept_step():
    """On the tensorflow backend SGD updates an embedding table with a scatter (its
    gradient is sparse), which puts the table in copy-on-read mode: it is compared by
    bytes, so a kept step leaves the tracker clean on every backend."""
    opt = keras.optimizers.SGD(0.1)
    m = compiled(keras.Sequential([keras.Input((3,), dtype="int32"),
                                   keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                                   keras.layers.Dense(2)]), opt)
    tr = th.keras.track(m, opt)
    x, y = np.array([[1, 2, 3], [4, 5, 1]], "int32"), np.ones((2, 2), "float32")
    before = all_values(m, opt)
    with tr.trial() as t:
        m.train_on_batch(x, y)
        t.keep()
    kept = all_values(m, opt)
    assert not tr.is_dirty()
    versions = tr.stats().versions
    with tr.trial():
        pass
    assert tr.stats().versions == versions
    with tr.trial():
        m.train_on_batch(x, y)
    for a, b in zip(all_values(m, opt), kept):
        assert same(a, b)
    assert not tr.is_dirty()
    tr.undo()
    for a, b in zip(all_values(m, opt), before):
        assert same(a, b)


CHILD = r"""
import json, os, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
import keras, tensor_history as th, tensor_history.keras
from test_keras import model, compiled, values
opt = keras.optimizers.Adam(0.01)
m = compiled(model(seed=7), opt)
tr = th.keras.track(m, opt, path=sys.argv[1])
np.savez(sys.argv[2], *[values(v) for v in list(m.variables) + list(opt.variables)])
tr.branch(keras.backend.backend())
tr.checkout(keras.backend.backend())
m.train_on_batch(np.ones((4, 4), "float32"), np.ones((4, 3), "float32"))
tr.commit("one more step on " + keras.backend.backend())
tr.checkout("main")  # the repository's HEAD stays on main
tr.save()
"""


def other_backends():
    import importlib.util

    return [b for b in ("tensorflow", "jax", "torch")
            if b != BACKEND and importlib.util.find_spec(b) is not None]


def test_a_history_saved_on_one_backend_opens_on_the_others(tmp_path):
    opt = keras.optimizers.Adam(0.01)
    m = compiled(model(), opt)
    repo = str(tmp_path / "run")
    tr = th.keras.track(m, opt, path=repo)
    for i in range(2):
        with tr.trial() as t:
            m.train_on_batch(*data(i))
            t.keep()
    tr.save()
    want = all_values(m, opt)
    others = other_backends()
    if not others:
        pytest.skip("no other Keras backend is installed")
    for b in others:
        out = str(tmp_path / f"{b}.npz")
        env = dict(os.environ, KERAS_BACKEND=b)
        # The child's output comes back in the failure message (with its exit status),
        # and a child that hangs fails the test instead of the run.
        r = subprocess.run([sys.executable, "-c", CHILD, repo, out, os.path.dirname(__file__)],
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (f"the {b} child exited {r.returncode}:\n"
                                   f"{r.stdout[-2000:]}\n{r.stderr[-6000:]}")
        got = np.load(out)
        got = [got[f"arr_{i}"] for i in range(len(got.files))]
        assert len(got) == len(want)
        for a, w in zip(got, want):
            # step counters are int64 on TensorFlow, int32 on JAX: same values
            ints = a.dtype.kind in "iu" and w.dtype.kind in "iu"
            assert (ints and np.array_equal(a, w)) or same(a, w), b
    # every backend's step landed on its branch of the repository
    store = th.Store.open(repo)
    assert len(store.log()) == 3
    for b in others:
        assert len(store.log(b)) == 4 and store.metadata(b) is not None
    assert store.current_branch() == "main"
    # and safetensors export of a version works as for any store
    store.export_safetensors(str(tmp_path / "head.safetensors"))
    back = th.Store()
    names = back.import_safetensors(str(tmp_path / "head.safetensors"))
    assert set(names) == set(store.names())


class KerasMachine(TrackerMachine):
    def make(self, dtype, seed):
        return model(seed=seed, dtype=dtype)

    # Keyed by the structural names, the same for the model built again by
    # save_and_reopen (whose Keras paths are numbered on).
    def values(self, m):
        return {n: values(v) for n, v in th.tf.keras_structural_variables(m)}

    def assign(self, m, name, value):
        dict(th.tf.keras_structural_variables(m))[name].assign(value)

    def track(self, m, **kw):
        return th.keras.track(m, **kw)


TestKerasMachine = KerasMachine.TestCase
TestKerasMachine.settings = settings(max_examples=15, stateful_step_count=10, deadline=None,
                                     suppress_health_check=list(HealthCheck))
