"""Lightning checkpoints in a tensor-history repository, beside Lightning's default.

A small LightningModule (a frozen embedding table, as a pretrained backbone, and a
trained head) is trained twice from the same seed with
``ModelCheckpoint(save_top_k=3, monitor="val_loss", save_last=True)``: once with
Lightning's ``TorchCheckpointIO`` (one ``torch.save`` file per checkpoint) and once with
``tensor_history.lightning.CheckpointIO`` (one version of a repository per checkpoint,
the ``.ckpt`` file a small pointer). Both runs are then resumed from their ``last.ckpt``
for more epochs, and the program prints the disk each one used and exits non-zero
unless the two resumed runs end with bit-identical weights.

    python examples/python/lightning_checkpoints.py [--epochs 4] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Optional, Tuple

import lightning as L
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as LightningCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

import tensor_history as th
import tensor_history.lightning as thl


class Regressor(L.LightningModule):
    """Mean of 16 embedded tokens through an MLP; the embedding table stays frozen."""

    def __init__(self, vocab: int = 20_000, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.emb.weight.requires_grad_(False)
        self.head = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(),
                                        torch.nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.emb(ids).mean(1))
        return out

    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], _i: int) -> torch.Tensor:
        ids, y = batch
        loss = torch.nn.functional.mse_loss(self(ids), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Tuple[torch.Tensor, torch.Tensor], _i: int) -> None:
        ids, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(ids), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=3e-3)


def loader(seed: int, vocab: int = 20_000) -> DataLoader[Tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (512, 16), generator=g)
    y = (ids % 7).float().mean(1, keepdim=True)
    return DataLoader(TensorDataset(ids, y), batch_size=64)


def train(plugin: LightningCheckpointIO, ckdir: str, epochs: int,
          ckpt_path: Optional[str] = None) -> Regressor:
    L.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
        enable_progress_bar=False, enable_model_summary=False, plugins=[plugin],
        callbacks=[ModelCheckpoint(dirpath=ckdir, save_top_k=3, monitor="val_loss",
                                   save_last=True)])
    trainer.fit(model, loader(0), loader(1), ckpt_path=ckpt_path)
    return model


def disk(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = args.dir or tempfile.mkdtemp(prefix="lightning-checkpoints-")
    finals: Dict[str, Any] = {}
    try:
        for kind in ("torch", "tensor-history"):
            d = os.path.join(root, kind)
            ckdir = os.path.join(d, "ckpts")

            def plugin() -> LightningCheckpointIO:
                if kind == "torch":
                    return TorchCheckpointIO()
                io: LightningCheckpointIO = thl.CheckpointIO(os.path.join(d, "repo"))
                return io

            train(plugin(), ckdir, args.epochs)
            last = os.path.join(ckdir, "last.ckpt")
            model = train(plugin(), ckdir, args.epochs + 2, ckpt_path=last)
            finals[kind] = {k: v.clone() for k, v in model.state_dict().items()}
            if kind == "tensor-history":
                with th.Store.open(os.path.join(d, "repo"), create=False) as store:
                    store.gc(grace=0)  # two phases: record, then delete (one writer)
                    store.gc(grace=0)
                    tags = sorted(n for n, k, _ in store.refs() if k == "tag")
                print(f"tags in the repository: {', '.join(tags)}")
            files = sorted(os.listdir(ckdir))
            print(f"{kind:>15}: {len(files)} checkpoint files, {disk(d) / 1e6:6.2f} MB on disk "
                  f"({', '.join(files)})")
        same = all(torch.equal(finals["torch"][k], finals["tensor-history"][k])
                   for k in finals["torch"])
        print("resumed runs bit-identical:", same)
        return 0 if same else 1
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
