"""The Lightning CheckpointIO plugin with real Lightning and PyTorch (CPU): skipped when
Lightning is not installed, unless TH_REQUIRE_LIGHTNING=1 (CI's lightning tier), where a
missing Lightning is a failure.

Every loaded checkpoint is checked against a naive model: the same dict written by
``torch.save`` and read back by ``torch.load`` (Lightning's ``TorchCheckpointIO``), bit
for bit."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from fractions import Fraction

import numpy as np
import pytest

if os.environ.get("TH_REQUIRE_LIGHTNING") == "1":
    import lightning as L
    import torch
else:
    L = pytest.importorskip("lightning")
    import torch

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.lightning as thl  # noqa: E402

torch.set_num_threads(1)


# ----------------------------------------------------------------------- helpers


def same(a, b, where="") -> None:
    """Deep equality; tensors bit for bit (type, dtype, shape, device, bytes)."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b), where
        assert type(a) is type(b), where
        assert (a.dtype, tuple(a.shape), a.device) == (b.dtype, tuple(b.shape), b.device), where
        ab = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        bb = b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(ab, bb), where
        return
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
        if hasattr(a, "_metadata") or hasattr(b, "_metadata"):
            same(getattr(a, "_metadata", None), getattr(b, "_metadata", None),
                 f"{where}._metadata")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def du(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def torch_roundtrip(obj, path, weights_only=False):
    torch.save(obj, path)
    return torch.load(path, weights_only=weights_only)


class Model(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.01, extra=None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))
        self.loaded_hook = False

    def training_step(self, batch, _i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, _i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3)}

    def on_load_checkpoint(self, checkpoint) -> None:
        self.loaded_hook = checkpoint["global_step"]


def loader(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 4, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(48, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def trainer(plugin, callbacks, **kw):
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, plugins=[plugin] if plugin else None,
                     callbacks=callbacks, num_sanity_val_steps=0, **kw)


def fit(tmp, plugin, *, epochs, ckpt_path=None, top_k=2, every_n_train_steps=None,
        model=None, save_last=True, monitor="val_loss"):
    L.seed_everything(7, verbose=False)
    cb = ModelCheckpoint(dirpath=os.path.join(tmp, "ckpts"), monitor=monitor,
                         save_top_k=top_k, save_last=save_last,
                         every_n_train_steps=every_n_train_steps)
    model = model if model is not None else Model()
    tr = trainer(plugin, [cb], max_epochs=epochs)
    tr.fit(model, loader(0), loader(1), ckpt_path=ckpt_path)
    return tr, cb, model


def tags(location):
    with th.Store.open(location, create=False) as s:
        return {n for n, kind, _ in s.refs() if kind == "tag"}


def state_of(model, trainer_):
    opt = trainer_.optimizers[0].state_dict()
    return {"model": OrderedDict((k, v.clone()) for k, v in model.state_dict().items()),
            "opt": opt}


# ---------------------------------------------------------------- the encoding


def rich_checkpoint():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 3, generator=g)
    sd = OrderedDict([("a.weight", w), ("a.bias", torch.randn(3, generator=g)),
                      ("tied.weight", w)])
    sd._metadata = OrderedDict([("", {"version": 1}), ("a", {"version": 2})])
    out = {
        "epoch": 3, "global_step": 120, "name": "run", "none": None, "flag": True,
        "floats": [1.5, float("inf"), float("-inf"), float("nan"), -0.0],
        "state_dict": sd,
        "dtypes": {str(d): (torch.randn(4, 3, generator=g) * 50).to(d)
                   for d in (torch.float16, torch.bfloat16, torch.float64, torch.int8,
                             torch.uint8, torch.int16, torch.int32, torch.int64,
                             torch.bool, torch.complex64)},
        "zero_d": torch.tensor(2.5, dtype=torch.bfloat16),
        "zero_d_f32": torch.tensor(-1.0),
        "empty": torch.zeros(0, 7),
        "noncontig": torch.arange(12.0).reshape(3, 4).t(),
        "param": torch.nn.Parameter(torch.ones(2)),
        "int_keys": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(3, generator=g)},
                     1: "x"},
        "mixed_keys": {0: "int zero", "0": "str zero", (1, 2): "tuple"},
        "tuple": (1, "two", torch.tensor([3])),
        "size": torch.Size([2, 3]), "dtype": torch.bfloat16, "device": torch.device("cpu"),
        "bytes": b"\x00\xffbin",
        "slash/key": {"~tilde": torch.tensor([1, 2])},
        "__th__": "a key that is the encoding's marker",
        "big": 2 ** 70,
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["fp8"] = torch.randn(6, generator=g).to(torch.float8_e4m3fn)
    return out


