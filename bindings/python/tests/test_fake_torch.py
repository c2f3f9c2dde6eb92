"""The torch adapter's logic against a duck-typed fake torch (runs without torch)."""

from __future__ import annotations

import copy
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fake_torch as ft
import tensor_history as th


@pytest.fixture(autouse=True)
def fake_torch_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", ft)
    yield


def make(seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    w = ft.Tensor(rng.standard_normal((64, 16)).astype(dtype))
    b = ft.Tensor(np.zeros(16, dtype))
    count = ft.Tensor(np.zeros((), np.int64))
    model = ft.Model({"emb.weight": w, "bias": b, "count": count}, tie={"head.weight": "emb.weight"})
    opt = ft.SGD([w, b], lr=0.1)
    return model, opt


def state(model, opt) -> dict:
    """A deep copy of everything the tracker must put back."""
    out = {k: np.array(t._arr, copy=True) for k, t in model.tensors.items()}
    for i, p in enumerate(opt.param_groups[0]["params"]):
        for k, v in opt.state.get(p, {}).items():
            out[f"opt{i}/{k}"] = np.array(v._arr, copy=True) if isinstance(v, ft.Tensor) else copy.deepcopy(v)
    out["lr"] = opt.param_groups[0]["lr"]
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k], k


def train_step(model, opt, rng, lr=None):
    if lr is not None:
        opt.param_groups[0]["lr"] = lr
    grads = [rng.standard_normal(p.shape) for p in opt.param_groups[0]["params"]]
    opt.step(grads)
    model.tensors["count"].add_(1)


def test_trial_without_keep_puts_everything_back_in_place():
    model, opt = make()
    tr = th.torch.track(model, opt)
    before = state(model, opt)
    w = model.tensors["emb.weight"]
    arr_id = id(w._arr)
    with tr.trial("probe"):
        train_step(model, opt, np.random.default_rng(1), lr=5.0)
        assert opt.state  # momentum state appeared
    assert_same(state(model, opt), before)
    assert not opt.state  # state created inside the trial is gone again
    assert id(model.tensors["emb.weight"]._arr) == arr_id  # same storage, written in place


def test_keep_commits_and_undo_redo_walk_kept_steps():
    model, opt = make()
    tr = th.torch.track(model, opt)
    s0 = state(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        v1 = t.keep("step 1", loss=0.5)
    s1 = state(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(2))
        t.keep()
    s2 = state(model, opt)
    meta = tr.store.metadata(v1)
    assert meta["loss"] == 0.5 and set(meta) == {"loss", th.torch.SCALARS_KEY}
    assert tr.undo() == v1
    assert_same(state(model, opt), s1)
    tr.undo()
    assert_same(state(model, opt), s0)
    tr.redo()
    tr.redo()
    assert_same(state(model, opt), s2)
    tr.restore(v1)
    assert_same(state(model, opt), s1)


def test_an_exception_reverts_and_propagates():
    model, opt = make()
    tr = th.torch.track(model, opt)
    before = state(model, opt)
    with pytest.raises(ZeroDivisionError):
        with tr.trial():
            train_step(model, opt, np.random.default_rng(3))
            1 / 0
    assert_same(state(model, opt), before)


def test_changes_after_keep_are_reverted():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        t.keep()
        kept = state(model, opt)
        train_step(model, opt, np.random.default_rng(2))
    assert_same(state(model, opt), kept)


def test_tied_weights_are_stored_once():
    model, opt = make()
    tr = th.torch.track(model, opt)
    assert "model/emb.weight" in tr.store.names() and "model/head.weight" not in tr.store.names()


def test_bfloat16_parameters_round_trip():
    model, opt = make(dtype=ml_dtypes.bfloat16)
    tr = th.torch.track(model, opt)
    assert tr.store.info("model/emb.weight")[0] == "bf16"
    before = state(model, opt)
    with tr.trial():
        train_step(model, opt, np.random.default_rng(1))
    assert_same(state(model, opt), before)


def test_untouched_tensors_are_skipped_by_version_counter():
    model, opt = make()
    tr = th.torch.track(model, opt)
    # a write that bypasses torch: no version bump, so the tracker trusts the tensor
    with tr.trial():
        model.tensors["bias"]._arr[0] = 42.0
    assert model.tensors["bias"]._arr[0] == 42.0
    tr2 = th.torch.track(*make(), trust_versions=False)
    m2 = tr2.model
    with tr2.trial():
        m2.tensors["bias"]._arr[0] = 42.0
    assert m2.tensors["bias"]._arr[0] == 0.0


def test_restores_advance_version_counters_of_written_tensors():
    model, opt = make()
    tr = th.torch.track(model, opt)
    w, b = model.tensors["emb.weight"], model.tensors["bias"]
    with tr.trial():
        w.add_(1.0)
        after_step = (w._version, b._version)
    assert w._version > after_step[0]  # written back: bumped like an in-place copy_
    assert b._version == after_step[1]  # untouched: not written, not bumped


def test_misuse_raises_and_changes_nothing():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with pytest.raises(th.NothingToUndo):
        tr.undo()
    train_step(model, opt, np.random.default_rng(1))
    dirty = state(model, opt)
    with pytest.raises(th.UncommittedChanges):
        tr.undo()
    assert_same(state(model, opt), dirty)
    tr.commit("now")
    with tr.trial():
        with pytest.raises(th.TrialError):
            with tr.trial():
                pass
        with pytest.raises(th.TrialError):
            tr.commit()
    with pytest.raises(th.TrialError):
        tr.trial().keep()


def test_entering_a_trial_on_a_changed_model_records_a_base():
    model, opt = make()
    tr = th.torch.track(model, opt)
    train_step(model, opt, np.random.default_rng(1))
    changed = state(model, opt)
    with tr.trial():
        train_step(model, opt, np.random.default_rng(2))
    assert_same(state(model, opt), changed)
    assert tr.store.log()[0].message.endswith("(base)")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["keep", "revert", "raise", "undo", "commit"]),
                          st.integers(0, 1000)), max_size=12))
