"""The JAX trackers with real JAX (CPU), Optax and Flax NNX: skipped when JAX is not
installed, unless TH_REQUIRE_JAX=1 (CI's jax tier), where a missing JAX, Optax or Flax is
a failure."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

if os.environ.get("TH_REQUIRE_JAX") == "1":
    import jax
    import optax
    from flax import nnx
else:
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    optax = pytest.importorskip("optax", reason="Optax is not installed")
    nnx = pytest.importorskip("flax.nnx", reason="Flax is not installed")

import jax.numpy as jnp  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.jax  # noqa: E402,F401
from conftest import same  # noqa: E402
from framework_machine import TrackerMachine  # noqa: E402


def np_tree(tree):
    """Copies of the leaves (typed keys as their key data, bool as uint8)."""
    return [np.array(th.jax.leaf_to_numpy(x)) for x in jax.tree_util.tree_leaves(tree)]


def assert_same_tree(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(la, lb):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        assert same(th.jax.leaf_to_numpy(x), th.jax.leaf_to_numpy(y))


# ---- the seed scenario, in pytrees --------------------------------------------------------


def test_seed_tree_goes_back_to_its_values_without_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = {"W": jnp.zeros((5, 5)), "b": jnp.zeros(5)}
    x = jnp.ones((2, 5))

    def y(p):
        return np.asarray(x @ p["W"] + p["b"])

    tracker = th.jax.track(params)
    ones = {"W": jnp.ones((5, 5)), "b": jnp.ones(5)}
    v1 = tracker.commit(ones, "ones")
    assert (y(ones) == 6).all()
    back = tracker.restore(tracker.store.parent(v1))
    assert (y(back) == 0).all()
    assert back["W"] is not params["W"] and back["W"].devices() == params["W"].devices()
    assert tracker.store.location is None and list(tmp_path.iterdir()) == []


def test_unchanged_leaves_are_neither_copied_nor_rebuilt():
    big = jnp.arange(1 << 16, dtype=jnp.float32)
    tree = {"big": big, "small": jnp.zeros(3)}
    tr = th.jax.track(tree)
    chunks = tr.stats().unique_chunks
    v1 = tr.commit({"big": big, "small": jnp.ones(3)})
    assert tr.stats().unique_chunks == chunks + 1      # only the small leaf's chunk
    # a new array with the old values writes nothing either (compared by chunk)
    tr.commit({"big": big + 0, "small": jnp.ones(3)})
    assert tr.stats().unique_chunks == chunks + 1
    back = tr.restore(v1)
    assert back["small"] is not tree["small"]
    assert tr.diff(v1, tr.store.parent(v1)).keys() == {"tree/small"}


def test_functional_trial_keeps_or_hands_back_the_original_tree():
    state = {"w": jnp.ones(4)}
    tr = th.jax.track(state)
    with tr.trial(state) as t:
        new = {"w": state["w"] * 3}
    assert t.result is state and t.kept is None
    with tr.trial(state) as t:
        new = {"w": state["w"] * 3}
        t.keep(new, loss=jnp.float32(0.5))
    assert t.result is new and tr.store.metadata(t.kept)["loss"] == 0.5
    assert tr.undo()["w"].tolist() == [1, 1, 1, 1]
    assert tr.redo()["w"].tolist() == [3, 3, 3, 3]


def test_a_donating_step_inside_a_reverted_trial_gets_its_tree_back():
    state = {"w": jnp.arange(8.0), "n": jnp.zeros((), jnp.int32)}
    step = jax.jit(lambda s: {"w": s["w"] * 2, "n": s["n"] + 1}, donate_argnums=0)
    tr = th.jax.track(state)
    with tr.trial(state) as t:
        new = step(state)
    if not state["w"].is_deleted():
        pytest.skip("this backend does not donate buffers")
    assert not t.result["w"].is_deleted()
    assert t.result["w"].tolist() == list(range(8)) and int(t.result["n"]) == 0
    del new


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_leaf_kinds_and_dtypes_come_back_as_they_went_in(dtype):
    key = jax.random.key(3)
    tree = {"a": jnp.linspace(0, 1, 7, dtype=dtype), "np": np.arange(3, dtype=np.int16),
            "f": 0.25, "i": 7, "flag": jnp.array([True, False]), "key": key,
            "nest": ({"t": (jnp.ones(2, dtype),)}, [jnp.zeros((2, 2), dtype)])}
    tr = th.jax.track(tree)
    tr.commit(jax.tree_util.tree_map(lambda x: x, tree))
    changed = dict(tree, a=tree["a"] + 1, f=0.5, key=jax.random.split(key)[0])
    tr.commit(changed)
    back = tr.undo()
    assert_same_tree(back, tree)
    assert back["a"].dtype == dtype and isinstance(back["f"], float)
    assert isinstance(back["np"], np.ndarray)
    assert jax.random.key_data(back["key"]).tolist() == jax.random.key_data(key).tolist()


def test_restore_into_a_tree_of_another_shape_or_structure_changes_nothing():
    tr = th.jax.track({"w": jnp.zeros(3), "b": jnp.zeros(2)})
    v0 = tr.store.head()
    v1 = tr.commit({"w": jnp.ones(3), "b": jnp.ones(2)})
    with pytest.raises(th.TrialError) as e:
        tr.restore(v0, like={"w": jnp.zeros(4), "b": jnp.zeros(2)})
    assert e.value.reason == "model structure" and "tree/w" in str(e.value)
    with pytest.raises(th.TrialError):
        tr.restore(v0, like={"w": jnp.zeros(3), "b": jnp.zeros(2, jnp.float16)})
    with pytest.raises(th.TrialError):
        tr.restore(v0, like={"w": jnp.zeros(3)})
    assert tr.store.head() == v1 and tr.state["w"].tolist() == [1, 1, 1]


def test_a_leaf_added_after_tracking_is_committed_and_checked_on_restore():
    tr = th.jax.track({"w": jnp.zeros(3)})
    v0 = tr.store.head()
    v1 = tr.commit({"w": jnp.zeros(3), "extra": jnp.ones(2)})
    assert "tree/extra" in tr.store.names()
    with pytest.raises(th.TrialError):
        tr.restore(v0)  # the last tree has `extra`, v0 lacks it
    assert tr.store.head() == v1
    assert tr.restore(v0, like={"w": jnp.zeros(3)})["w"].tolist() == [0, 0, 0]


# ---- optax training: accept/reject bit-identical to keeping references ----------------------


def mlp_params(key, dtype=jnp.float32):
    k1, k2 = jax.random.split(key)
    return {"l1": {"w": jax.random.normal(k1, (4, 8), dtype), "b": jnp.zeros(8, dtype)},
            "l2": {"w": jax.random.normal(k2, (8, 3), dtype), "b": jnp.zeros(3, dtype)}}


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["l1"]["w"] + p["l1"]["b"])
    return jnp.mean((h @ p["l2"]["w"] + p["l2"]["b"] - y) ** 2)


def batch(i, dtype=jnp.float32):
    k = jax.random.key(100 + i)
    return jax.random.normal(k, (16, 4), dtype), jax.random.normal(jax.random.split(k)[0],
                                                                     (16, 3), dtype)


OPTIMIZERS = {
    "sgd_momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2),
    "rmsprop": lambda: optax.rmsprop(1e-2),
    "adagrad": lambda: optax.adagrad(1e-2),
    "lion": lambda: optax.lion(1e-3),
    "lamb": lambda: optax.lamb(1e-2),
    "inject_adam": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("donate", [False, True])
def test_optax_training_with_accept_reject_matches_kept_references(name, donate):
    opt = OPTIMIZERS[name]()

    def step(state, x, y):
        p, s = state
        g = jax.grad(loss_fn)(p, x, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    jstep = jax.jit(step, donate_argnums=0 if donate else ())
    p = mlp_params(jax.random.key(0))
    ref = (p, opt.init(p))
    ref_np = np_tree(ref)
    state = jax.tree_util.tree_map(jnp.copy, ref)
    tr = th.jax.track(state)
    for i in range(6):
        accept = i % 3 != 1
        x, y = batch(i)
        # reference: NumPy copies of the state, the stepped state on accept
        out = jstep(jax.tree_util.tree_map(jnp.asarray, jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(ref), ref_np)), x, y)
        if accept:
            ref_np = np_tree(out)
        with tr.trial(state) as t:
            new = jstep(state, x, y)
            if accept:
                t.keep(new)
        state = t.result
        for a, b in zip(np_tree(state), ref_np):
            assert same(a, b), (name, i)
    tr.store.verify()
    assert tr.stats().versions == 1 + 4


# ---- the default memory budget ---------------------------------------------------------------


def test_a_tracker_without_a_store_gets_a_budget_of_four_tree_sizes(tmp_path):
    p = mlp_params(jax.random.key(0), jnp.bfloat16)
    tree = {"params": p, "step": 3, "key": jax.random.key(1), "np": np.zeros(5, np.int16)}
    nbytes = sum(a.nbytes for a in np_tree(tree))  # typed keys as their key data
    assert th.jax.tree_bytes(tree) == nbytes
    tr = th.jax.track(tree)
    assert tr.store.memory_budget == th.jax.DEFAULT_BUDGET_MODELS * nbytes == 4 * nbytes
    assert th.jax.track(tree, path=tmp_path / "run").store.memory_budget == 4 * nbytes
    assert th.jax.track(tree, store=th.Store()).store.memory_budget is None


def test_an_optimizer_beside_a_pytree_is_refused_before_a_repository_is_made(tmp_path):
    with pytest.raises(TypeError):
        th.jax.track({"w": jnp.zeros(3)}, optax.sgd(0.1), path=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_a_history_past_the_default_budget_reads_back_bit_for_bit():
    """Dense Adam steps on (params, opt_state) outgrow four tree sizes, so old versions are
    kept encoded; every version's tree comes back bit for bit against NumPy copies."""
    opt = optax.adam(1e-4)
    p = mlp_params(jax.random.key(0))
    state = (p, opt.init(p))

    @jax.jit
    def step(state, x, y):
        p, s = state
        u, s = opt.update(jax.grad(loss_fn)(p, x, y), s, p)
        return optax.apply_updates(p, u), s

    tr = th.jax.track(state)
    copies = [(tr.store.head(), np_tree(state))]
    for i in range(6):
        with tr.trial(state) as t:
            t.keep(step(state, *batch(i)))
        state = t.result
        copies.append((t.kept, np_tree(state)))
    tr.store.enforce_memory_budget()
    st = tr.stats()
    assert st.encoded_bytes > 0 and st.encoded_held_bytes < st.encoded_bytes
    for v, want in copies:
        for a, b in zip(np_tree(tr.restore(v)), want):
            assert same(a, b)
    tr.store.verify()


