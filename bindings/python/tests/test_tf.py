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
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, invariant,  # noqa: E402
                                 precondition, rule)

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
    assert opt.built
    assert {"optim/" + v.path for v in opt.variables} <= set(tr.store.names())
    assert "optim/" + opt.iterations.path in tr.store.names()
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
    assert str(tr.store.get("model/" + m.layers[0].kernel.path).dtype) == dtype


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


# ---- a tf.Module trained with a Keras optimizer ----------------------------------------


class Mlp(tf.Module):
    """Plain ``tf.Variable``s (no Keras paths; all of them named ``Variable:0``)."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.standard_normal((4, 8)).astype(np.float32))
        self.b = tf.Variable(np.zeros(8, np.float32))
        self.layers = [tf.Variable(rng.standard_normal((8, 3)).astype(np.float32)),
                       tf.Variable(np.zeros(3, np.float32))]

    def __call__(self, x):
        return tf.matmul(tf.tanh(tf.matmul(x, self.w) + self.b), self.layers[0]) + self.layers[1]


def slot_optimizers():
    """Every optimizer Keras ships, plus the settings that add slots (SGD's momentum,
    RMSprop's momentum and centered average, Adam's and AdamW's amsgrad). Not Muon: it
    reads ``variable.path`` of the variables it is built over, which plain
    ``tf.Variable``s lack (Keras raises, tracked or not)."""
    out = [(name, {}) for name in optimizer_classes() if name != "Muon"]
    out += [("SGD", {"momentum": 0.9}), ("RMSprop", {"momentum": 0.9, "centered": True}),
            ("Adam", {"amsgrad": True}), ("AdamW", {"amsgrad": True})]
    return out


def module_step(net, opt):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((net(x) - y) ** 2)
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply(grads, net.trainable_variables)
        return loss
    return step


def module_vars(net, opt):
    return [v.numpy() for v in net.trainable_variables] + \
        [np.array(keras.ops.convert_to_numpy(v.value)) for v in opt.variables]


@pytest.mark.parametrize("name,kw", slot_optimizers(),
                         ids=[f"{n}{'-' + '-'.join(k) if k else ''}" for n, k in slot_optimizers()])
def test_a_tf_module_trained_with_a_keras_optimizer_matches_copies_bit_for_bit(name, kw):
    """A ``tf.Module`` of plain variables trained with ``keras.optimizers``: trials keep or
    revert the module and the optimizer's slots, bit for bit as a run that keeps NumPy
    copies of every variable and assigns them back on rejection."""
    cls = getattr(keras.optimizers, name)
    n1, n2 = Mlp(), Mlp()
    o1, o2 = cls(learning_rate=0.01, **kw), cls(learning_rate=0.01, **kw)
    o2.build(n2.trainable_variables)
    tr = th.tf.track(n1, o1, store=th.Store())  # no budget: every version is kept
    assert len(tr.store.names()) == len(n1.trainable_variables) + len(o1.variables)
    s1, s2 = module_step(n1, o1), module_step(n2, o2)
    ref = list(n2.trainable_variables) + list(o2.variables)
    kept = 0
    for i in range(5):
        accept = i % 3 != 1
        kept += accept
        saved = [v.numpy() for v in ref]
        s2(*batch(i))
        if not accept:
            for v, a in zip(ref, saved):
                v.assign(a)
        with tr.trial() as t:
            s1(*batch(i))
            if accept:
                t.keep()
        for a, b in zip(module_vars(n1, o1), module_vars(n2, o2)):
            assert same(a, b), name
    tr.store.verify()
    assert tr.stats().versions == 1 + kept


def test_the_slots_of_a_tf_module_are_named_by_its_variables_store_names():
    net = Mlp()
    opt = keras.optimizers.Adam(0.01)
    tr = th.tf.track(net, opt)
    module = ["w", "b", "layers/0", "layers/1"]
    assert sorted(tr.store.names()) == sorted(
        [f"model/{n}" for n in module] + ["optim/0/iteration", "optim/1/learning_rate"]
        + [f"optim/{n}/{s}" for n in module for s in ("momentum", "velocity")])
    # each slot has the shape of the variable it is named after
    for n in module:
        assert tr.store.get(f"optim/{n}/momentum").shape == tr.store.get(f"model/{n}").shape


def test_an_optimizer_built_over_some_variables_in_another_order_names_its_slots_right():
    net = Mlp()
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    opt.build([net.layers[0], net.w])  # not the module's order, and not all of them
    tr = th.tf.track(net, opt)
    names = [n for n in tr.store.names() if n.startswith("optim/") and n.endswith("/momentum")]
    assert sorted(names) == ["optim/layers/0/momentum", "optim/w/momentum"]
    opt.momentums[0].assign(tf.fill((8, 3), 7.0))  # the slot of layers[0]
    v = tr.commit("slot")
    assert (tr.store.get("optim/layers/0/momentum", at=v) == 7).all()
    assert (tr.store.get("optim/w/momentum", at=v) == 0).all()


def test_a_tf_module_and_its_keras_optimizer_resume_from_a_repository(tmp_path):
    net = Mlp()
    opt = keras.optimizers.Adam(0.01)
    tr = th.tf.track(net, opt, path=tmp_path / "run")
    step = module_step(net, opt)
    for i in range(3):
        with tr.trial() as t:
            step(*batch(i))
            t.keep()
    tr.save()
    want = module_vars(net, opt)
    net2, opt2 = Mlp(seed=3), keras.optimizers.Adam(0.01)
    th.tf.track(net2, opt2, path=tmp_path / "run")
    for a, b in zip(module_vars(net2, opt2), want):
        assert same(a, b)


# ---- variables in copy-on-read mode (after a sparse read or update) --------------------


def test_a_variable_after_scatter_nd_update_is_clean_once_committed():
    """scatter_nd_update puts the variable in TensorFlow's copy-on-read mode (every read is
    a new buffer): is_dirty(), trials and undo() go by its bytes."""
    table = tf.Variable(tf.zeros((6, 4)))
    other = tf.Variable(tf.ones(3))
    tr = th.tf.track({"table": table, "other": other})
    table.scatter_nd_update([[1], [3]], tf.ones((2, 4)))
    assert tr.is_dirty()
    v1 = tr.commit("scatter")
    assert not tr.is_dirty()
    versions = tr.stats().versions
    with tr.trial():  # nothing changed since v1: no "(base)" version
        pass
    assert tr.stats().versions == versions and tr.store.head() == v1
    with tr.trial() as t:
        table.scatter_nd_update([[0]], tf.fill((1, 4), 2.0))
        t.keep()
    assert not tr.is_dirty()
    assert tr.undo() == v1  # does not raise UncommittedChanges
    assert same(table.numpy(), tr.store.get("model/table", at=v1))
    assert not tr.is_dirty()
    tr.redo()
    assert (table.numpy()[0] == 2).all() and not tr.is_dirty()


SPARSE = {
    "scatter_update": lambda v: v.scatter_update(tf.IndexedSlices(tf.fill((1, 4), 5.0), [2])),
    "scatter_add": lambda v: v.scatter_add(tf.IndexedSlices(tf.ones((1, 4)), [0])),
    "scatter_sub": lambda v: v.scatter_sub(tf.IndexedSlices(tf.ones((1, 4)), [1])),
    "scatter_max": lambda v: v.scatter_max(tf.IndexedSlices(tf.fill((1, 4), 9.0), [4])),
    "scatter_nd_add": lambda v: v.scatter_nd_add([[5]], tf.ones((1, 4))),
    "batch_scatter_update": lambda v: v.batch_scatter_update(
        tf.IndexedSlices(tf.fill((1, 4), 3.0), [3])),
    "gather (a read)": lambda v: tf.gather(v, [1, 2]),
    "sparse_read (a read)": lambda v: v.sparse_read([0]),
}


@pytest.mark.parametrize("op", sorted(SPARSE))
def test_is_dirty_and_undo_after_a_sparse_read_or_update(op):
    table = tf.Variable(np.arange(24, dtype=np.float32).reshape(6, 4))
    tr = th.tf.track({"table": table})
    v0 = tr.store.head()
    before = table.numpy()
    SPARSE[op](table)
    changed = not same(table.numpy(), before)
    assert tr.is_dirty() == changed
    if changed:
        v1 = tr.commit(op)
        assert not tr.is_dirty()
        assert tr.undo() == v0 and same(table.numpy(), before)
        assert not tr.is_dirty()
        tr.redo()
        assert tr.store.head() == v1 and not tr.is_dirty()
    SPARSE[op](table)  # the same op again, then a trial left without keep
    with tr.trial():
        table.assign_add(tf.ones((6, 4)))
    assert not tr.is_dirty()


class CopyOnRead(RuleBasedStateMachine):
    """Random scatter, gather and assign writes into variables (which go into copy-on-read
    mode at their first sparse access), commits, trials, restores and undos, against a
    model of NumPy copies: the variables hold the model's working values after every
    step, and ``is_dirty()`` says whether they differ from HEAD's."""

    def __init__(self):
        super().__init__()
        self.vars = {"a": tf.Variable(np.zeros((5, 3), np.float32)),
                     "b": tf.Variable(np.ones((4, 2), np.float32)),
                     "c": tf.Variable(np.full(7, 2, np.float32))}
        self.tracker = th.tf.track(self.vars)
        self.head = self.tracker.store.head()
        self.versions = {self.head: self.values()}
        self.working = self.values()
        self.parents = {self.head: None}
        self.rng = np.random.default_rng(0)

    def values(self):
        return {k: v.numpy() for k, v in self.vars.items()}

    def fresh(self, shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    @rule(name=st.sampled_from("abc"), data=st.data())
    def scatter(self, name, data):
        v = self.vars[name]
        rows = data.draw(st.lists(st.integers(0, v.shape[0] - 1), min_size=1, max_size=3,
                                  unique=True))
        upd = self.fresh((len(rows),) + tuple(v.shape[1:]))
        v.scatter_nd_update([[r] for r in rows], upd)
        self.working[name][rows] = upd

    @rule(name=st.sampled_from("abc"))
    def assign(self, name):
        self.assign_new(name)

    def assign_new(self, name):
        new = self.fresh(self.vars[name].shape)
        self.vars[name].assign(new)
        self.working[name] = new

    @rule(name=st.sampled_from("abc"))
    def gather(self, name):
        tf.gather(self.vars[name], [0])

    @rule()
    def commit(self):
        v = self.tracker.commit("c")
        self.parents[v] = self.head
        self.head = v
        self.versions[v] = {k: a.copy() for k, a in self.working.items()}

    @rule(keep=st.booleans(), name=st.sampled_from("abc"), sparse=st.booleans())
    def trial(self, keep, name, sparse):
        before = self.head
        with self.tracker.trial() as t:
            if t.base != before:
                self.parents[t.base] = before
                self.head = t.base
                self.versions[t.base] = {k: a.copy() for k, a in self.working.items()}
            if sparse:
                self.scatter_row(name)
            else:
                self.assign_new(name)
            if keep:
                v = t.keep()
        if keep:
            self.parents[v] = self.head
            self.head = v
            self.versions[v] = {k: a.copy() for k, a in self.working.items()}
        else:
            self.working = {k: a.copy() for k, a in self.versions[self.head].items()}

    def scatter_row(self, name):
        v = self.vars[name]
        upd = self.fresh((1,) + tuple(v.shape[1:]))
        v.scatter_nd_update([[0]], upd)
        self.working[name][[0]] = upd

    @rule(data=st.data())
    def restore(self, data):
        v = data.draw(st.sampled_from(sorted(self.versions)))
        self.tracker.restore(v)
        self.head = v
        self.working = {k: a.copy() for k, a in self.versions[v].items()}

    @precondition(lambda self: self.parents.get(self.head) is not None)
    @rule()
    def undo(self):
        clean = all(same(self.working[k], self.versions[self.head][k]) for k in self.working)
        if not clean:
            with pytest.raises(th.UncommittedChanges):
                self.tracker.undo()
            return
        parent = self.tracker.store.parent(self.head)
        assert self.tracker.undo() == parent
        self.head = parent
        self.working = {k: a.copy() for k, a in self.versions[parent].items()}

    @invariant()
    def variables_hold_the_working_values_and_is_dirty_says_if_they_moved(self):
        live = self.values()
        for k in live:
            assert same(live[k], self.working[k]), k
        moved = any(not same(self.working[k], self.versions[self.head][k]) for k in live)
        assert self.tracker.is_dirty() == moved


TestCopyOnRead = CopyOnRead.TestCase
TestCopyOnRead.settings = settings(max_examples=20, stateful_step_count=15, deadline=None,
                                   suppress_health_check=list(HealthCheck))


# ---- the default memory budget ----------------------------------------------------------


def test_a_tracker_without_a_store_gets_a_budget_of_four_states(tmp_path):
    """A state: the model's variables and the optimizer's (built by track)."""
    m = keras_model()
    opt = keras.optimizers.Adam(0.01)
    tr = th.tf.track(m, opt)
    state = sum(v.numpy().nbytes for v in [*m.variables, *opt.variables])
    assert tr.store.memory_budget == max(th.tf.DEFAULT_BUDGET_MODELS * state, 64 << 20)
    assert th.tf.track(m, opt, path=tmp_path / "run").store.memory_budget == max(4 * state, 64 << 20)
    assert th.tf.track(m, opt, store=th.Store()).store.memory_budget is None
    assert th.tf.track(m, opt, memory_budget=4321).store.memory_budget == 4321
    assert th.tf.track(m, opt, path=tmp_path / "r2", memory_budget=None).store.memory_budget is None
    with pytest.raises(TypeError):
        th.tf.track(m, opt, store=th.Store(), memory_budget=1)
    net = Net(tf.float16)
    assert th.tf.track(net).store.memory_budget == max(4 * sum(
        v.numpy().nbytes for v in (net.w, net.b, *net.layers)), 64 << 20)


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
    # A small model stays under the default budget's 64 MiB floor: encode every old
    # version now (enforcing encodes; only a commit lets versions go).
    tr.store.memory_budget = 0
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