def test_random_trials_match_a_deep_copy_oracle(ops):
    model, opt = make()
    tr = th.torch.track(model, opt)
    kept = [state(model, opt)]
    for op, seed in ops:
        rng = np.random.default_rng(seed)
        if op == "keep":
            with tr.trial() as t:
                train_step(model, opt, rng, lr=float(seed % 7) / 10)
                t.keep()
            kept.append(state(model, opt))
        elif op == "revert":
            with tr.trial():
                train_step(model, opt, rng)
        elif op == "raise":
            with pytest.raises(RuntimeError):
                with tr.trial():
                    train_step(model, opt, rng)
                    raise RuntimeError("boom")
        elif op == "commit":
            train_step(model, opt, rng)
            tr.commit("outside")
            kept.append(state(model, opt))
        elif op == "undo":
            if len(kept) > 1:
                tr.undo()
                kept.pop()
            else:
                with pytest.raises(th.NothingToUndo):
                    tr.undo()
        assert_same(state(model, opt), kept[-1])
    tr.store.verify()


def test_save_then_track_on_the_path_resumes_model_and_optimizer(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path)
    rng = np.random.default_rng(1)
    with tr.trial() as t:
        train_step(model, opt, rng, lr=0.05)
        t.keep("step 1")
    with tr.trial():
        train_step(model, opt, rng, lr=9.0)  # reverted
    saved = state(model, opt)
    assert tr.save().versions_written == 2
    # a fresh process would build the model from scratch: other values, no optimizer state
    model2, opt2 = make(seed=5)
    w_storage = id(model2.tensors["emb.weight"]._arr)
    tr2 = th.torch.track(model2, opt2, path=tmp_path)
    assert_same(state(model2, opt2), saved)
    assert opt2.param_groups[0]["lr"] == 0.05
    assert id(model2.tensors["emb.weight"]._arr) == w_storage  # written in place
    # and it goes on: a kept step saves only what changed, undo goes back to the save
    with tr2.trial() as t:
        train_step(model2, opt2, np.random.default_rng(2))
        t.keep()
    assert tr2.save().versions_written == 1
    tr2.undo()
    assert_same(state(model2, opt2), saved)