def test_checkpoint_round_trips_bit_for_bit_like_torch_save(tmp_path):
    ckpt = rich_checkpoint()
    io = thl.CheckpointIO(tmp_path / "repo")
    io.save_checkpoint(ckpt, tmp_path / "c.ckpt")
    got = io.load_checkpoint(tmp_path / "c.ckpt")
    want = torch_roundtrip(ckpt, tmp_path / "torch.pt")
    same(want, got)
    # tied weights stay one tensor, as torch.load gives them
    assert got["state_dict"]["a.weight"] is got["state_dict"]["tied.weight"]
    assert got["state_dict"]._metadata == ckpt["state_dict"]._metadata
    # outside a trainer, from another store
    same(want, thl.load_checkpoint(tmp_path / "c.ckpt"))
    io.teardown()


def test_a_second_save_writes_only_what_changed(tmp_path):
    io = thl.CheckpointIO(tmp_path / "repo")
    big = torch.randn(256, 1024)  # 1 MiB: several chunks
    io.save_checkpoint({"w": big, "step": 1}, tmp_path / "a.ckpt")
    before = du(tmp_path / "repo")
    assert before > big.numel() * 4 / 2
    big2 = big.clone()
    big2[0, 0] += 1
    io.save_checkpoint({"w": big2, "step": 2}, tmp_path / "b.ckpt")
    grew = du(tmp_path / "repo") - before
    assert 0 < grew < before / 4
    same(thl.load_checkpoint(tmp_path / "a.ckpt")["w"], big)
    same(thl.load_checkpoint(tmp_path / "b.ckpt")["w"], big2)
    io.teardown()


def test_map_location_moves_tensors(tmp_path):
    io = thl.CheckpointIO(tmp_path / "repo")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.ckpt")
    for ml in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda s, loc: s, None):
        t = thl.load_checkpoint(tmp_path / "c.ckpt", map_location=ml)["w"]
        assert t.device.type == "cpu" and torch.equal(t, torch.ones(2))
    io.teardown()


def test_pickle_is_refused_unless_weights_only_false(tmp_path):
    io = thl.CheckpointIO(tmp_path / "repo")
    ckpt = {"hyper_parameters": {"ratio": Fraction(1, 3), "lr": 0.1},
            "state_dict": {"w": torch.ones(3)}}
    io.save_checkpoint(ckpt, tmp_path / "c.ckpt")
    for wo in (None, True):
        with pytest.raises(thl.PickleRequired) as e:
            thl.load_checkpoint(tmp_path / "c.ckpt", weights_only=wo)
        assert e.value.objects == ["hyper_parameters/ratio"]
        with pytest.raises(thl.PickleRequired):
            io.load_checkpoint(tmp_path / "c.ckpt", weights_only=wo)
    got = thl.load_checkpoint(tmp_path / "c.ckpt", weights_only=False)
    same(torch_roundtrip(ckpt, tmp_path / "t.pt"), got)
    # a class named by the checkpoint (hparams_type) loads only if it is known to be safe
    io.save_checkpoint({"t": Fraction, "d": dict}, tmp_path / "g.ckpt")
    with pytest.raises(thl.PickleRequired):
        thl.load_checkpoint(tmp_path / "g.ckpt")
    assert thl.load_checkpoint(tmp_path / "g.ckpt", weights_only=False)["t"] is Fraction
    io.save_checkpoint({"d": dict}, tmp_path / "d.ckpt")
    assert thl.load_checkpoint(tmp_path / "d.ckpt")["d"] is dict
    io.teardown()


