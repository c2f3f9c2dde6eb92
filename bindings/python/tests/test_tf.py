"""The TensorFlow tracker with real TensorFlow (CPU): skipped when TensorFlow is not
installed, unless TH_REQUIRE_TF=1 (CI's tensorflow tier), where a missing TensorFlow is
a failure."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

if os.environ.get("TH_REQUIRE_TF") == "1":
    import tensorflow as tf
else:
    tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed")

from hypothesis import HealthCheck, settings  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.tf  # noqa: E402,F401
from conftest import same  # noqa: E402
from framework_machine import TrackerMachine  # noqa: E402

keras = tf.keras


# ---- the seed scenario -----------------------------------------------------------------


def test_seed_variables_go_back_to_their_values_without_disk(tmp_path, monkeypatch):
    """"How do I put the variables back to the values they had at the last step,
    without saving to disk?" W (5x5) and b (5) zeros, y = x @ W + b on ones."""
    monkeypatch.chdir(tmp_path)
    W = tf.Variable(tf.zeros((5, 5)))
    b = tf.Variable(tf.zeros(5))
    x = tf.ones((2, 5))

    def y():
        return (x @ W + b).numpy()

    assert (y() == 0).all()
    tracker = th.tf.track([W, b])              # remember the values
    W.assign(tf.ones((5, 5)))
    b.assign(tf.ones(5))
    assert (y() == 6).all()
    ids = (id(W), id(b))
    tracker.restore(tracker.store.head())     # put them back, in place
    assert (y() == 0).all()
    assert (id(W), id(b)) == ids
    assert tracker.store.location is None and list(tmp_path.iterdir()) == []


def test_seed_store_kept_across_many_accept_reject_steps():
    """The same variables over 60 accept/reject steps against a dict of NumPy copies,
    the answer the question got."""
    rng = np.random.default_rng(0)
    W = tf.Variable(tf.zeros((5, 5)))
    b = tf.Variable(tf.zeros(5))
    tracker = th.tf.track([W, b])
    copies = {"W": W.numpy(), "b": b.numpy()}
    kept = 0
    for _ in range(60):
        with tracker.trial() as t:
            W.assign_add(rng.standard_normal((5, 5)).astype(np.float32))
            b.assign_add(rng.standard_normal(5).astype(np.float32))
            if rng.random() < 0.4:
                t.keep()
                copies = {"W": W.numpy(), "b": b.numpy()}
                kept += 1
        assert same(W.numpy(), copies["W"]) and same(b.numpy(), copies["b"])
    assert tracker.stats().versions == 1 + kept
    tracker.store.verify()


# ---- in place, only what differs -------------------------------------------------------