def test_track_on_an_empty_path_commits_and_resume_true_needs_a_history(tmp_path):
    model, opt = make()
    before = state(model, opt)
    with pytest.raises(th.TrialError):
        th.torch.track(model, opt, store=th.Store(), resume=True)
    assert_same(state(model, opt), before)
    tr = th.torch.track(model, opt, path=tmp_path / "new")
    assert len(tr.store.versions()) == 1 and tr.store.location is not None
    tr.save()
    # resume=False commits the live model on top of the saved history instead
    model2, opt2 = make(seed=3)
    tr2 = th.torch.track(model2, opt2, path=tmp_path / "new", resume=False)
    assert len(tr2.store.versions()) == 2
    assert not np.array_equal(model2.tensors["emb.weight"]._arr, model.tensors["emb.weight"]._arr)


def test_resuming_into_a_model_of_another_structure_raises_and_changes_nothing(tmp_path):
    model, opt = make()
    th.torch.track(model, opt, path=tmp_path).save()
    rng = np.random.default_rng(0)
    other = ft.Model({"emb.weight": ft.Tensor(rng.standard_normal((64, 16)).astype(np.float32)),
                      "extra": ft.Tensor(np.ones(3, np.float32))})
    before = {k: t._arr.copy() for k, t in other.tensors.items()}
    with pytest.raises(th.TrialError):
        th.torch.track(other, path=tmp_path)
    for k, a in before.items():
        assert other.tensors[k]._arr.tobytes() == a.tobytes()


def test_optimizer_scalars_survive_json(tmp_path):
    model, opt = make()
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    opt.param_groups[0]["foreach"] = None
    opt.param_groups[0]["nested"] = {"a": [1, 2.5, "x"], "b": (True,)}
    tr = th.torch.track(model, opt, path=tmp_path)
    tr.save()
    model2, opt2 = make(seed=1)
    th.torch.track(model2, opt2, path=tmp_path)
    g = opt2.param_groups[0]
    assert g["betas"] == (0.9, 0.999) and g["foreach"] is None
    assert g["nested"] == {"a": [1, 2.5, "x"], "b": (True,)}


def test_keep_after_the_with_block_raises_and_commits_nothing():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
    versions = tr.store.versions()
    train_step(model, opt, np.random.default_rng(2))
    with pytest.raises(th.TrialError) as e:
        t.keep()
    assert e.value.reason == "trial ended" and tr.store.versions() == versions


def test_a_learning_rate_changed_between_trials_survives_the_next_revert():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial():
        train_step(model, opt, np.random.default_rng(1))  # rejected
    opt.param_groups[0]["lr"] /= 2  # the schedule reacts to the rejection
    assert tr.is_dirty()
    entry = state(model, opt)
    with tr.trial():
        train_step(model, opt, np.random.default_rng(2))  # rejected again
    assert opt.param_groups[0]["lr"] == 0.05
    assert_same(state(model, opt), entry)
    assert not tr.is_dirty()


def test_a_tensor_changed_between_trials_survives_the_next_revert():
    model, opt = make()
    tr = th.torch.track(model, opt)
    model.tensors["bias"].add_(3.0)
    entry = state(model, opt)
    with tr.trial():
        train_step(model, opt, np.random.default_rng(2))
    assert_same(state(model, opt), entry)


def test_a_buffer_added_inside_a_trial_is_named_after_the_rest_is_reverted():
    model, opt = make()
    tr = th.torch.track(model, opt)
    before = state(model, opt)
    with pytest.raises(th.TrialError) as e:
        with tr.trial():
            train_step(model, opt, np.random.default_rng(1))
            model.tensors["new_buf"] = ft.Tensor(np.ones(3, np.float32))
    assert e.value.reason == "model structure" and "model/new_buf" in str(e.value)
    now = state(model, opt)
    assert now.pop("new_buf").tolist() == [1, 1, 1]
    assert_same(now, before)  # parameters, optimizer state and lr put back
    # the new buffer is recorded by the next commit
    v = tr.commit("with the buffer")
    assert tr.store.get("model/new_buf", at=v).tolist() == [1, 1, 1]


