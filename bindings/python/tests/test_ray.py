"""tensor_history.ray: Ray Tune trials as branches of one shared repository.

Real Ray Tune runs (``ray.init(num_cpus=2)``, one per module) of a small torch trainable
(tests/ray_trainable.py): PBT with 4 trials and exploits (restored tensors equal the
exploited trial's version bit for bit, the exploit writes no chunk), two trials saving at
once, a trial restored after its actor died, retention with ``num_to_keep`` and
``tensor_history.ray.gc``, and the S3 variant against the test server. In-process tests
check an exploit's bytes on disk and the errors.

Skipped without ray or torch, unless ``TH_REQUIRE_RAY=1`` (then a failure). The S3 test
runs when TH_S3_BUCKET and the AWS_* variables are set (see ``.ci/s3-server.sh``), and
fails instead of skipping with ``TH_REQUIRE_S3=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
import warnings
from typing import Any, Dict, List

import numpy as np
import pytest

_REQUIRED = os.environ.get("TH_REQUIRE_RAY") == "1"
try:
    import ray
    from ray import tune
    import torch
except ImportError as e:  # pragma: no cover - depends on the tier
    if _REQUIRED:
        raise
    pytest.skip(f"ray[tune] or torch is not installed ({e})", allow_module_level=True)

import tensor_history as th
import tensor_history.ray as thr
from tensor_history._errors import InvalidArgument, OtherHistory

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ray_trainable import digest, snapshot_digest, tracked_arrays, trainable  # noqa: E402


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


@pytest.fixture(scope="module")
def ray_session():
    # Ray's workers import the trainable by name and tensor_history from this checkout.
    paths = [HERE, os.path.dirname(os.path.dirname(th.__file__))]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def run_tune(tmp_path, config: Dict[str, Any], *, num_samples: int = 1, scheduler=None,
             num_to_keep=None, max_failures: int = 0, name: str = "exp",
             reuse_actors: bool = False):
    from ray.tune import CheckpointConfig, FailureConfig, RunConfig

    logdir = tmp_path / f"log-{name}"
    logdir.mkdir()
    config = {**config, "logdir": str(logdir)}
    tuner = tune.Tuner(
        trainable,
        param_space=config,
        tune_config=tune.TuneConfig(num_samples=num_samples, scheduler=scheduler,
                                    metric="loss", mode="min",
                                    reuse_actors=reuse_actors),
        run_config=RunConfig(
            name=name, storage_path=str(tmp_path / "ray"), verbose=0,
            checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep),
            failure_config=FailureConfig(max_failures=max_failures)),
    )
    grid = tuner.fit()
    errors = [r.error for r in grid if r.error is not None]
    assert not errors, errors
    return rows_of(logdir)


def rows_of(logdir) -> Dict[str, List[Dict[str, Any]]]:
    """Every reported row of every trial, by trial id, in order (the trainable's own log:
    Ray's result files start again when a failed trial is restored)."""
    out = {}
    for f in sorted(os.listdir(logdir)):
        with open(os.path.join(logdir, f), encoding="utf-8") as fh:
            out[f[:-len(".jsonl")]] = [json.loads(line) for line in fh]
    return out


def check_branches(loc: str, rows: Dict[str, List[Dict[str, Any]]]) -> th.Store:
    """Every trial's branch is at its last reported version; every version reads."""
    store = th.Store.open(loc)
    store.verify()
    for tid, rs in rows.items():
        tip = store.resolve(f"trials/{tid}")
        assert store.version_hash(tip) == rs[-1]["version"], tid
        assert snapshot_digest(store, tip) == rs[-1]["state"], tid
    return store


# ---- PBT -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pbt_run(ray_session, tmp_path_factory):
    """4 trials, PBT over learning rates (an exploit every 2 iterations), num_to_keep=3.

    With synchronous PBT a trial reports at most `perturbation_interval` checkpoints
    between the one an exploit hands on and the exploit's restore: num_to_keep must
    exceed that, whatever a checkpoint holds, or Ray finds the directory gone and fails
    the trial (it warns about num_to_keep <= 2)."""
    from ray.tune.schedulers import PopulationBasedTraining

    tmp = tmp_path_factory.mktemp("pbt")
    loc = str(tmp / "repo")
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2,
        hyperparam_mutations={"lr": [1e-3, 1e-2, 3e-2]}, quantile_fraction=0.25,
        synch=True, resample_probability=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PBT asks for reuse_actors, reset_config
        rows = run_tune(tmp, {"lr": tune.grid_search([1e-3, 1e-2, 3e-2, 1e-2]),
                              "steps": 6, "location": loc},
                        scheduler=pbt, num_to_keep=3, name="pbt", reuse_actors=True)
    return loc, str(tmp / "ray"), rows


def test_pbt_exploits_restore_the_exploited_version_and_write_no_chunk(pbt_run):
    loc, _, rows = pbt_run
    assert len(rows) == 4
    store = check_branches(loc, rows)
    # Who saved each version first (a trial reports the version it restored at the end).
    saved_by: Dict[str, str] = {}
    for tid, rs in rows.items():
        for r in rs:
            if r["version"] != r["restored"]:
                saved_by[r["version"]] = tid
    exploits = [(tid, r) for tid, rs in rows.items() for r in rs
                if r["restored"] and saved_by[r["restored"]] != tid]
    assert exploits, "PBT made no exploit"
    for tid, r in exploits:
        v = store.resolve(r["restored"])
        # The version of the exploited trial, bit for bit in the exploiting trial's model
        # and optimizer, and as that trial reported it when it saved it.
        assert r["restored_from"] == saved_by[r["restored"]]
        assert r["restored_state"] == snapshot_digest(store, v)
        donor = [x for x in rows[saved_by[r["restored"]]] if x["version"] == r["restored"]]
        assert donor and donor[0]["state"] == r["restored_state"]
        # The exploit wrote no chunk, only the branch's ref entry.
        assert r["restore_chunks_written"] == 0
        assert 0 < r["restore_bytes_written"] < 1024
        # The exploiting trial's next version descends from the exploited one (unless
        # the exploit came at the end, where the branch stays at the exploited version).
        if r["version"] != r["restored"]:
            assert store.parent(store.resolve(r["version"])) == v


def test_pbt_with_num_to_keep_and_gc_keeps_the_repository_bounded(pbt_run):
    loc, storage, rows = pbt_run
    live = thr.live_pointers(storage, loc)
    hashes = {p.version for p in live}
    # num_to_keep=3 per trial, and the latest one, which Ray never deletes (after an
    # exploit, the exploited trial's)
    assert 4 <= len(hashes) <= 16
    before = th.Store.open(loc)
    n_before = len(before.versions())
    before.close()
    bytes_before = du(loc)
    first = thr.gc(loc, storage, grace=0)
    assert first.protected == len(hashes) and not first.missing
    second = thr.gc(loc, storage, grace=0)  # deletes what the first recorded, if any
    assert first.pruned > 0 and first.gc.objects_deleted + second.gc.objects_deleted > 0
    store = check_branches(loc, rows)
    tips = {store.resolve(f"trials/{t}") for t in rows}
    assert len(store.versions()) <= len(hashes) + len(tips) < n_before
    states = {r["version"]: r["state"] for rs in rows.values() for r in rs}
    for h in hashes:  # every live checkpoint still restores, bit for bit
        assert snapshot_digest(store, h) == states[h]
    assert du(loc) < bytes_before
    # Ray deletes a directory (num_to_keep): the next gc lets go of its version.
    gone = next(h for h in hashes if store.resolve(h) not in tips)
    store.close()
    for d, _, fs in os.walk(storage):
        if thr.POINTER in fs and thr.read_pointer(d).version == gone:
            os.remove(os.path.join(d, thr.POINTER))
    thr.gc(loc, storage, grace=0)
    thr.gc(loc, storage, grace=0)
    after = th.Store.open(loc)
    after.verify()
    with pytest.raises(KeyError):
        after.resolve(gone)
    assert thr.KEEP_TAG_PREFIX + gone not in [n for n, _, _ in after.refs()]


# ---- several trials, failures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def two_run(ray_session, tmp_path_factory):
    """Two trials at once; the first to reach step 3 dies there (once) and is restarted."""
    tmp = tmp_path_factory.mktemp("two")
    loc = str(tmp / "repo")
    marker = str(tmp / "died")
    rows = run_tune(tmp, {"lr": tune.grid_search([1e-2, 3e-2]), "steps": 6,
                          "location": loc, "die_at": 3, "marker": marker},
                    max_failures=1, name="two")
    assert os.path.exists(marker)
    return loc, rows


def test_two_trials_save_into_one_repository_at_once(two_run):
    loc, rows = two_run
    assert len(rows) == 2
    store = check_branches(loc, rows)
    for tid, rs in rows.items():
        # Every checkpoint is a version of the trial's branch, in order, nothing lost.
        line = store.log(f"trials/{tid}")[::-1]
        assert [store.version_hash(e.id) for e in line[1:]] == [r["version"] for r in rs]
        assert [e.metadata["step"] for e in line[1:]] == list(range(1, 7))
        for r in rs:
            assert snapshot_digest(store, r["version"]) == r["state"]


def test_a_trial_whose_actor_died_restores_its_last_checkpoint(two_run):
    loc, rows = two_run
    died = [(tid, rs) for tid, rs in rows.items() if any(r["restored"] for r in rs)]
    assert len(died) == 1
    (tid, rs), = died
    back = [r for r in rs if r["restored"]]
    assert len(back) == 1
    last_before = [r for r in rs if r["step"] == 3][0]
    assert back[0]["step"] == 4
    assert back[0]["restored"] == last_before["version"]
    assert back[0]["restored_from"] == tid
    assert back[0]["restored_state"] == last_before["state"]
    assert back[0]["restore_chunks_written"] == 0


# ---- in one process: the exploit's bytes on disk, errors ----------------------------------


def _model(seed: int):
    torch.manual_seed(seed)
    m = torch.nn.Linear(256, 256)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return m, o


def _step(m, o, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    o.zero_grad()
    m(torch.randn(8, 256, generator=g)).pow(2).mean().backward()
    o.step()


def test_an_exploit_writes_no_tensor_byte_to_the_repository(tmp_path):
    loc = str(tmp_path / "repo")
    ma, oa = _model(0)
    ta = th.torch.track(ma, oa)
    mb, ob = _model(1)
    tb = th.torch.track(mb, ob)
    for i in range(3):
        _step(ma, oa, i)
        ca = thr.checkpoint(ta, loc, branch="trials/a")
        _step(mb, ob, 10 + i)
        thr.checkpoint(tb, loc, branch="trials/b")
    want = tracked_arrays(ma, oa)
    before = du(loc)
    v = thr.restore(tb, ca, branch="trials/b")
    got = tracked_arrays(mb, ob)
    assert digest(got.items()) == digest(want.items())
    stats = tb.store.save()
    assert stats.chunks_written == 0 and stats.versions_written == 0
    grew = du(loc) - before
    assert 0 < grew < 1024, grew  # one ref entry
    assert tb.store.current_branch() == "trials/b" and tb.store.head() == v
    # A fresh process (a restarted actor) restores the same way, and keeps training from it.
    mc, oc = _model(5)
    tc = th.torch.track(mc, oc)
    before = du(loc)
    assert thr.restore(tc, ca, branch="trials/c") is not None
    assert digest(tracked_arrays(mc, oc).items()) == digest(want.items())
    assert du(loc) == before  # nothing saved by a restore
    _step(mc, oc, 99)
    _step(ma, oa, 99)
    assert digest(tracked_arrays(mc, oc).items()) == digest(tracked_arrays(ma, oa).items())
    cc = thr.checkpoint(tc, branch="trials/c")
    s = th.Store.open(loc)
    assert s.parent(s.resolve(thr.read_pointer(cc).version)) == s.resolve(
        thr.read_pointer(ca).version)
    # trials/a and trials/b are where their owners left them
    assert s.version_hash("trials/a") == thr.read_pointer(ca).version
    assert s.version_hash("trials/b") == thr.read_pointer(ca).version


def test_gc_keeps_the_line_an_exploit_left_while_ray_keeps_its_directories(tmp_path):
    loc = str(tmp_path / "repo")
    storage = tmp_path / "ray"
    states: Dict[str, str] = {}

    def report(tracker, m, o, name: str) -> str:
        # What Ray does with a reported checkpoint: copy its directory into storage.
        ck = thr.checkpoint(tracker, loc, branch="trials/" + name.split("/")[0])
        shutil.copytree(ck.path, storage / name)
        h = thr.read_pointer(ck).version
        states[h] = digest(tracked_arrays(m, o).items())
        return h

    ma, oa = _model(0)
    ta = th.torch.track(ma, oa)
    mb, ob = _model(1)
    tb = th.torch.track(mb, ob)
    hashes = {}
    for i, name in enumerate(["a/1", "b/1", "b/2", "a/2"]):
        m, o, t = (ma, oa, ta) if name[0] == "a" else (mb, ob, tb)
        _step(m, o, i)
        hashes[name] = report(t, m, o, name)
    thr.restore(tb, str(storage / "a/2"), branch="trials/b")  # B exploits A
    _step(mb, ob, 7)
    hashes["b/3"] = report(tb, mb, ob, "b/3")
    shutil.rmtree(storage / "b/1")  # num_to_keep=2: Ray let b/1 go, b/2 stays
    for _ in range(2):
        res = thr.gc(loc, str(storage), grace=0)
        assert not res.missing and res.protected == 4
    s = th.Store.open(loc)
    s.verify()
    for name in ("a/1", "a/2", "b/2", "b/3"):  # live: each reads, bit for bit
        assert snapshot_digest(s, hashes[name]) == states[hashes[name]], name
    with pytest.raises(KeyError):
        s.resolve(hashes["b/1"])
    # The line B left is restorable (Ray restores B's b/2 after a failure, say).
    mc, oc = _model(9)
    tc = th.torch.track(mc, oc)
    thr.restore(tc, str(storage / "b/2"), branch="trials/c")
    assert digest(tracked_arrays(mc, oc).items()) == states[hashes["b/2"]]
    # Ray let b/2 go as well: the next gc collects it and B's old line is gone.
    shutil.rmtree(storage / "b/2")
    for _ in range(2):
        thr.gc(loc, str(storage), grace=0)
    s = th.Store.open(loc)
    with pytest.raises(KeyError):
        s.resolve(hashes["b/2"])
    assert not [n for n, _, _ in s.refs() if n.startswith(thr.RESET_TAG_PREFIX)]


def test_a_store_checkpoints_and_restores_like_a_tracker(tmp_path):
    loc = str(tmp_path / "repo")
    s = th.Store()
    s.insert("w", np.arange(1000, dtype=np.float32))
    c0 = thr.checkpoint(s, loc, branch="trials/s", note="first")
    s.write("w", np.zeros(1000, dtype=np.float32))
    thr.checkpoint(s, branch="trials/s")
    assert [n for n, k, _ in s.refs() if k == "branch"] == ["trials/s"]
    with pytest.raises(InvalidArgument):  # an in-memory store cannot be rebound
        thr.restore(th.Store(), c0, branch="trials/s")
    r = th.Store.open(loc)
    v = thr.restore(r, c0, branch="trials/s")
    assert r.current_branch() == "trials/s" and r.head() == v
    np.testing.assert_array_equal(r["w"], np.arange(1000, dtype=np.float32))
    assert r.metadata(v)["note"] == "first"


def test_bad_input_raises_and_changes_nothing(tmp_path):
    loc = str(tmp_path / "repo")
    m, o = _model(0)
    t = th.torch.track(m, o)
    with pytest.raises(InvalidArgument):  # no repository named
        thr.checkpoint(t, branch="trials/x")
    assert t.store.location is None
    c = thr.checkpoint(t, loc, branch="trials/x")
    with pytest.raises(InvalidArgument):  # another repository than the store's
        thr.checkpoint(t, str(tmp_path / "other"), branch="trials/x")
    head = t.store.head()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgument):  # a directory without a pointer
        thr.restore(t, str(empty), branch="trials/x")
    (empty / thr.POINTER).write_text("{not json")
    with pytest.raises(InvalidArgument):
        thr.restore(t, str(empty), branch="trials/x")
    assert t.store.head() == head
    with pytest.raises(TypeError):
        thr.checkpoint(object(), loc, branch="trials/x")
    # Outside a trial, without branch=: a clear error.
    with pytest.raises(InvalidArgument):
        thr.checkpoint(t)
    # A second in-memory run checkpointing onto an existing trial's branch is refused,
    # nothing of the repository overwritten.
    m2, o2 = _model(1)
    t2 = th.torch.track(m2, o2)
    with pytest.raises(OtherHistory):
        thr.checkpoint(t2, loc, branch="trials/x")
    assert "main" in [n for n, _, _ in t2.store.refs()] and t2.store.location is None
    assert th.Store.open(loc).version_hash("trials/x") == thr.read_pointer(c).version


def test_import_needs_neither_ray_nor_torch(tmp_path):
    import subprocess

    code = ("import sys; sys.modules['ray'] = None; sys.modules['torch'] = None\n"
            "import tensor_history.ray as r\n"
            "try:\n    r.trial_branch()\nexcept ImportError as e:\n    print('ray[tune]' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(
                             th.__file__))}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# ---- S3 --------------------------------------------------------------------------------------