# ---- the functional model-based test ------------------------------------------------------


class FunctionalMachine(RuleBasedStateMachine):
    @initialize(dtype=st.sampled_from(["float32", "bfloat16", "float16"]))
    def setup(self, dtype):
        self.dir = tempfile.mkdtemp(prefix="th-jax-machine-")
        self.saved = False
        d = jnp.dtype(dtype)
        self.tree = {"a": jnp.arange(6, dtype=d).reshape(2, 3), "b": [jnp.ones(5, d), jnp.zeros((), d)]}
        self.tr = th.jax.track(self.tree)
        self.oracle = {self.tr.store.head(): np_tree(self.tree)}
        self.branches = {"main": self.tr.store.head()}
        self.attached = "main"

    def teardown(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    def moved(self, v):
        if self.attached is not None:
            self.branches[self.attached] = v

    def changed(self, scale):
        leaves, tdef = jax.tree_util.tree_flatten(self.tree)
        leaves = [leaves[0] * scale] + leaves[1:]
        return jax.tree_util.tree_unflatten(tdef, leaves)

    @rule(scale=st.sampled_from([2.0, -1.0]))
    def commit(self, scale):
        self.tree = self.changed(scale)
        v = self.tr.commit(self.tree)
        self.oracle[v] = np_tree(self.tree)
        self.moved(v)

    @rule(data=st.data())
    def restore(self, data):
        v = data.draw(st.sampled_from(sorted(self.oracle)))
        self.tree = self.tr.restore(v)
        self.moved(v)
        self.want = self.oracle[v]

    @rule(keep=st.booleans())
    def trial(self, keep):
        entry = self.tree
        with self.tr.trial(entry) as t:
            new = self.changed(0.5)
            if keep:
                v = t.keep(new)
        self.tree = t.result
        if keep:
            self.oracle[v] = np_tree(new)
            self.moved(v)
            assert t.result is new
        else:
            assert t.result is entry

    @rule(name=st.sampled_from(["x", "y"]))
    def branch(self, name):
        if name not in self.branches:
            self.tr.branch(name)
            self.branches[name] = self.tr.store.head()

    @rule(data=st.data())
    def checkout(self, data):
        name = data.draw(st.sampled_from(sorted(self.branches)))
        self.tree = self.tr.checkout(name)
        self.attached = name
        assert self.tr.store.head() == self.branches[name]

    @rule()
    def save_and_reopen(self):
        store = self.tr.store
        if self.saved:
            self.tr.save()
        else:
            self.tr.save(self.dir)
        self.saved = True
        hashes = {v: store.version_hash(v) for v in self.oracle}
        want = np_tree(self.tree)
        template = jax.tree_util.tree_map(jnp.zeros_like, self.tree)
        self.tr = th.jax.track(template, path=self.dir)
        self.tree = self.tr.state
        for a, b in zip(np_tree(self.tree), want):
            assert same(a, b)
        r = self.tr.store
        new = {}
        for v, h in hashes.items():
            try:
                new[v] = r.resolve(h)
            except KeyError:
                pass
        self.oracle = {new[v]: d for v, d in self.oracle.items() if v in new}
        self.branches = {b: new[v] for b, v in self.branches.items() if v in new}
        self.attached = r.current_branch()

    @invariant()
    def tree_is_heads_version(self):
        if not hasattr(self, "tr"):
            return
        head = self.tr.store.head()
        for a, b in zip(np_tree(self.tree), self.oracle[head]):
            assert same(a, b)


TestFunctionalMachine = FunctionalMachine.TestCase
TestFunctionalMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None,
                                          suppress_health_check=list(HealthCheck))