def test_an_unpicklable_value_is_a_typed_error_and_saves_nothing(tmp_path):
    io = thl.CheckpointIO(tmp_path / "repo")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "a.ckpt")
    n = len(io.store.versions())
    with pytest.raises(th.InvalidArgument):
        io.save_checkpoint({"w": torch.zeros(2), "f": lambda: 1}, tmp_path / "b.ckpt")
    assert not (tmp_path / "b.ckpt").exists()
    assert len(io.store.versions()) == n and not io.store.is_dirty()
    with pytest.raises(th.InvalidArgument):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.ckpt", storage_options={"x": 1})
    same(thl.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.ones(2))
    io.teardown()


def test_a_save_whose_branch_moved_raises_and_changes_nothing(tmp_path):
    repo = tmp_path / "repo"
    first, second = thl.CheckpointIO(repo), thl.CheckpointIO(repo)
    first.save_checkpoint({"w": torch.zeros(3)}, tmp_path / "a.ckpt")
    second.store  # opened here, at a.ckpt's version
    first.save_checkpoint({"w": torch.ones(3)}, tmp_path / "b.ckpt")
    head = second.store.head()
    with pytest.raises(th.BranchMoved):
        second.save_checkpoint({"w": torch.full((3,), 2.0)}, tmp_path / "c.ckpt")
    assert not (tmp_path / "c.ckpt").exists()
    assert second.store.head() == head
    assert "c" not in {n for n, _, _ in second.store.refs()}
    assert tags(repo) == {"a", "b"}
    same(thl.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.zeros(3))
    same(second.load_checkpoint(tmp_path / "b.ckpt")["w"], torch.ones(3))
    first.teardown()
    second.teardown()