class Net(tf.Module):
    def __init__(self, dtype=tf.float32, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(tf.cast(rng.standard_normal((6, 4)).astype(np.float32), dtype))
        self.b = tf.Variable(tf.cast(tf.zeros(4), dtype))
        self.layers = [tf.Variable(tf.cast(rng.standard_normal(3), dtype)) for _ in range(2)]

    @tf.function
    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


def test_a_tf_module_is_named_by_attribute_paths_and_restored_in_place():
    net = Net()
    tr = th.tf.track(net)
    assert sorted(tr.store.names()) == ["model/b", "model/layers/0", "model/layers/1", "model/w"]
    x = tf.ones((2, 6))
    before = net(x).numpy()
    with tr.trial():
        net.w.assign(net.w * 2)   # the tf.function keeps working on the same variables
        assert not same(net(x).numpy(), before)
    assert same(net(x).numpy(), before)


def test_unchanged_variables_are_neither_read_nor_assigned(monkeypatch):
    net = Net()
    tr = th.tf.track(net)
    assigned = []
    orig = th.tf.Tracker._assign
    monkeypatch.setattr(th.tf.Tracker, "_assign",
                        lambda self, n, v, a: (assigned.append(n), orig(self, n, v, a)))
    with tr.trial() as t:
        net.b.assign_add(tf.ones(4))
        v = t.keep()
    stats = tr.store.diff(tr.store.parent(v), v)
    assert [n for n, c in stats.items() if c.kind != "unchanged"] == ["model/b"]
    with tr.trial():
        net.w.assign(net.w + 1)
    assert assigned == ["model/w"]  # the revert assigned only the variable that changed
    assigned.clear()
    tr.restore(tr.store.parent(v))
    assert assigned == ["model/b"]
    # a commit with nothing changed writes no chunk
    before = tr.store.stats().unique_chunks
    tr.commit("noop")
    assert tr.store.stats().unique_chunks == before


def address(t):
    return t._numpy().__array_interface__["data"][0]


def test_a_reverted_variable_takes_back_the_buffer_it_had_without_a_copy():
    net = Net()
    tr = th.tf.track(net)
    w, b = net.w.read_value(), net.b.read_value()
    w_values = w.numpy().copy()
    with tr.trial():
        net.w.assign(net.w * 2)  # TensorFlow copies on write: w keeps its buffer
        assert address(net.w.read_value()) != address(w)
    assert address(net.w.read_value()) == address(w) and same(net.w.numpy(), w_values)
    assert address(net.b.read_value()) == address(b)


def test_a_write_that_bypasses_tensorflow_is_seen_with_trust_versions_false():
    net = Net()
    tr = th.tf.track(net, trust_versions=False)
    with tr.trial() as t:
        net.w.assign(net.w * 3)
        v = t.keep()
    assert same(tr.store.get("model/w", at=v), net.w.numpy())


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32])
def test_every_dtype_reverts_bit_for_bit(dtype):
    net = Net(dtype)
    tr = th.tf.track(net)
    before = {k: v.numpy() for k, v in [("w", net.w), ("b", net.b)]}
    with tr.trial():
        net.w.assign(net.w + tf.cast(1, dtype))
        net.b.assign(net.b - tf.cast(2, dtype))
    assert same(net.w.numpy(), before["w"]) and same(net.b.numpy(), before["b"])
    assert tr.store.get("model/w").dtype == before["w"].dtype


def test_bool_variables_are_stored_as_bytes_and_restored():
    mask = tf.Variable([True, False, True], name="mask")
    tr = th.tf.track({"mask": mask})
    with tr.trial():
        mask.assign([False, False, False])
    assert mask.numpy().tolist() == [True, False, True] and mask.dtype == tf.bool


# ---- errors that change nothing ---------------------------------------------------------


def test_restore_into_a_variable_of_another_shape_raises_before_assigning():
    net = Net()
    tr = th.tf.track(net)
    v0 = tr.store.head()
    net.b.assign(net.b + 1)
    net.layers[0].assign(net.layers[0] + 1)
    v1 = tr.commit("moved")
    net.w = tf.Variable(tf.zeros((3, 3)))  # same name, another shape
    b_now, l_now = net.b.numpy(), net.layers[0].numpy()
    with pytest.raises(th.TrialError) as e:
        tr.restore(v0)
    assert e.value.reason == "model structure" and "model/w" in str(e.value)
    assert same(net.b.numpy(), b_now) and same(net.layers[0].numpy(), l_now)
    assert tr.store.head() == v1


def test_restore_into_a_variable_of_another_dtype_raises_before_assigning():
    net = Net()
    tr = th.tf.track(net)
    v0 = tr.store.head()
    net.b.assign(net.b + 1)
    tr.commit("moved")
    net.layers[1] = tf.Variable(tf.zeros(3, tf.float16))
    b_now = net.b.numpy()
    with pytest.raises(th.TrialError):
        tr.restore(v0)
    assert same(net.b.numpy(), b_now)


def test_a_variable_created_inside_a_trial_is_named_after_the_rest_is_reverted():
    net = Net()
    tr = th.tf.track(net)
    w = net.w.numpy()
    with pytest.raises(th.TrialError) as e:
        with tr.trial():
            net.w.assign(net.w * 2)
            net.extra = tf.Variable(tf.ones(2))
    assert e.value.reason == "model structure" and "model/extra" in str(e.value)
    assert same(net.w.numpy(), w)
    v = tr.commit("with extra")  # recorded by the next commit
    assert tr.store.get("model/extra", at=v).tolist() == [1, 1]
    # a restore to a version that lacks it changes nothing
    with pytest.raises(th.TrialError):
        tr.restore(tr.store.parent(v))
    assert tr.store.head() == v


