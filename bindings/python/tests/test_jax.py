"""The JAX trackers with real JAX (CPU), Optax and Flax NNX: skipped when JAX is not
installed, unless TH_REQUIRE_JAX=1 (CI's jax tier), where a missing JAX, Optax or Flax is
a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

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
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.jax  # noqa: E402,F401
from checkpoint_faults import KINDS, FaultyStore, Loop, Recording, same_value  # noqa: E402
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
    assert tr.store.memory_budget == max(th.jax.DEFAULT_BUDGET_STATES * nbytes, 64 << 20)
    assert th.jax.track(tree, path=tmp_path / "run").store.memory_budget == max(4 * nbytes, 64 << 20)
    assert th.jax.track(tree, store=th.Store()).store.memory_budget is None
    assert th.jax.track(tree, memory_budget=123).store.memory_budget == 123
    assert th.jax.track(tree, path=tmp_path / "r2", memory_budget=None).store.memory_budget is None
    with pytest.raises(TypeError):
        th.jax.track(tree, store=th.Store(), memory_budget=1)


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
    # A small model stays under the default budget's 64 MiB floor: encode every old
    # version now (enforcing encodes; only a commit lets versions go).
    tr.store.memory_budget = 0
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


# ---- the pytree tracker saves as every tracker does: save(), checkpoint_every(), close() ----


def ckpt_init():
    return {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4),
            "b": jnp.zeros(4, jnp.float32), "n": jnp.zeros((), jnp.int32)}


@jax.jit
def ckpt_step(state, i):
    return {"w": state["w"] * 0.5 + i, "b": state["b"] + 1, "n": state["n"] + 1}


def leaf_values(tree) -> dict:
    return {k: np.array(th.jax.leaf_to_numpy(x)) for k, x in tree.items()}


def ckpt_reference(steps: int) -> dict:
    s = ckpt_init()
    for i in range(steps):
        s = ckpt_step(s, i)
    return leaf_values(s)


class Run:
    """A pytree and its tracker; `kept()` is one kept step (a trial's keep())."""

    def __init__(self, path=None, **kw) -> None:
        self.state = ckpt_init()
        self.i = 0
        self.tr = th.jax.track(self.state, path=path, **kw)

    def kept(self):
        with self.tr.trial(self.state) as t:
            t.keep(ckpt_step(self.state, self.i))
        self.state, self.i = t.result, self.i + 1
        return t.kept


CKPT_CHILD = textwrap.dedent("""
    import sys, numpy as np, tensor_history as th
    r = th.Store.open(sys.argv[1])
    np.savez(sys.argv[2], **{n.replace("/", "|"): r.get(n) for n in r.names()})
    print(r.version_hash(r.head()))
""")


def test_a_pytree_loop_with_checkpoint_every_reopens_in_another_process_bit_for_bit(tmp_path):
    state = ckpt_init()
    with th.jax.track(state, path=tmp_path / "run") as tr:
        tr.checkpoint_every(2)
        for i in range(9):
            with tr.trial(state) as t:
                new = ckpt_step(state, i)
                if i % 3 != 2:  # two of three kept: six kept steps, three checkpoints due
                    t.keep(new)
            state = t.result
        want = tr.store.version_hash(tr.store.head())
        held = {n: tr.store.get(n) for n in tr.store.names()}
    assert tr.store.closed  # the end of the block closed it, after the last checkpoint
    out = tmp_path / "state.npz"
    res = subprocess.run([sys.executable, "-c", CKPT_CHILD, str(tmp_path / "run"), str(out)],
                         capture_output=True, text=True, check=True)
    assert res.stdout.strip() == want
    there = np.load(out)
    assert sorted(k.replace("|", "/") for k in there.files) == sorted(held)
    for n, a in held.items():
        b = there[n.replace("/", "|")]
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), n
    # and a tracker on the repository resumes that tree
    resumed = th.jax.track(jax.tree_util.tree_map(jnp.zeros_like, state), path=tmp_path / "run")
    assert same_value(leaf_values(resumed.state), leaf_values(state))


