"""The torch tracker's staged device path, run on the CPU (``staged=True``): the same
code a CUDA device runs, with a CPU device whose copies complete later on a worker
thread. Skipped without torch, unless TH_REQUIRE_TORCH=1."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

if os.environ.get("TH_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.torch  # noqa: E402,F401
from tensor_history.torch import _device  # noqa: E402
from test_torch import (_deepcopy, _model_and_optimizer, _optimizer_cases,  # noqa: E402
                        accept_reject_against_deepcopies, assert_bitwise, snapshot)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def late_copies(monkeypatch):
    """Copies on the CPU device's side stream run 2 ms late: a read of the staging area
    that does not wait for its token reads stale bytes."""
    monkeypatch.setattr(_device, "CPU_LATENCY_S", 0.002)


def mlp(width=16):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.BatchNorm1d(2 * width),
                            torch.nn.ReLU(), torch.nn.Linear(2 * width, 4))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def train(m, opt, seed, lr=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, m[0].in_features, generator=g)
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()


# ---- the device interface ----------------------------------------------------------


def test_cpu_device_tokens_complete_later_and_the_staging_area_is_reused(monkeypatch):
    monkeypatch.setattr(_device, "CPU_LATENCY_S", 0.05)
    dev = _device.CpuDevice(torch.device("cpu"), 1024)
    src = torch.arange(64, dtype=torch.float32)
    area = dev.staging(256)
    token = dev.to_host([(_device.flat_bytes(src), 0)])
    assert not token.done()  # the worker has not run the copy yet
    token.wait()
    assert token.done()
    assert np.array_equal(area[:256].view(np.float32), src.numpy())
    # host->device from the same area, on the caller's thread (the compute stream)
    dst = torch.zeros(64)
    area[:256] = np.arange(64, 128, dtype=np.float32).view(np.uint8)
    dev.to_device([(_device.flat_bytes(dst), 0)]).wait()
    assert torch.equal(dst, torch.arange(64, 128, dtype=torch.float32))
    again = dev.staging(128)
    assert again is area and dev.allocations == 1
    assert (dev.to_host_bytes, dev.to_device_bytes) == (256, 256)


@pytest.mark.parametrize("capacity", [64, 100, 256, 4096])
def test_pack_covers_every_range_once_within_the_capacity(capacity):
    rng = np.random.default_rng(capacity)
    ranges = []
    for k in range(20):
        s = int(rng.integers(0, 500))
        ranges.append((k, s, s + int(rng.integers(0, 900))))
    got = {}
    for batch in _device.pack(ranges, capacity):
        assert batch
        ends = []
        for k, s, e, off in batch:
            assert off % _device.ALIGN == 0 and off + (e - s) <= capacity
            ends.append((off, off + e - s))
            got.setdefault(k, []).append((s, e))
        ends.sort()
        assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no overlap
    for k, s, e in ranges:
        pieces = sorted(got.get(k, []))
        covered = s
        for a, b in pieces:
            assert a == covered
            covered = b
        assert covered == e


def test_bad_settings_are_invalid_arguments():
    m, opt = mlp()
    for kw in ({"staging_bytes": 0}, {"staging_bytes": 1.5}, {"trial_base": "gpu"},
               {"device_budget": -1}):
        with pytest.raises(th.InvalidArgument):
            th.torch.track(m, opt, staged=True, **kw)


# ---- the tracker on the staged path ------------------------------------------------


def test_transfers_are_zero_on_the_plain_path_and_count_on_the_staged_one():
    m, opt = mlp()
    plain = th.torch.track(m, opt, staged=False)
    with plain.trial() as t:
        train(m, opt, 0)
        t.keep()
    assert plain.transfers() == {"staged": False, "to_host_bytes": 0, "to_device_bytes": 0}
    m, opt = mlp()
    state = sum(v.nbytes for v in m.state_dict().values())
    tr = th.torch.track(m, opt, staged=True)
    got = tr.transfers()
    assert got["staged"] is True and got["to_device_bytes"] == 0
    # track() staged every tensor once (the buffers' scalar counter included)
    assert got["to_host_bytes"] == state


@pytest.mark.parametrize("setup", [
    pytest.param({"staging_bytes": 64}, id="staging-64B-copy-now"),
    pytest.param({"staging_bytes": 4096, "copy_in_background": True,
                  "trial_base": "device"}, id="staging-4KiB-background-device-base"),
])
@pytest.mark.parametrize("name,variant", _optimizer_cases())
def test_every_optimizer_matches_a_deepcopy_run_through_the_staged_path(name, variant, setup):
    m, opt = _model_and_optimizer(name, variant)
    if setup.get("copy_in_background") and name == "SparseAdam":
        setup = {k: v for k, v in setup.items() if k != "copy_in_background"}
    tr = th.torch.track(m, opt, staged=True, **setup)
    accept_reject_against_deepcopies(m, opt, tr, sparse=name == "SparseAdam")
    # every version kept restores bit for bit
    tr.store.verify()
    assert tr.transfers()["to_host_bytes"] > 0


def _one_linear_store():
    """A 64x64 float32 weight over 256-byte chunks (64 chunks of one row each)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return m, opt, th.Store(chunk_bytes=256)