def test_bad_pointer_files_give_typed_errors(tmp_path):
    io = thl.CheckpointIO(tmp_path / "repo")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "good.ckpt")
    good = json.loads((tmp_path / "good.ckpt").read_text())
    torch.save({"w": torch.ones(2)}, tmp_path / "torch.ckpt")
    cases = {
        "empty": b"",
        "garbage": b"\x00\x01\x02not json",
        "not_utf8": b"\xff\xfe\xfd",
        "list": b"[1, 2]",
        "other_format": json.dumps({**good, "format": "other"}).encode(),
        "future": json.dumps({**good, "format_version": 99}).encode(),
        "no_tag": json.dumps({k: v for k, v in good.items() if k != "tag"}).encode(),
        "bad_hash": json.dumps({**good, "version": "xyz"}).encode(),
        "absent_version": json.dumps({**good, "version": "0" * 64}).encode(),
        "huge": b" " * (70 * 1024),
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.ckpt").write_bytes(data)
    for name in [*cases, "torch"]:
        p = tmp_path / f"{name}.ckpt"
        with pytest.raises(thl.NotACheckpoint):
            thl.load_checkpoint(p)
        with pytest.raises(thl.NotACheckpoint):
            io.load_checkpoint(p)
    with pytest.raises(FileNotFoundError):
        thl.load_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "moved.ckpt").write_text(json.dumps({**good, "location": str(tmp_path / "gone")}))
    with pytest.raises(th.NoRepository):
        thl.load_checkpoint(tmp_path / "moved.ckpt")
    assert not (tmp_path / "gone").exists()
    # a version that is not a Lightning checkpoint
    with th.Store.open(tmp_path / "other") as s:
        s.insert("w", [1.0])
        s.commit("plain")
        s.save()
        plain = {**good, "location": str(tmp_path / "other"), "version": s.version_hash("main")}
    (tmp_path / "plain.ckpt").write_text(json.dumps(plain))
    with pytest.raises(thl.NotACheckpoint):
        thl.load_checkpoint(tmp_path / "plain.ckpt")
    # damaged checkpoint state in a version of the repository
    states = {"not_json": b"{", "future_state": b'{"state_version": 2, "state": {}}',
              "no_items": b'{"state_version": 1, "state": {"__th__": "tuple"}}',
              "unknown_kind": b'{"state_version": 1, "state": {"__th__": "what"}}',
              "not_a_dict": b'{"state_version": 1, "state": [1]}',
              "no_tensor": b'{"state_version": 1, "state": {"w": {"__th__": "tensor", '
                           b'"name": "w", "dtype": "float32", "shape": [2]}}}',
              "bad_dtype": b'{"state_version": 1, "state": {"w": {"__th__": "tensor", '
                           b'"name": "x", "dtype": "nope", "shape": [2]}}}'}
    with th.Store.open(tmp_path / "damaged") as s:
        s.insert("x", torch.ones(2).numpy())
        for name, data in states.items():
            if thl.STATE_NAME in s:
                s.remove(thl.STATE_NAME)
            s.insert(thl.STATE_NAME, np.frombuffer(data, dtype=np.uint8))
            s.tag(name, at=s.commit(name))
        s.save()
        for name in states:
            ptr = {**good, "location": str(tmp_path / "damaged"), "version": s.version_hash(name)}
            (tmp_path / f"{name}.ckpt").write_text(json.dumps(ptr))
            with pytest.raises(thl.NotACheckpoint):
                thl.load_checkpoint(tmp_path / f"{name}.ckpt")
    same(io.load_checkpoint(tmp_path / "good.ckpt")["w"], torch.ones(2))
    io.teardown()


def test_import_needs_neither_torch_nor_lightning():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "lightning", "lightning_fabric",
                                          "pytorch_lightning"):
                    raise ImportError("blocked " + name)
        sys.meta_path.insert(0, Block())
        import tensor_history.lightning as thl
        assert "torch" not in sys.modules
        try:
            thl.CheckpointIO("x")
        except ImportError as e:
            print("ERR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert "pip install" in out.stdout


# ----------------------------------------------------------------- with a trainer


def test_fit_with_top_k_and_save_last_keeps_files_and_tags_in_step(tmp_path):
    repo = str(tmp_path / "repo")
    tr, cb, model = fit(str(tmp_path), thl.CheckpointIO(repo), epochs=5, top_k=2)
    files = sorted(f for f in os.listdir(tmp_path / "ckpts"))
    assert len(files) == 3 and "last.ckpt" in files
    assert {f[:-5] for f in files} == tags(repo)
    assert len(cb.best_k_models) == 2
    # last.ckpt is the trained model, bit for bit
    last = thl.load_checkpoint(tmp_path / "ckpts" / "last.ckpt")
    same(model.state_dict(), last["state_dict"])
    same(tr.optimizers[0].state_dict(), last["optimizer_states"][0])
    assert last["global_step"] == tr.global_step
    # every pointer names its own tag's version, and the history holds only those:
    # saving last.ckpt again pruned the version it named before
    with th.Store.open(repo, create=False) as s:
        named = set()
        for f in files:
            ptr = thl.read_pointer(tmp_path / "ckpts" / f)
            assert s.version_hash(ptr["tag"]) == ptr["version"]
            named.add(ptr["version"])
        assert {s.version_hash(v) for v in s.versions()} == named


def test_every_n_train_steps(tmp_path):
    repo = str(tmp_path / "repo")
    tr, cb, _ = fit(str(tmp_path), thl.CheckpointIO(repo), epochs=2, top_k=-1,
                    every_n_train_steps=2, save_last=False, monitor=None)
    files = sorted(os.listdir(tmp_path / "ckpts"))
    assert len(files) == tr.global_step // 2
    assert {f[:-5] for f in files} == tags(repo)


def test_resume_matches_a_run_resumed_from_torch_checkpoints(tmp_path):
    results = {}
    for kind in ("torch", "th"):
        d = tmp_path / kind
        plugin = (lambda: TorchCheckpointIO()) if kind == "torch" else \
            (lambda: thl.CheckpointIO(d / "repo"))
        fit(str(d), plugin(), epochs=2)
        saved = (torch.load(d / "ckpts" / "last.ckpt", weights_only=False) if kind == "torch"
                 else thl.load_checkpoint(d / "ckpts" / "last.ckpt"))
        tr, _, model = fit(str(d), plugin(), epochs=4,
                           ckpt_path=str(d / "ckpts" / "last.ckpt"))
        results[kind] = (saved, state_of(model, tr), tr.global_step)
    (s_t, end_t, n_t), (s_h, end_h, n_h) = results["torch"], results["th"]
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch",
                "global_step", "hyper_parameters"):
        same(s_t[key], s_h[key], key)
    assert n_t == n_h
    same(end_t, end_h)