def test_a_due_checkpoint_is_deferred_while_one_is_in_flight_never_stacked(tmp_path):
    run = Run(tmp_path / "run")
    tr = run.tr
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(2)
    kept = [run.kept() for _ in range(2)]
    assert [v for v, _ in rec.started] == [kept[1]]
    kept += [run.kept() for _ in range(3)]  # due again after two more: deferred
    assert len(rec.started) == 1
    rec.started[0][1].wait()  # it ends; the next kept step starts the deferred one
    kept.append(run.kept())
    assert [v for v, _ in rec.started] == [kept[1], kept[5]]
    kept.append(run.kept())  # not due (the next due step is the 8th)
    assert len(rec.started) == 2
    v = tr.commit(ckpt_step(run.state, 99), "plain commit")  # a commit() counts too
    assert len(rec.started) == 2  # due, deferred: the second is still in flight
    want = tr.store.version_hash(v)
    tr.close()  # waits for the second and writes the deferred one
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want
    assert len(r.log()) == 1 + 7 + 1


def test_a_deferral_does_not_move_the_later_due_steps(tmp_path):
    run = Run(tmp_path / "run")
    tr = run.tr
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(3)
    kept = [run.kept() for _ in range(6)]
    assert [v for v, _ in rec.started] == [kept[2]]
    rec.started[0][1].wait()
    kept += [run.kept() for _ in range(3)]
    assert [v for v, _ in rec.started] == [kept[2], kept[6]]
    want = tr.store.version_hash(kept[8])
    tr.close()  # writes the 9th, due and deferred
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want and len(r.log()) == 1 + 9


def moved_by_another_store(path) -> None:
    other = th.Store.open(path)
    other.insert("mine", np.ones(3, np.float32))
    other.commit("theirs")
    other.save()


def test_an_error_of_a_background_checkpoint_is_raised_by_the_next_keep_before_it_commits(
        tmp_path):
    run = Run(tmp_path / "run")
    tr = run.tr
    rec = Recording(tr.store)
    tr.store = rec
    tr.checkpoint_every(1)
    moved_by_another_store(tmp_path / "run")
    run.kept()  # its checkpoint meets the moved branch
    with pytest.raises(th.BranchMoved):
        rec.started[0][1].wait()  # (the test waits; the tracker has not seen it yet)
    state, head, n_log = run.state, tr.store.head(), len(tr.store.log())
    with pytest.raises(th.BranchMoved):
        run.kept()
    assert tr.store.head() == head and len(tr.store.log()) == n_log
    assert run.state is state and tr.state is state
    run.kept()  # reported once: this one commits, and checkpoints
    assert len(tr.store.log()) == n_log + 1
    with pytest.raises(th.BranchMoved):
        tr.close()
    assert tr.store.closed


def test_a_checkpoint_that_ends_with_an_error_while_keep_commits_is_raised_by_the_next_call(
        tmp_path):
    run = Run(tmp_path / "run")
    tr = run.tr
    rec = Recording(tr.store, ends_at_commit=True)
    tr.store = rec
    tr.checkpoint_every(1)
    moved_by_another_store(tmp_path / "run")
    run.kept()
    with pytest.raises(th.BranchMoved):
        rec.started[0][1].real.wait()  # it failed; the tracker has not seen it
    n_log = len(tr.store.log())
    v = run.kept()  # it ends while this call commits: not raised here
    assert tr.store.head() == v and len(tr.store.log()) == n_log + 1
    state = run.state
    with pytest.raises(th.BranchMoved):
        tr.commit(ckpt_step(state, 50), "raises before it commits")
    assert tr.store.head() == v and tr.state is state
    tr.commit(ckpt_step(state, 50), "again")
    assert len(tr.store.log()) == n_log + 2
    with pytest.raises(th.BranchMoved):
        tr.close()


def test_a_checkpoint_whose_save_cannot_start_is_raised_by_the_next_call(tmp_path):
    run = Run(tmp_path / "run")
    tr = run.tr
    tr.checkpoint_every(2)
    run.kept()
    moved_by_another_store(tmp_path / "run")
    tr.save(background=True)  # fails in the background; nobody waits for it
    v = run.kept()  # its checkpoint cannot start (the store raises that save's error)
    assert tr.store.head() == v
    with pytest.raises(th.BranchMoved):
        run.kept()
    assert tr.store.head() == v
    run.kept()
    with pytest.raises(th.BranchMoved):
        tr.close()


def test_the_error_of_the_last_checkpoint_is_raised_by_close_or_save(tmp_path):
    for end in ("close", "save", "with"):
        path = tmp_path / end
        run = Run(path)
        tr = run.tr
        tr.checkpoint_every(1)
        moved_by_another_store(path)
        if end == "with":
            with pytest.raises(th.BranchMoved):
                with tr:
                    run.kept()
            assert tr.store.closed
            continue
        run.kept()
        with pytest.raises(th.BranchMoved):
            getattr(tr, end)()