def test_reverts_write_only_the_chunks_that_differ():
    m, opt, store = _one_linear_store()
    tr = th.torch.track(m, opt, store=store, staged=True)
    v0 = store.head()
    w0 = m.weight.detach().clone()
    ptrs = [p.data_ptr() for p in m.parameters()]
    with torch.no_grad():
        m.weight[3, 5] += 1.0  # one chunk of 64
    v1 = tr.commit("one chunk")
    with torch.no_grad():
        m.weight[10, 0] += 1.0  # two more chunks apart from it
        m.weight[40, 63] += 1.0
    v3 = tr.commit("three chunks")
    before = tr.transfers()["to_device_bytes"]
    tr.restore(v0)
    assert torch.equal(m.weight, w0)
    assert tr.transfers()["to_device_bytes"] - before == 3 * 256
    tr.restore(v3)
    tr.restore(v1)
    w1 = m.weight.detach().clone()
    before = tr.transfers()
    tr.restore(v0)
    after = tr.transfers()
    assert torch.equal(m.weight, w0)
    assert after["to_device_bytes"] - before["to_device_bytes"] == 256
    assert after["to_host_bytes"] == before["to_host_bytes"]
    for call, want in ((lambda: tr.restore(v1), w1), (tr.undo, w0), (tr.redo, w1)):
        before = tr.transfers()["to_device_bytes"]
        call()
        assert torch.equal(m.weight, want)
        assert tr.transfers()["to_device_bytes"] - before == 256
    tr.branch("other", at=v0)
    before = tr.transfers()["to_device_bytes"]
    tr.checkout("other")
    assert torch.equal(m.weight, w0)
    assert tr.transfers()["to_device_bytes"] - before == 256
    # a rejected trial: the tensor the step changed is written back whole, the one it
    # left alone not at all
    before = tr.transfers()["to_device_bytes"]
    with tr.trial():
        with torch.no_grad():
            m.weight[0, 0] = 7.0
    assert torch.equal(m.weight, w0)
    assert tr.transfers()["to_device_bytes"] - before == m.weight.nbytes
    assert [p.data_ptr() for p in m.parameters()] == ptrs  # written in place


