"""The torch tracker on real CUDA tensors: the scenarios of test_torch_staged.py with the
model (and the device trial base) on the GPU, plus two CUDA streams and a model over two
GPUs. Skipped, with the reason, where torch or CUDA is absent; TH_REQUIRE_CUDA=1 makes a
missing GPU a failure."""

from __future__ import annotations

import os
import warnings

import pytest

# cuBLAS gives bit-identical results run to run only with a fixed workspace (set before
# CUDA starts): the deep-copy reference and the tracked run must compute the same bits.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

if os.environ.get("TH_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    if os.environ.get("TH_REQUIRE_CUDA") == "1":
        raise RuntimeError("TH_REQUIRE_CUDA=1 but torch.cuda.is_available() is False")
    pytest.skip("no CUDA device (torch.cuda.is_available() is False): the staged path "
                "is tested on the CPU by test_torch_staged.py", allow_module_level=True)

import tensor_history as th  # noqa: E402
import tensor_history.torch  # noqa: E402,F401
from test_torch import _deepcopy, _optimizer_cases, assert_bitwise  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)
CUDA = torch.device("cuda", torch.cuda.current_device())


def snapshot(model, opt) -> dict:
    """As test_torch.snapshot, on the host (CUDA tensors copied to the CPU)."""
    out = {f"m/{k}": v.detach().cpu().clone() for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            out[f"o/{i}/{k}"] = v.detach().cpu().clone() if torch.is_tensor(v) else v
    out["groups"] = [{k: (v.item() if torch.is_tensor(v) else v) for k, v in g.items()
                      if k != "params"} for g in sd["param_groups"]]
    return out


def model_and_optimizer(name, variant, device=CUDA):
    torch.manual_seed(0)
    if name == "SparseAdam":
        m = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten())
    else:
        m = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3, bias=False))
    m = m.to(device)
    kw = {variant: True} if variant != "plain" else {}
    if name == "SGD":
        kw["momentum"] = 0.9
    try:
        opt = getattr(torch.optim, name)(m.parameters(), lr=0.01, **kw)
    except (RuntimeError, ValueError) as e:  # a variant this torch lacks on CUDA
        pytest.skip(f"{name}({variant}=True) on CUDA: {e}")
    return m, opt


def train(m, opt, seed, sparse=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (6, 2), generator=g) if sparse else torch.randn(6, 4, generator=g)
    x = x.to(CUDA)

    def closure():
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    opt.step(closure)


def mlp(device=CUDA):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to(device)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, generator=g).to(CUDA)
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("setup", [
    pytest.param({"staging_bytes": 64}, id="staging-64B-copy-now"),
    pytest.param({"copy_in_background": True, "trial_base": "device"},
                 id="background-device-base"),
])
@pytest.mark.parametrize("name,variant", _optimizer_cases())
def test_every_optimizer_on_cuda_matches_a_deepcopy_run(name, variant, setup):
    m, opt = model_and_optimizer(name, variant)
    ref_m, ref_opt = _deepcopy(m, opt)
    tr = th.torch.track(m, opt, **setup)
    sparse = name == "SparseAdam"
    for i in range(6):
        accept = i % 3 != 1
        saved = _deepcopy(ref_m, ref_opt)
        train(ref_m, ref_opt, i, sparse)
        if not accept:
            ref_m, ref_opt = saved
        with tr.trial() as t:
            train(m, opt, i, sparse)
            if accept:
                t.keep()
        assert_bitwise(snapshot(m, opt), snapshot(ref_m, ref_opt))
    assert tr.transfers()["staged"] is True
    tr.store.verify()


def test_parameters_stay_the_same_objects_and_memory():
    m, opt = mlp()
    ptrs = [p.data_ptr() for p in m.parameters()]
    ids = [id(p) for p in m.parameters()]
    tr = th.torch.track(m, opt)
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, i)
            if i != 1:
                t.keep()
    tr.undo()
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert [id(p) for p in m.parameters()] == ids


def test_adam_step_counters_on_the_cpu_and_moments_on_the_gpu():
    m, opt = mlp()
    step(m, opt, 0)  # Adam's `step` is a CPU tensor unless capturable or fused
    devices = {v.device.type for st in opt.state.values() for v in st.values()}
    assert devices == {"cpu", "cuda"}
    ref = snapshot(m, opt)
    tr = th.torch.track(m, opt)
    with tr.trial():
        step(m, opt, 1)
    assert_bitwise(snapshot(m, opt), ref)