def test_checkpoint_every_rejects_bad_counts_and_needs_a_repository(tmp_path):
    run = Run()
    tr = run.tr
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(th.InvalidArgument):
            tr.checkpoint_every(bad, path=tmp_path / "never")
    assert not (tmp_path / "never").exists()
    with pytest.raises(th.InvalidArgument):
        tr.checkpoint_every(3)  # an in-memory store and no path
    tr.checkpoint_every(1, path=tmp_path / "run")  # bound there, and checkpoints follow
    v = run.kept()
    want = tr.store.version_hash(v)
    tr.checkpoint_every(None)  # off: the one in flight still ends at close
    run.kept()
    tr.close()
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == want


def test_save_in_the_background_and_to_a_path(tmp_path):
    run = Run()
    tr = run.tr
    with pytest.raises(th.TrialError):
        with tr.trial(run.state):
            tr.save(tmp_path / "never")  # inside a trial
    assert not (tmp_path / "never").exists()
    p = tr.save(tmp_path / "run", background=True)  # bound by a save first
    assert isinstance(p, th.PendingSave) and tr.store.location is not None
    p.wait()
    v = run.kept()
    assert tr.save().versions_written >= 1
    r = th.Store.open(tmp_path / "run")
    assert r.version_hash(r.head()) == tr.store.version_hash(v)


class Retry(Exception):
    """A kept step to run again."""


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=st.lists(st.sampled_from((None,) + KINDS), max_size=8),
       how=st.sampled_from(["keep, again", "trial, again", "commit"]),
       every=st.sampled_from([1, 2]))
def test_a_pytree_checkpoint_failing_at_any_point_never_fails_a_call_that_committed(
        plan, how, every):
    """As for the torch tracker (``test_checkpoint_every.py``): a call that raises changes
    nothing (HEAD, log, branch, ``state``, the tree handed in, ``t.kept``), every error
    is raised exactly once, and each step is committed once."""
    path = tempfile.mkdtemp(prefix="th-jax-ckpt-faults-")
    try:
        run = Run(path)
        tr = run.tr
        faulty = FaultyStore(tr.store, plan)
        tr.store = faulty
        tr.checkpoint_every(every)
        loop = Loop(tr, lambda: {"state": leaf_values(tr.state), "held": leaf_values(run.state)})
        steps = 6
        for i in range(steps):
            if how == "commit":
                new = ckpt_step(run.state, i)
                assert loop.call(lambda: tr.commit(new)) or loop.call(lambda: tr.commit(new))
                run.state = new
            elif how == "keep, again":
                with tr.trial(run.state) as t:
                    new = ckpt_step(run.state, i)
                    seen = lambda: {"kept": t.kept, "result": leaf_values(t.result)}  # noqa: E731
                    assert loop.call(lambda: t.keep(new), seen) or \
                        loop.call(lambda: t.keep(new), seen)
                assert t.result is new
                run.state = t.result
            else:  # a failed keep() ends the trial, which hands the entry tree back
                for attempt in range(2):
                    try:
                        with tr.trial(run.state) as t:
                            new = ckpt_step(run.state, i)
                            if not loop.call(lambda: t.keep(new), lambda: {"kept": t.kept}):
                                raise Retry
                        break
                    except Retry:
                        assert t.result is run.state
                else:
                    raise AssertionError("a step failed twice")
                run.state = t.result
        assert len(tr.store.log()) == 1 + steps
        loop.close()
        loop.check_errors(faulty)
        assert same_value(leaf_values(run.state), ckpt_reference(steps))
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---- NumPy leaves written in place ------------------------------------------------------


def test_a_numpy_leaf_changed_in_place_is_committed_and_restored():
    state = {"a": np.zeros(4, np.float32), "b": jnp.ones(3)}
    tr = th.jax.track(state)
    v0 = tr.store.head()
    state["a"][:] = 5
    v1 = tr.commit(state)
    assert tr.store.snapshot(v1)["tree/a"].tolist() == [5, 5, 5, 5]
    assert tr.diff(v0, v1).keys() == {"tree/a"}
    back = tr.restore(v0)
    assert back["a"].tolist() == [0, 0, 0, 0] and back["a"] is not state["a"]
    assert back["b"] is state["b"]  # an immutable leaf the versions share is handed back
    # a write into a NumPy leaf handed back changes no version
    back["a"][:] = 7
    assert tr.store.snapshot(v0)["tree/a"].tolist() == [0, 0, 0, 0]
    assert tr.restore(v1)["a"].tolist() == [5, 5, 5, 5]
    # a restore of HEAD after an in-place write gives HEAD's values back
    tr.state["a"][:] = 9
    assert tr.restore(v1)["a"].tolist() == [5, 5, 5, 5]
    assert tr.store.snapshot(v0)["tree/a"].tolist() == [0, 0, 0, 0]