def test_a_device_base_rejects_on_the_device_and_commits_changed_chunks_only():
    m, opt, store = _one_linear_store()
    tr = th.torch.track(m, opt, store=store, staged=True, trial_base="device")
    w0 = m.weight.detach().clone()
    before = tr.transfers()
    with tr.trial():
        with torch.no_grad():
            m.weight[0, 0] = 7.0
    assert torch.equal(m.weight, w0)
    assert tr.transfers() == before  # put back from the device clone: nothing moved
    with tr.trial() as t:
        with torch.no_grad():
            m.weight[10, 1] = 3.0
            m.weight[20, 1] = 3.0
        v = t.keep()
    got = tr.transfers()
    # two changed chunks of the weight to the host, nothing else
    assert got["to_host_bytes"] - before["to_host_bytes"] == 2 * 256
    assert store.get("model/weight", at=v)[10, 1] == 3.0
    np.testing.assert_array_equal(store.get("model/weight", at=v), m.weight.detach().numpy())
    kept = m.weight.detach().clone()
    with tr.trial():
        with torch.no_grad():
            m.weight.mul_(2)
            m.bias.add_(1)
    assert torch.equal(m.weight, kept)
    assert tr.transfers()["to_device_bytes"] == got["to_device_bytes"]
    # The clones stay current from trial to trial: a reject that changed the bias only
    # copies the bias back, and the next trial's entry copies nothing.
    dev = tr._devices["cpu"]
    copied = dev.device_copy_bytes
    b = m.bias.detach().clone()
    with tr.trial():
        with torch.no_grad():
            m.bias.add_(1)
    assert torch.equal(m.bias, b)
    assert dev.device_copy_bytes - copied == m.bias.nbytes
    with tr.trial():
        pass
    assert dev.device_copy_bytes - copied == m.bias.nbytes
    tr.store.verify()


def test_a_device_base_matches_a_deepcopy_run_and_falls_back_once_over_its_budget():
    m, opt = mlp()
    ref_m, ref_opt = _deepcopy(m, opt)
    tr = th.torch.track(m, opt, staged=True, trial_base="device", device_budget=1 << 20)
    tiny_m, tiny_opt = mlp()
    tiny = th.torch.track(tiny_m, tiny_opt, staged=True, trial_base="device", device_budget=16)
    for i in range(5):
        accept = i % 2 == 0
        saved = _deepcopy(ref_m, ref_opt)
        train(ref_m, ref_opt, i)
        if not accept:
            ref_m, ref_opt = saved
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for mm, oo, tt in ((m, opt, tr), (tiny_m, tiny_opt, tiny)):
                with tt.trial() as t:
                    train(mm, oo, i)
                    if accept:
                        t.keep()
        over = [w for w in caught if "device_budget" in str(w.message)]
        assert len(over) == (1 if i == 0 else 0)  # the fallback warns once
        assert_bitwise(snapshot(m, opt), snapshot(ref_m, ref_opt))
        assert_bitwise(snapshot(tiny_m, tiny_opt), snapshot(ref_m, ref_opt))
    # rejected trials wrote nothing host->device with the device base, and did without
    assert tr.transfers()["to_device_bytes"] == 0
    assert tiny.transfers()["to_device_bytes"] > 0


def test_a_tensor_moved_to_another_device_raises_and_changes_nothing():
    m, opt = mlp()
    tr = th.torch.track(m, opt, staged=True)
    with tr.trial() as t:
        train(m, opt, 0)
        t.keep()
    log = len(tr.log())
    want = snapshot(m, opt)
    w = m[0].weight
    # the weight on another device ("meta": this machine has one device)
    m[0].weight = torch.nn.Parameter(torch.empty_like(w, device="meta"))
    for call in (tr.commit, tr.trial().__enter__, lambda: tr.restore(tr.store.head())):
        with pytest.raises(th.TrialError) as e:
            call()
        assert e.value.reason == "device" and "model/0.weight" in str(e.value)
        assert "meta" in str(e.value)
    assert len(tr.log()) == log and not tr.store.is_dirty()
    m[0].weight = w  # back where it was: the tracker goes on
    assert_bitwise(snapshot(m, opt), want)
    with tr.trial() as t:
        train(m, opt, 1)
        t.keep()
    assert len(tr.log()) == log + 1
    tr.store.verify()


def test_a_sparse_tensor_still_raises_layout_on_the_staged_path():
    m = torch.nn.Linear(2, 2)
    m.register_buffer("mask", torch.eye(2).to_sparse())
    with pytest.raises(th.TrialError) as e:
        th.torch.track(m, staged=True)
    assert e.value.reason == "layout"


