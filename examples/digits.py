"""Image classification under rex: a small CNN on scikit-learn's 8x8 digits, offline.

The dataset ships with scikit-learn (nothing is downloaded). Two CPU ranks train with
``strategy="rex"``, rank 1 emulated 2x slower. Validation accuracy is a torchmetrics metric,
which sums correct predictions and counts over the ranks, so it is exact whatever the plan;
``self.log(..., sync_dist=True)`` of a per-rank mean would average the ranks' means unweighted.
The same script runs under ``ddp`` for comparison::

    python examples/digits.py [--strategy rex|ddp] [--epochs 8]

It prints the validation accuracy after each epoch, the plan rex settled on, and the
wall time; both strategies reach the same accuracy (same global batch, same mathematics).
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from typing import Any

import torch
import torchmetrics
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
import lightning_rex
from lightning_rex import HeterogeneityEmulator


def datasets() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    tr, va = perm[:1400], perm[1400:]
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[va], y[va])


class DigitsCNN(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 10),
        )
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(10, average="micro")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)  # a per-sample mean, as rex needs

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_acc.update(self.net(x), y)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()  # synced over ranks: total correct / total samples
        self.val_acc.reset()
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            plan = getattr(self.trainer.strategy, "plan", None)
            print(f"epoch {self.current_epoch}: val accuracy {float(acc):.4f}, plan {plan}")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="rex", choices=["rex", "ddp"])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--log-dir", default="rex_digits", help="where rex_decisions.jsonl goes")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")  # this example's output only: Lightning's notes on CPU runs
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch.lightning_rex").setLevel(logging.INFO)  # rex's lines
    assert lightning_rex.__version__  # the import registers "rex_fork"
    train, val = datasets()
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=f"{a.strategy}_fork",  # fork starts fastest on a laptop; use "rex" on a cluster
        max_epochs=a.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[HeterogeneityEmulator([1.0, 2.0])],
        default_root_dir=a.log_dir,  # rex_decisions.jsonl goes here
    )
    t0 = time.perf_counter()
    trainer.fit(
        DigitsCNN(),
        DataLoader(train, batch_size=32, shuffle=True),
        DataLoader(val, batch_size=100),
    )
    if trainer.is_global_zero:
        print(f"{a.strategy}: {a.epochs} epochs in {time.perf_counter() - t0:.1f} s")
        if a.strategy == "rex":
            print(
                f"decisions: {a.log_dir}/rex_decisions.jsonl; plots: python -m lightning_rex "
                f"report {a.log_dir}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