# ---- Flax NNX, in place -------------------------------------------------------------------


class Net(nnx.Module):
    def __init__(self, rngs, dtype=jnp.float32):
        self.l1 = nnx.Linear(4, 8, rngs=rngs, param_dtype=dtype, dtype=dtype)
        self.bn = nnx.BatchNorm(8, rngs=rngs, param_dtype=dtype, dtype=dtype)
        self.l2 = nnx.Linear(8, 3, rngs=rngs, param_dtype=dtype, dtype=dtype)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.bn(self.l1(x))))


def nnx_values(*objs):
    out = {}
    for i, obj in enumerate(objs):
        for path, v in nnx.iter_graph(obj):
            if isinstance(v, nnx.Variable):
                out[f"{i}/{'/'.join(map(str, path))}"] = np.array(v.get_value())
    return out


@nnx.jit
def nnx_step(model, opt, x, y):
    def lf(m):
        return jnp.mean((m(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(lf)(model)
    opt.update(model, grads)
    return loss


@pytest.mark.parametrize("name", ["adam", "sgd_momentum", "lion"])
def test_nnx_training_with_accept_reject_matches_numpy_copies(name):
    m1, m2 = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    o1 = nnx.Optimizer(m1, OPTIMIZERS[name](), wrt=nnx.Param)
    o2 = nnx.Optimizer(m2, OPTIMIZERS[name](), wrt=nnx.Param)
    tr = th.jax.track(m1, o1)
    for i in range(6):
        accept = i % 3 != 1
        saved = (nnx.state(m2), nnx.state(o2))
        saved = jax.tree_util.tree_map(lambda a: np.array(a), saved)
        nnx_step(m2, o2, *batch(i))
        if not accept:
            nnx.update(m2, jax.tree_util.tree_map(jnp.asarray, saved[0]))
            nnx.update(o2, jax.tree_util.tree_map(jnp.asarray, saved[1]))
        with tr.trial() as t:
            loss = nnx_step(m1, o1, *batch(i))
            if accept:
                t.keep(loss=loss)
        a, b = nnx_values(m1, o1), nnx_values(m2, o2)
        assert a.keys() == b.keys()
        for k in a:
            assert same(a[k], b[k]), (name, i, k)
    assert tr.stats().versions == 1 + 4


def test_nnx_variable_added_inside_a_trial_is_named_after_the_rest_is_reverted():
    m = Net(nnx.Rngs(0))
    tr = th.jax.track(m)
    before = nnx_values(m)
    with pytest.raises(th.TrialError) as e:
        with tr.trial():
            m.l1.kernel.set_value(m.l1.kernel.get_value() * 2)
            m.extra = nnx.Param(jnp.ones(2))
    assert e.value.reason == "model structure" and "model/extra" in str(e.value)
    now = nnx_values(m)
    now.pop("0/extra")
    for k in before:
        assert same(now[k], before[k])


def test_nnx_restore_into_a_variable_of_another_shape_changes_nothing():
    m = Net(nnx.Rngs(0))
    tr = th.jax.track(m)
    v0 = tr.store.head()
    m.l2.bias.set_value(m.l2.bias.get_value() + 1)
    v1 = tr.commit("moved")
    m.l1.bias.set_value(jnp.zeros(5))
    bias2 = np.array(m.l2.bias.get_value())
    with pytest.raises(th.TrialError):
        tr.restore(v0)
    assert same(np.array(m.l2.bias.get_value()), bias2) and tr.store.head() == v1


def test_an_nnx_tracker_without_a_store_gets_a_budget_of_four_model_sizes(tmp_path):
    m = Net(nnx.Rngs(0), jnp.float16)
    o = nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param)
    nbytes = sum(a.nbytes for a in nnx_values(m).values())  # the model's, not the optimizer's
    assert th.jax.track(m, o).store.memory_budget == 4 * nbytes
    assert th.jax.track(m, o, path=tmp_path / "run").store.memory_budget == 4 * nbytes


def test_an_nnx_history_past_the_default_budget_reads_back_bit_for_bit():
    m = Net(nnx.Rngs(0))
    o = nnx.Optimizer(m, optax.adam(1e-4), wrt=nnx.Param)
    tr = th.jax.track(m, o)
    copies = [(tr.store.head(), nnx_values(m, o))]
    for i in range(6):
        with tr.trial() as t:
            nnx_step(m, o, *batch(i))
            copies.append((t.keep(), nnx_values(m, o)))
    tr.store.enforce_memory_budget()
    st = tr.stats()
    assert st.encoded_bytes > 0 and st.encoded_held_bytes < st.encoded_bytes
    for v, want in copies:
        tr.restore(v)
        got = nnx_values(m, o)
        assert got.keys() == want.keys()
        for k in want:
            assert same(got[k], want[k]), k
    tr.store.verify()


class NnxMachine(TrackerMachine):
    def make(self, dtype, seed):
        return Net(nnx.Rngs(seed), getattr(jnp, dtype))

    def values(self, m):
        return {f"model/{k[2:]}": v for k, v in nnx_values(m).items()}

    def assign(self, m, name, value):
        for path, v in nnx.iter_graph(m):
            if isinstance(v, nnx.Variable) and "model/" + "/".join(map(str, path)) == name:
                v.set_value(jnp.asarray(value))
                return
        raise KeyError(name)

    def track(self, m, **kw):
        return th.jax.track(m, **kw)


TestNnxMachine = NnxMachine.TestCase
TestNnxMachine.settings = settings(max_examples=20, stateful_step_count=10, deadline=None,
                                   suppress_health_check=list(HealthCheck))


def test_nnx_half_precision_reverts_bit_for_bit():
    for dtype in (jnp.float16, jnp.bfloat16):
        m = Net(nnx.Rngs(0), dtype)
        o = nnx.Optimizer(m, optax.sgd(0.01), wrt=nnx.Param)
        tr = th.jax.track(m, o)
        before = nnx_values(m, o)
        with tr.trial():
            nnx_step(m, o, *batch(0, dtype))
        after = nnx_values(m, o)
        for k in before:
            assert same(after[k], before[k]), k
        assert str(tr.store.get("model/l1/kernel").dtype) == jnp.dtype(dtype).name