@pytest.mark.parametrize("staging", [64, 1 << 20])
def test_staging_smaller_than_one_tensor_goes_in_pieces(staging):
    m, opt = mlp(32)
    tr = th.torch.track(m, opt, staged=True, staging_bytes=staging)
    assert m[0].weight.nbytes > 64
    kept = {}
    for i in range(3):
        with tr.trial() as t:
            train(m, opt, i)
            kept[t.keep()] = snapshot(m, opt)
    for v, want in kept.items():
        tr.restore(v)
        assert_bitwise(snapshot(m, opt), want)
    dev = tr._devices["cpu"]
    # allocated once at the largest batch, never past staging_bytes
    assert dev._area.numel() <= staging and dev.allocations <= 2
    tr.store.verify()


def test_a_commit_while_the_previous_background_copy_runs(monkeypatch):
    monkeypatch.setattr(_device, "CPU_LATENCY_S", 0.02)
    torch.manual_seed(0)
    # no BatchNorm: leaving a trial right after keep() then has nothing to put back
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    tr = th.torch.track(m, opt, staged=True, copy_in_background=True, staging_bytes=512)
    with tr.trial() as t:
        train(m, opt, 0)
        v1 = t.keep()
        want1 = snapshot(m, opt)
    assert tr.store.commit_pending() is True  # the store still copies the last batch
    with torch.no_grad():
        m[0].weight.mul_(0.5)  # fine on the staged path: v1's bytes were staged
    v2 = tr.commit("right after")
    want2 = snapshot(m, opt)
    v3 = tr.commit("again, nothing changed")
    for v, want in ((v1, want1), (v2, want2), (v3, want2)):
        tr.restore(v)
        assert_bitwise(snapshot(m, opt), want)
    tr.store.verify()


def test_an_exception_inside_a_trial_reverts_it_and_propagates():
    for base in ("host", "device"):
        m, opt = mlp()
        tr = th.torch.track(m, opt, staged=True, trial_base=base)
        want = snapshot(m, opt)
        head = tr.store.head()
        with pytest.raises(ZeroDivisionError):
            with tr.trial():
                train(m, opt, 0, lr=0.5)
                1 / 0
        assert_bitwise(snapshot(m, opt), want)
        assert tr.store.head() == head
        with tr.trial() as t:
            train(m, opt, 1)
            t.keep()
        tr.store.verify()


def test_track_staged_from_the_environment(monkeypatch):
    m, opt = mlp()
    monkeypatch.setenv("TH_TORCH_STAGED", "1")
    assert th.torch.track(m, opt).transfers()["staged"] is True
    assert th.torch.track(m, opt, staged=False).transfers()["staged"] is False
    monkeypatch.setenv("TH_TORCH_STAGED", "0")
    assert th.torch.track(m, opt).transfers()["staged"] is False