def test_a_trial_hands_back_numpy_leaves_written_in_place_with_the_versions_values():
    state = {"a": np.zeros(3, np.float32), "b": jnp.ones(2)}
    tr = th.jax.track(state)
    with tr.trial(state) as t:
        state["a"][:] = 4  # an in-place step, not kept
    assert t.result["a"].tolist() == [0, 0, 0] and t.result["b"] is state["b"]
    assert tr.store.head() == t.base
    kept = {"a": np.full(3, 2, np.float32), "b": jnp.ones(2)}
    with tr.trial(t.result) as t:
        t.keep(kept)
        kept["a"][0] = -1  # after keep(): put back on exit, as for the other trackers
    assert t.result["a"].tolist() == [2, 2, 2] and t.result["b"] is kept["b"]
    assert tr.store.snapshot(t.kept)["tree/a"].tolist() == [2, 2, 2]
    # unchanged NumPy leaves stay the caller's objects
    with tr.trial(t.result) as t2:
        pass
    assert t2.result is t.result


NP_LEAVES = ("n", "m", "flag")


class MutableLeavesMachine(RuleBasedStateMachine):
    """In-place writes to NumPy leaves and new JAX arrays between commits, restores and
    trials, against an oracle of ``np.copy``s per version: every version's content, every
    diff and every restore agree with the oracle, and writes into returned trees never
    change a version."""

    @initialize()
    def setup(self):
        self.tree = {"n": np.arange(6, dtype=np.float32), "m": np.zeros((2, 3), np.int16),
                     "flag": np.array([True, False, True]), "j": jnp.arange(4.0), "s": 0.5}
        self.tr = th.jax.track(self.tree)
        self.oracle = {self.tr.store.head(): self.copies(self.tree)}

    @staticmethod
    def copies(tree):
        return {"tree/" + k: np.array(th.jax.leaf_to_numpy(x)) for k, x in tree.items()}

    def check_tree(self, tree, v):
        assert self.copies(tree).keys() == self.oracle[v].keys()
        for n, a in self.copies(tree).items():
            assert same(a, self.oracle[v][n]), (v, n)

    @rule(leaf=st.sampled_from(NP_LEAVES), data=st.data())
    def write_in_place(self, leaf, data):
        a = self.tree[leaf]
        i = data.draw(st.integers(0, a.size - 1))
        if a.dtype == np.bool_:
            a.reshape(-1)[i] = not a.reshape(-1)[i]
        else:
            a.reshape(-1)[i] = data.draw(st.integers(-3, 3))

    @rule(x=st.integers(-2, 2))
    def replace_jax_leaf(self, x):
        self.tree["j"] = self.tree["j"] + x  # a new array (x == 0: the same values)

    @rule()
    def commit(self):
        prev = self.tr.store.head()
        v = self.tr.commit(self.tree)
        self.oracle[v] = self.copies(self.tree)
        self.check_diff(prev, v)

    @rule(data=st.data())
    def restore(self, data):
        v = data.draw(st.sampled_from(sorted(self.oracle)))
        old = self.tree
        self.tree = self.tr.restore(v)
        self.check_tree(self.tree, v)
        for k in NP_LEAVES:  # the caller's own arrays: not the tree it had
            assert self.tree[k] is not old[k]

    @rule()
    def undo(self):
        head = self.tr.store.head()
        parent = self.tr.store.parent(head)
        if parent is None or parent not in self.oracle:
            return
        self.tree = self.tr.undo()
        self.check_tree(self.tree, parent)

    @rule(keep=st.booleans(), leaf=st.sampled_from(NP_LEAVES), after=st.booleans())
    def trial(self, keep, leaf, after):
        entry = self.tree
        at_entry = self.copies(entry)
        with self.tr.trial(entry) as t:
            entry[leaf].reshape(-1)[0] = not entry[leaf].reshape(-1)[0] \
                if entry[leaf].dtype == np.bool_ else entry[leaf].reshape(-1)[0] + 1
            if keep:
                t.keep(entry)
                kept = self.copies(entry)
                if after:  # written after keep(): put back on exit
                    entry["n"][-1] += 10
        base = self.oracle.setdefault(t.base, at_entry)
        for n, a in at_entry.items():  # the entry state, committed first if it moved
            assert same(base[n], a), (t.base, n)
        if keep:
            self.oracle[t.kept] = kept
            self.check_tree(t.result, t.kept)
        else:
            self.check_tree(t.result, t.base)
        self.tree = t.result

    @rule(data=st.data())
    def diff(self, data):
        a = data.draw(st.sampled_from(sorted(self.oracle)))
        b = data.draw(st.sampled_from(sorted(self.oracle)))
        self.check_diff(a, b)

    def check_diff(self, a, b):
        want = {n for n in self.oracle[a] if not same(self.oracle[a][n], self.oracle[b][n])}
        assert self.tr.diff(a, b).keys() == want, (a, b)

    @invariant()
    def every_version_holds_its_copies(self):
        if not hasattr(self, "tr"):
            return
        for v, want in self.oracle.items():
            snap = self.tr.store.snapshot(v)
            for n, a in want.items():
                assert same(snap[n], a), (v, n)