def _s3_location() -> str:
    bucket = os.environ.get("TH_S3_BUCKET")
    missing = [v for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(v)]
    why = None
    if not bucket:
        why = "TH_S3_BUCKET is not set (no S3 test server; see .ci/s3-server.sh)"
    elif missing:
        why = f"TH_S3_BUCKET is set but {', '.join(missing)} not"
    if why is not None:
        if os.environ.get("TH_REQUIRE_S3") == "1":
            pytest.fail(f"{why}, and TH_REQUIRE_S3=1 requires the S3 test")
        pytest.skip(f"{why}: the Ray S3 test did not run")
    return f"s3://{bucket}/ray-{uuid.uuid4().hex}"


def test_pbt_trials_share_a_repository_on_s3(ray_session, tmp_path):
    from ray.tune.schedulers import PopulationBasedTraining

    loc = _s3_location()
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2,
        hyperparam_mutations={"lr": [1e-3, 1e-2, 3e-2]}, quantile_fraction=0.5,
        synch=True, resample_probability=0.0)
    rows = run_tune(tmp_path, {"lr": tune.grid_search([1e-3, 3e-2]), "steps": 4,
                               "location": loc}, scheduler=pbt, name="s3",
                    reuse_actors=True)
    store = check_branches(loc, rows)
    exploits = [r for tid, rs in rows.items() for r in rs
                if r["restored"] and r["restored_from"] not in ("", tid)]
    assert exploits, "PBT made no exploit"
    for r in exploits:
        assert r["restored_state"] == snapshot_digest(store, r["restored"])
        assert r["restore_chunks_written"] == 0
    res = thr.gc(loc, str(tmp_path / "ray"), grace=0)
    assert not res.missing and res.protected >= 2
