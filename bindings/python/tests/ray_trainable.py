"""The trainable of tests/test_ray.py, in a module of its own so that Ray's workers import
it by name (the tests directory is on their PYTHONPATH).

A linear model with SGD + momentum learns a fixed regression; every iteration commits and
checkpoints through ``tensor_history.ray`` and reports, beside the loss, the version it
saved and what a restore at its start did (the version, the trial that saved it, a digest
of the restored tensors, and what the save right after the restore wrote).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Iterable, Tuple

import numpy as np


def digest(items: Iterable[Tuple[str, np.ndarray]]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of each array, in name order."""
    h = hashlib.sha256()
    for name, a in sorted(items, key=lambda kv: kv[0]):
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def tracked_arrays(model: Any, optimizer: Any) -> Dict[str, np.ndarray]:
    """The tensors a torch tracker stores, under its names (copies)."""
    import torch

    out = {"model/" + k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim/{i}/{k}"] = v.detach().numpy().copy()
    return out


def snapshot_digest(store: Any, ref: Any) -> str:
    snap = store.snapshot(ref)
    return digest((n, snap[n]) for n in snap.keys()
                  if n.startswith("model/") or n.startswith("optim/"))


def log_report(config: Dict[str, Any], row: Dict[str, Any]) -> None:
    """Append a reported row to ``<logdir>/<trial id>.jsonl`` (Ray's own result files
    start again when a failed trial is restored)."""
    from ray import tune

    tid = tune.get_context().get_trial_id()
    with open(os.path.join(config["logdir"], f"{tid}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({**row, "trial_id": tid}) + "\n")


def trainable(config: Dict[str, Any]) -> None:
    import torch
    from ray import tune

    import tensor_history as th
    import tensor_history.ray as thr

    torch.set_num_threads(1)
    torch.manual_seed(config.get("seed", 0))
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    tracker = th.torch.track(model, opt)
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(128, 32, generator=gen)
    y = x @ torch.randn(32, 4, generator=gen)

    info: Dict[str, Any] = {"restored": "", "restored_from": "", "restored_state": "",
                            "restore_chunks_written": -1, "restore_bytes_written": -1}
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        trial_id = thr.read_pointer(ckpt).trial_id or ""
        v = thr.restore(tracker)
        assert v is not None
        info["restored"] = tracker.store.version_hash(v)
        info["restored_from"] = trial_id
        info["restored_state"] = digest(tracked_arrays(model, opt).items())
        # The branch reset, saved alone: what an exploit costs the repository.
        stats = tracker.save()
        info["restore_chunks_written"] = stats.chunks_written
        info["restore_bytes_written"] = stats.bytes_written
        start = int(tracker.store.metadata(v)["step"])
        for g in opt.param_groups:
            g["lr"] = config["lr"]  # PBT's perturbed value, not the exploited trial's
        if start >= config["steps"]:
            # Restored at the end (PBT exploits at the last perturbation too): say so.
            with torch.no_grad():
                loss = torch.nn.functional.mse_loss(model(x), y)
            row = {"loss": float(loss), "step": start, "version": info["restored"],
                   "state": info["restored_state"], **info}
            log_report(config, row)
            tune.report(row)
            return
    die_at = config.get("die_at")
    marker = config.get("marker")
    for step in range(start, config["steps"]):
        if die_at is not None and step == die_at and marker and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the actor dies without a word, as a killed one does
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        ck = thr.checkpoint(tracker, config["location"], step=step + 1)
        version = thr.read_pointer(ck).version
        row = {"loss": float(loss), "step": step + 1, "version": version,
               "state": digest(tracked_arrays(model, opt).items()), **info}
        log_report(config, row)
        tune.report(row, checkpoint=ck)
        info = {k: ("" if isinstance(v, str) else -1) for k, v in info.items()}