def test_load_from_checkpoint_builds_the_module(tmp_path):
    repo = str(tmp_path / "repo")
    tr, cb, model = fit(str(tmp_path), thl.CheckpointIO(repo), epochs=3,
                        model=Model(hidden=6, lr=0.02))
    best = cb.best_model_path
    m = thl.load_from_checkpoint(Model, best)
    assert isinstance(m, Model) and m.hparams.hidden == 6 and m.hparams.lr == 0.02
    ckpt = thl.load_checkpoint(best)
    same(ckpt["state_dict"], m.state_dict())
    assert m.loaded_hook == ckpt["global_step"]
    # kwargs override hyper-parameters; strict loading refuses a module of another shape
    with pytest.raises(RuntimeError):
        thl.load_from_checkpoint(Model, best, hidden=5)
    m3 = thl.load_from_checkpoint(Model, best, lr=0.5)
    assert m3.hparams.lr == 0.5


def test_removal_by_top_k_drops_tags_and_gc_reclaims(tmp_path):
    repo = str(tmp_path / "repo")
    model = Model(hidden=256)  # a few chunks per tensor
    fit(str(tmp_path), thl.CheckpointIO(repo), epochs=6, top_k=1, model=model)
    files = sorted(os.listdir(tmp_path / "ckpts"))
    assert len(files) == 2
    assert {f[:-5] for f in files} == tags(repo)
    with th.Store.open(repo, create=False) as s:
        # only what a tag or the branch holds is left in the history
        assert len(s.versions()) <= 3
        first = s.gc(grace=0)
        second = s.gc(grace=0)
        reclaimed = first.bytes_deleted + second.bytes_deleted
        assert first.objects_deleted + second.objects_deleted > 0 and reclaimed > 0
    for f in files:
        ck = thl.load_checkpoint(tmp_path / "ckpts" / f)
        assert set(ck["state_dict"]) == set(model.state_dict())


def test_async_checkpoint_io(tmp_path):
    repo = str(tmp_path / "repo")
    tr, cb, model = fit(str(tmp_path), AsyncCheckpointIO(thl.CheckpointIO(repo)), epochs=4)
    files = sorted(os.listdir(tmp_path / "ckpts"))
    assert {f[:-5] for f in files} == tags(repo) and len(files) == 3
    last = thl.load_checkpoint(tmp_path / "ckpts" / "last.ckpt")
    # AsyncCheckpointIO rebuilds the dict it clones (the state dict loses _metadata)
    same(dict(model.state_dict()), dict(last["state_dict"]))
    tr2, _, m2 = fit(str(tmp_path), AsyncCheckpointIO(thl.CheckpointIO(repo)), epochs=5,
                     ckpt_path=str(tmp_path / "ckpts" / "last.ckpt"))
    assert tr2.global_step == last["global_step"] + len(loader())