@pytest.mark.parametrize("setup", [
    pytest.param({"staging_bytes": 64}, id="staging-64B"),
    pytest.param({"staging_bytes": 1024, "trial_base": "device", "copy_in_background": True},
                 id="device-base-background"),
    pytest.param({"trust_versions": False, "trial_base": "device"}, id="untrusted-device-base"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_actions_match_deep_copies_of_every_version(setup, seed):
    """Random keeps, rejects, in-place pokes, restores, undos and redos on the staged
    path, against a deep copy of the state taken at every version."""
    import random

    rnd = random.Random(seed)
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    tr = th.torch.track(m, opt, store=th.Store(chunk_bytes=64), staged=True, **setup)
    copies = {tr.store.head(): snapshot(m, opt)}
    for i in range(40):
        action = rnd.choice(["keep", "keep", "reject", "poke", "restore", "undo", "redo"])
        if action in ("keep", "reject"):
            before = snapshot(m, opt)
            with tr.trial() as t:
                train_small(m, opt, i)
                if action == "keep":
                    v = t.keep()
                    copies[v] = snapshot(m, opt)
            if action == "reject":
                assert_bitwise(snapshot(m, opt), before)
        elif action == "poke":
            # A write outside the optimizer while a background copy may still read the
            # tensors would give that version up (copy_in_background): settle it first.
            tr.store.settle()
            with torch.no_grad():
                for _ in range(rnd.randrange(1, 4)):  # one to three chunks apart
                    p = rnd.choice(list(m.parameters()))
                    flat = p.view(-1)
                    flat[rnd.randrange(flat.numel())] += 1.0
            copies[tr.commit(f"poke {i}")] = snapshot(m, opt)
        elif action == "restore":
            v = rnd.choice(list(copies))
            tr.restore(v)
            assert_bitwise(snapshot(m, opt), copies[v])
        elif action == "undo":
            head = tr.store.head()
            parent = tr.store.parent(head)
            if parent is None or parent not in copies:
                continue
            tr.undo()
            assert_bitwise(snapshot(m, opt), copies[parent])
        else:
            try:
                v = tr.redo()
            except th.NothingToRedo:
                continue
            assert_bitwise(snapshot(m, opt), copies[v])
    tr.store.verify()


def train_small(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    m(torch.randn(4, 16, generator=g)).pow(2).mean().backward()
    opt.step()


def test_a_background_copy_still_reading_the_staging_area_is_not_overwritten(monkeypatch):
    """keep() leaves its last batch in the staging area for the store's thread (its
    device->host copy possibly still running); the next step and commit must not write
    the tensors or stage into that area before the store has copied it (16 MiB: the
    store's copy takes longer than staging the next commit's bytes)."""
    monkeypatch.setattr(_device, "CPU_LATENCY_S", 0.0)
    torch.manual_seed(0)
    m = torch.nn.Linear(2048, 2048, bias=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tr = th.torch.track(m, opt, staged=True, copy_in_background=True, staging_bytes=32 << 20,
                        memory_budget=None)
    kept = {}

    def step(g: float) -> None:
        # The optimizer writes the weight: its step waits for the copy in flight.
        m.weight.grad = torch.full_like(m.weight, g)
        opt.step()

    for i in range(3):
        with tr.trial() as t:
            step(-10.0)
            v = t.keep()
        kept[v] = m.weight.detach().clone()
        step(3.0 + i)
        kept[tr.commit()] = m.weight.detach().clone()
    for v, want in kept.items():
        tr.restore(v)
        assert torch.equal(m.weight, want), v


def test_keep_in_the_background_returns_before_its_device_to_host_copy_ran(monkeypatch):
    """copy_in_background: keep() queues the last batch's device->host copy and returns;
    the store's copy thread waits for it (not keep(), not a full synchronize), and the
    optimizer's next step waits for the store's copy. The worker that plays the side
    stream is held shut while keep() runs: a keep() that waited for its copy would only
    return when the safety timer opens it."""
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64, bias=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tr = th.torch.track(m, opt, staged=True, copy_in_background=True)
    gate = threading.Event()
    gate.set()
    real_submit = _device._WORKER.submit

    def gated(job):
        def held():
            gate.wait()
            job()
        return real_submit(held)

    monkeypatch.setattr(_device._WORKER, "submit", gated)
    safety = threading.Timer(30.0, gate.set)
    safety.start()
    try:
        with tr.trial() as t:
            m.weight.grad = torch.ones_like(m.weight)
            opt.step()
            want = m.weight.detach().clone()
            gate.clear()  # the side stream stalls from here
            v = t.keep()
            assert not gate.is_set(), "keep() waited for its device->host copy"
            assert tr.store.commit_pending()
            gate.set()
        m.weight.grad = torch.full_like(m.weight, 2.0)
        opt.step()  # waits for the copy, then writes
        assert not tr.store.commit_pending() and tr.store.head() == v
        assert tr.transfers()["to_host_bytes"] >= m.weight.numel() * 4
        tr.restore(v)
        assert torch.equal(m.weight, want)
    finally:
        gate.set()
        safety.cancel()