def test_an_unbuilt_keras_model_is_refused():
    m = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(th.TrialError) as e:
        th.tf.track(m)
    assert e.value.reason == "no variables"


def test_track_of_something_else_raises_before_a_repository_is_made(tmp_path):
    with pytest.raises(TypeError):
        th.tf.track(np.zeros(3), path=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_unnamed_variables_in_a_list_are_named_by_position():
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    tr = th.tf.track([a, b])
    assert tr.store.names() == ["model/0/Variable", "model/1/Variable"]


# ---- Keras models and optimizers on TensorFlow -----------------------------------------


def keras_model(seed=0, dtype="float32"):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", dtype=dtype),
                          keras.layers.BatchNormalization(dtype=dtype),
                          keras.layers.Dense(3, dtype=dtype)])
    return m


def optimizer_classes():
    out = []
    for name in sorted(dir(keras.optimizers)):
        cls = getattr(keras.optimizers, name)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer) \
                and cls is not keras.optimizers.Optimizer \
                and "learning_rate" in inspect.signature(cls.__init__).parameters:
            # (the wrappers LossScaleOptimizer and MultiOptimizer take other optimizers)
            out.append(name)
    return out


def make_opt(name):
    cls = getattr(keras.optimizers, name)
    kw = {"learning_rate": 0.01}
    if "momentum" in inspect.signature(cls.__init__).parameters and name == "SGD":
        kw["momentum"] = 0.9
    return cls(**kw)


def train_fn(model, opt):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss
    return step


def batch(i, dtype="float32"):
    rng = np.random.default_rng(i)
    return (tf.constant(rng.standard_normal((16, 4)), dtype),
            tf.constant(rng.standard_normal((16, 3)), dtype))


def all_vars(model, opt):
    return [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]


@pytest.mark.parametrize("name", optimizer_classes())
def test_keras_training_with_accept_reject_matches_numpy_copies_bit_for_bit(name):
    """Every optimizer keras ships: the tracker's run and the same run with NumPy copies
    (``[v.numpy() for v in vars]``, ``assign`` back on rejection) end bit-identical."""
    m1, m2 = keras_model(), keras_model()
    m2.set_weights(m1.get_weights())
    o1, o2 = make_opt(name), make_opt(name)
    o2.build(m2.trainable_variables)  # what the tracker does to an unbuilt optimizer
    tr = th.tf.track(m1, o1)
    s1, s2 = train_fn(m1, o1), train_fn(m2, o2)
    ref_vars = list(m2.variables) + list(o2.variables)
    for i in range(6):
        accept = i % 3 != 1
        saved = [v.numpy() for v in ref_vars]
        s2(*batch(i))
        if not accept:
            for v, a in zip(ref_vars, saved):
                v.assign(a)
        with tr.trial() as t:
            loss = s1(*batch(i))
            if accept:
                t.keep(loss=loss)
        for a, b in zip(all_vars(m1, o1), all_vars(m2, o2)):
            assert same(a, b), name
    tr.store.verify()
    assert tr.stats().versions == 1 + 4