# ------------------------------------------------------------- a killed save


CHILD = """
import os, sys, torch
import tensor_history.lightning as thl
io = thl.CheckpointIO(sys.argv[1])
d = sys.argv[2]
def ckpt(n):
    g = torch.Generator().manual_seed(n)
    return {"step": n, "state_dict": {"w": torch.randn(256, 512, generator=g),
            "b": torch.randn(512, generator=g).to(torch.bfloat16)}}
for n in range(1000):
    io.save_checkpoint(ckpt(n), os.path.join(d, f"step={n}.ckpt"))
    io.save_checkpoint(ckpt(n), os.path.join(d, "last.ckpt"))
    print(n, flush=True)
"""


def expected(n):
    g = torch.Generator().manual_seed(n)
    return {"step": n, "state_dict": {"w": torch.randn(256, 512, generator=g),
                                      "b": torch.randn(512, generator=g).to(torch.bfloat16)}}


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.06])
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, delay):
    repo, d = str(tmp_path / "repo"), str(tmp_path / "ckpts")
    os.makedirs(d)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, repo, d], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        acked = -1
        for line in child.stdout:
            acked = int(line)
            if acked >= 2:
                break
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert acked >= 2
    # every pointer file on disk loads, and holds the checkpoint it names
    seen = []
    for f in os.listdir(d):
        if not f.endswith(".ckpt"):
            continue  # a temporary pointer the kill left behind
        got = thl.load_checkpoint(os.path.join(d, f))
        same(expected(got["step"]), got)
        if f != "last.ckpt":
            assert f == f"step={got['step']}.ckpt"
        seen.append(got["step"])
    assert max(seen) >= acked
    last = thl.load_checkpoint(os.path.join(d, "last.ckpt"))
    assert last["step"] >= acked
    # the repository verifies, and a new writer continues where the last one stopped
    io = thl.CheckpointIO(repo)
    io.store.verify()
    io.save_checkpoint(expected(500), os.path.join(d, "last.ckpt"))
    same(expected(500), thl.load_checkpoint(os.path.join(d, "last.ckpt")))
    io.teardown()


# ------------------------------------------------------------------- on S3


def test_a_repository_on_s3(tmp_path):
    """Runs when TH_S3_BUCKET names a bucket of an S3 test server (`.ci/s3-server.sh`);
    skipped with the reason otherwise, failed instead with TH_REQUIRE_S3=1."""
    bucket = os.environ.get("TH_S3_BUCKET")
    if not bucket or not os.environ.get("AWS_ACCESS_KEY_ID"):
        why = "TH_S3_BUCKET or AWS_ACCESS_KEY_ID is not set (no S3 test server)"
        if os.environ.get("TH_REQUIRE_S3") == "1":
            pytest.fail(f"{why}, and TH_REQUIRE_S3=1 requires it")
        pytest.skip(why)
    import uuid

    url = f"s3://{bucket}/lightning-{uuid.uuid4().hex}"
    io = thl.CheckpointIO(url)
    a, b = expected(1), expected(2)
    io.save_checkpoint(a, tmp_path / "step=1.ckpt")
    io.save_checkpoint(b, tmp_path / "step=2.ckpt")
    assert thl.read_pointer(tmp_path / "step=1.ckpt")["location"] == url
    same(a, thl.load_checkpoint(tmp_path / "step=1.ckpt"))
    io.remove_checkpoint(tmp_path / "step=1.ckpt")
    assert not (tmp_path / "step=1.ckpt").exists()
    io.teardown()
    fresh = thl.CheckpointIO(url)
    same(b, fresh.load_checkpoint(tmp_path / "step=2.ckpt"))
    assert {n for n, kind, _ in fresh.store.refs() if kind == "tag"} == {"step=2"}
    fresh.teardown()