def test_a_tensor_replaced_inside_a_trial_is_reverted_and_kept_by_value():
    model, opt = make()
    tr = th.torch.track(model, opt)
    old = model.tensors["bias"]
    # a new tensor with the same version counter value as the old one
    with tr.trial():
        model.tensors["bias"] = ft.Tensor(np.ones(16, np.float32))
        assert model.tensors["bias"]._version == old._version
    assert model.tensors["bias"]._arr.tolist() == [0.0] * 16  # the new tensor, reverted
    with tr.trial() as t:
        model.tensors["bias"] = ft.Tensor(np.full(16, 2, np.float32))
        v = t.keep()
    assert tr.store.get("model/bias", at=v).tolist() == [2.0] * 16


def test_optimizer_state_replaced_by_a_new_tensor_is_reverted():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        t.keep()
    before = state(model, opt)
    p = opt.param_groups[0]["params"][0]
    with tr.trial():
        old = opt.state[p]["momentum_buffer"]
        new = ft.Tensor(np.zeros_like(p._arr))
        new._counter[0] = old._version  # the same counter value, another storage
        opt.state[p]["momentum_buffer"] = new
    assert_same(state(model, opt), before)


def test_commits_keep_the_users_own_variables(tmp_path):
    s = th.Store()
    s.insert("notes/seed", np.array([7], np.int64))
    s.commit("mine")
    s.save_as(tmp_path / "r")
    model, opt = make()
    tr = th.torch.track(model, opt, path=tmp_path / "r")
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        t.keep()
    assert tr.store.get("notes/seed").tolist() == [7]
    assert "notes/seed" in tr.store.snapshot(tr.store.head())


def test_tracker_metadata_is_hidden_from_the_graph():
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        t.keep("step", loss=0.25)
    g = tr.store.graph()
    assert "loss=0.25" in g and "groups" not in g and "scalars" not in g


def test_a_tracker_without_a_store_gets_a_budget_of_four_model_sizes():
    model, opt = make()
    tracker = th.torch.track(model, opt)
    nbytes = sum(t._arr.nbytes for t in model.state_dict().values())
    assert tracker.store.memory_budget == max(th.torch.DEFAULT_BUDGET_STATES * nbytes, 64 << 20)
    given = th.Store()
    assert th.torch.track(model, opt, store=given).store.memory_budget is None


def test_a_second_run_saving_to_the_first_runs_path_keeps_the_first_run(tmp_path):
    model, opt = make()
    tr = th.torch.track(model, opt)
    with tr.trial() as t:
        train_step(model, opt, np.random.default_rng(1))
        t.keep("run 1")
    tr.save(tmp_path)
    first = state(model, opt)
    saved = th.Store.open(tmp_path)
    versions = sorted(saved.version_hash(v) for v in saved.versions())

    model2, opt2 = make(seed=7)
    tr2 = th.torch.track(model2, opt2)
    with tr2.trial() as t:
        train_step(model2, opt2, np.random.default_rng(2))
        t.keep("run 2")
    with pytest.raises(th.BranchMoved) as e:
        tr2.save(tmp_path)
    assert e.value.branch == "main"
    again = th.Store.open(tmp_path)
    assert sorted(again.version_hash(v) for v in again.versions()) == versions
    # the first run resumes from the path as it saved it
    model3, opt3 = make(seed=9)
    th.torch.track(model3, opt3, path=tmp_path)
    assert_same(state(model3, opt3), first)


def test_a_tracker_refuses_to_resume_from_an_open_that_fell_back_unless_given_the_store(tmp_path):
    from test_persist import repository_with_head_damaged

    h0, _ = repository_with_head_damaged(tmp_path / "r")
    model, opt = make()
    with pytest.raises(th.CorruptObject, match="cannot resume") as e:
        th.torch.track(model, opt, path=tmp_path / "r")
    assert "Store.open" in str(e.value) and e.value.path == str(tmp_path / "r")
    # Asked for knowingly: a store opened at the fallback is taken as it is.
    with pytest.warns(th.OpenFallbackWarning):
        store = th.Store.open(tmp_path / "r")
    assert store.version_hash(store.head()) == h0
    tr = th.torch.track(model, opt, store=store)
    assert tr.store.head() is not None and tr.store.current_branch() is None