def test_an_unbuilt_optimizer_is_built_by_track_and_its_first_step_reverted():
    m = keras_model()
    opt = keras.optimizers.Adam(0.01)
    assert not opt.built
    tr = th.tf.track(m, opt)
    assert opt.built and "optim/dense/kernel/momentum" in tr.store.names()
    assert "optim/0/iteration" in tr.store.names()
    before = all_vars(m, opt)
    step = train_fn(m, opt)
    with tr.trial():
        step(*batch(0))
        assert int(opt.iterations.numpy()) == 1
    for a, b in zip(all_vars(m, opt), before):
        assert same(a, b)
    assert int(opt.iterations.numpy()) == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_keras_half_precision_training_reverts_bit_for_bit(dtype):
    m = keras_model(dtype=dtype)
    opt = keras.optimizers.SGD(0.01)
    tr = th.tf.track(m, opt)
    step = train_fn(m, opt)
    with tr.trial() as t:
        step(*batch(0, dtype))
        t.keep()
    kept = all_vars(m, opt)
    with tr.trial():
        step(*batch(1, dtype))
    for a, b in zip(all_vars(m, opt), kept):
        assert same(a, b)
    assert str(tr.store.get("model/dense/kernel").dtype) == dtype


def test_a_saved_keras_history_resumes_into_a_new_model(tmp_path):
    m = keras_model()
    opt = keras.optimizers.Adam(0.01)
    tr = th.tf.track(m, opt, path=tmp_path / "run")
    step = train_fn(m, opt)
    for i in range(3):
        with tr.trial() as t:
            step(*batch(i))
            t.keep()
    tr.save()
    want = all_vars(m, opt)
    m2 = keras_model(seed=5)
    opt2 = keras.optimizers.Adam(0.01)
    tr2 = th.tf.track(m2, opt2, path=tmp_path / "run")
    for a, b in zip(all_vars(m2, opt2), want):
        assert same(a, b)
    assert len(tr2.log()) == 4


# ---- the default memory budget ----------------------------------------------------------


def test_a_tracker_without_a_store_gets_a_budget_of_four_model_sizes(tmp_path):
    m = keras_model()
    opt = keras.optimizers.Adam(0.01)
    nbytes = sum(v.numpy().nbytes for v in m.variables)  # the model's, not the optimizer's
    tr = th.tf.track(m, opt)
    assert tr.store.memory_budget == th.tf.DEFAULT_BUDGET_MODELS * nbytes == 4 * nbytes
    assert th.tf.track(m, opt, path=tmp_path / "run").store.memory_budget == 4 * nbytes
    assert th.tf.track(m, opt, store=th.Store()).store.memory_budget is None
    net = Net(tf.float16)
    assert th.tf.track(net).store.memory_budget == 4 * sum(
        v.numpy().nbytes for v in (net.w, net.b, *net.layers))


def test_a_history_past_the_default_budget_reads_back_bit_for_bit():
    """Dense Adam steps: each kept version holds a whole model and optimizer state, so the
    history outgrows four model sizes and old versions are kept encoded; every version
    comes back into the model and optimizer bit for bit against NumPy copies."""
    m = keras_model()
    opt = keras.optimizers.Adam(1e-4)
    tr = th.tf.track(m, opt)
    step = train_fn(m, opt)
    copies = [(tr.store.head(), all_vars(m, opt))]
    for i in range(6):
        with tr.trial() as t:
            step(*batch(i))
            copies.append((t.keep(), all_vars(m, opt)))
    tr.store.enforce_memory_budget()
    st = tr.stats()
    assert st.encoded_bytes > 0 and st.encoded_held_bytes < st.encoded_bytes
    for v, want in copies:
        tr.restore(v)
        for a, b in zip(all_vars(m, opt), want):
            assert same(a, b)
    tr.store.verify()


# ---- the model-based test ---------------------------------------------------------------


class TfMachine(TrackerMachine):
    def make(self, dtype, seed):
        return Net(getattr(tf, dtype), seed)

    def values(self, net):
        return {"model/w": net.w.numpy(), "model/b": net.b.numpy(),
                "model/layers/0": net.layers[0].numpy(), "model/layers/1": net.layers[1].numpy()}

    def assign(self, net, name, value):
        var = {"model/w": net.w, "model/b": net.b, "model/layers/0": net.layers[0],
               "model/layers/1": net.layers[1]}[name]
        var.assign(value)

    def track(self, net, **kw):
        return th.tf.track(net, **kw)


TestTfMachine = TfMachine.TestCase
TestTfMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None,
                                  suppress_health_check=list(HealthCheck))