def test_reverts_write_only_the_chunks_that_differ_on_cuda():
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64).to(CUDA)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tr = th.torch.track(m, opt, store=th.Store(chunk_bytes=256))
    v0 = tr.store.head()
    w0 = m.weight.detach().clone()
    with torch.no_grad():
        m.weight[3, 5] += 1.0
    v1 = tr.commit()
    before = tr.transfers()["to_device_bytes"]
    tr.restore(v0)
    assert torch.equal(m.weight, w0)
    assert tr.transfers()["to_device_bytes"] - before == 256
    before = tr.transfers()["to_device_bytes"]
    tr.restore(v1)
    assert tr.transfers()["to_device_bytes"] - before == 256


def test_a_device_base_on_cuda_rejects_without_transfers_and_falls_back_once():
    m, opt = mlp()
    ref_m, ref_opt = _deepcopy(m, opt)
    tr = th.torch.track(m, opt, trial_base="device", device_budget=1 << 30)
    for i in range(4):
        accept = i % 2 == 0
        saved = _deepcopy(ref_m, ref_opt)
        step(ref_m, ref_opt, i)
        if not accept:
            ref_m, ref_opt = saved
        with tr.trial() as t:
            step(m, opt, i)
            if accept:
                t.keep()
        assert_bitwise(snapshot(m, opt), snapshot(ref_m, ref_opt))
    assert tr.transfers()["to_device_bytes"] == 0
    m2, opt2 = mlp()
    tiny = th.torch.track(m2, opt2, trial_base="device", device_budget=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            with tiny.trial():
                step(m2, opt2, i)
    assert sum("device_budget" in str(w.message) for w in caught) == 1


def test_a_tensor_moved_off_the_gpu_raises_and_changes_nothing():
    m, opt = mlp()
    tr = th.torch.track(m, opt)
    log = len(tr.log())
    w = m[0].weight
    m[0].weight = torch.nn.Parameter(w.detach().cpu())
    with pytest.raises(th.TrialError) as e:
        tr.commit()
    assert e.value.reason == "device" and len(tr.log()) == log
    m[0].weight = w
    tr.commit()
    assert len(tr.log()) == log + 1


def test_staging_smaller_than_one_tensor_and_a_commit_during_a_background_copy():
    m, opt = mlp()
    tr = th.torch.track(m, opt, staging_bytes=64, copy_in_background=True)
    kept = {}
    for i in range(3):
        with tr.trial() as t:
            step(m, opt, i)
            v = t.keep()
        kept[v] = snapshot(m, opt)
        with torch.no_grad():
            # Written while the store may copy: a tensor larger than the staging
            # area went in pieces that keep() waited for (only a last batch of whole
            # tensors is left in flight).
            m[0].weight.mul_(1.0)
        kept[tr.commit()] = snapshot(m, opt)
    for v, want in kept.items():
        tr.restore(v)
        assert_bitwise(snapshot(m, opt), want)


def test_an_exception_inside_a_trial_on_cuda():
    for base in ("host", "device"):
        m, opt = mlp()
        tr = th.torch.track(m, opt, trial_base=base)
        want = snapshot(m, opt)
        with pytest.raises(ZeroDivisionError):
            with tr.trial():
                step(m, opt, 0)
                1 / 0
        assert_bitwise(snapshot(m, opt), want)


def test_work_on_a_side_stream_is_seen_by_keep_on_that_stream():
    m, opt = mlp()
    tr = th.torch.track(m, opt)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with tr.trial() as t:
            # A long queue of kernels on `side` ends by writing the weight; keep() on the
            # same stream must copy what it ends with, not what it held before.
            big = torch.randn(2048, 2048, device=CUDA)
            for _ in range(20):
                big = big @ big / 2048
            with torch.no_grad():
                m[0].weight.copy_(big[:32, :16])
            v = t.keep()
    torch.cuda.current_stream().wait_stream(side)
    want = m[0].weight.detach().cpu()
    assert torch.equal(torch.from_numpy(tr.store.get("model/0.weight", at=v)), want)


def test_a_model_over_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: a model over two GPUs needs two")
    torch.manual_seed(0)
    a = torch.nn.Linear(16, 32).to("cuda:0")
    b = torch.nn.Linear(32, 4).to("cuda:1")
    m = torch.nn.ModuleDict({"a": a, "b": b})
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)

    def go(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(8, 16, generator=g).to("cuda:0")
        opt.zero_grad()
        b(a(x).relu().to("cuda:1")).pow(2).mean().backward()
        opt.step()

    tr = th.torch.track(m, opt, staging_bytes=256)
    go(0)
    tr.commit()
    want = snapshot(m, opt)
    with tr.trial():
        go(1)
    assert_bitwise(snapshot(m, opt), want)
    assert set(tr._devices) >= {"cuda:0", "cuda:1"}