TestMutableLeavesMachine = MutableLeavesMachine.TestCase
TestMutableLeavesMachine.settings = settings(max_examples=40, stateful_step_count=15,
                                             deadline=None,
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


def test_an_nnx_tracker_without_a_store_gets_a_budget_of_four_tracked_states(tmp_path):
    m = Net(nnx.Rngs(0), jnp.float16)
    o = nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param)
    # The state: the model's Variables and the optimizer's (Adam's moments, its count).
    nbytes = sum(a.nbytes for a in nnx_values(m, o).values())
    assert th.jax.DEFAULT_BUDGET_STATES == 4
    assert th.jax.track(m, o).store.memory_budget == max(4 * nbytes, 64 << 20)
    assert th.jax.track(m, o, path=tmp_path / "run").store.memory_budget == max(4 * nbytes, 64 << 20)
    assert th.jax.track(m, o, memory_budget=1000).store.memory_budget == 1000
    assert th.jax.track(m, o, memory_budget=None).store.memory_budget is None


def test_an_nnx_history_past_the_default_budget_reads_back_bit_for_bit():
    m = Net(nnx.Rngs(0))
    o = nnx.Optimizer(m, optax.adam(1e-4), wrt=nnx.Param)
    tr = th.jax.track(m, o)
    copies = [(tr.store.head(), nnx_values(m, o))]
    for i in range(6):
        with tr.trial() as t:
            nnx_step(m, o, *batch(i))
            copies.append((t.keep(), nnx_values(m, o)))
    # A small model stays under the default budget's 64 MiB floor: encode every old
    # version now (enforcing encodes; only a commit lets versions go).
    tr.store.memory_budget = 0
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


def test_arrays_sharded_over_two_devices_come_back_on_their_devices_and_sharding():
    """Leaves sharded over two devices (two host devices, as CI has no accelerator) are
    read through the host and put back with their own sharding: a restore or a rejected
    trial moves nothing to one device, and the values are bit-identical."""
    code = textwrap.dedent("""
        import numpy as np
        import jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import tensor_history as th, tensor_history.jax
        assert len(jax.devices()) == 2, jax.devices()
        mesh = Mesh(np.array(jax.devices()), ("x",))
        rows = NamedSharding(mesh, P("x"))
        whole = NamedSharding(mesh, P())
        rng = np.random.default_rng(0)
        params = {"w": jax.device_put(rng.normal(size=(8, 4)).astype(np.float32), rows),
                  "b": jax.device_put(np.arange(4, dtype=np.float32), whole),
                  "step": jnp.zeros((), jnp.int32)}
        tr = th.jax.track(params)
        want = {k: np.asarray(v) for k, v in params.items()}
        step = jax.jit(lambda p: {"w": p["w"] * 2 + 1, "b": p["b"] - 1, "step": p["step"] + 1})
        state = params
        with tr.trial(state) as t:
            new = step(state)
            kept = {k: np.asarray(v) for k, v in new.items()}
            v1 = t.keep(new)
        state = t.result
        with tr.trial(state) as t:
            step(state)   # not kept
        state = t.result
        for k, v in state.items():
            assert np.array_equal(np.asarray(v), kept[k]), k
        state = tr.undo()   # built from the store, on the template's sharding
        for k, v in state.items():
            assert np.array_equal(np.asarray(v), want[k]), k
        assert state["w"].sharding == rows, state["w"].sharding
        assert state["b"].sharding.is_equivalent_to(whole, 1), state["b"].sharding
        assert len(state["w"].devices()) == 2
        state = tr.restore(v1)
        for k, v in state.items():
            assert np.array_equal(np.asarray(v), kept[k]), k
        assert state["w"].sharding == rows and len(state["w"].devices()) == 2
        print("ok")
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
