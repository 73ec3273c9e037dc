"""Global batch scaling on a real problem: time to a target validation loss, on and off.

Digits (scikit-learn's 8x8 handwritten digits, shipped with the package: nothing is
downloaded), a small MLP, 2 CPU ranks (gloo), rank 1 emulated 2x slower. Each run trains with
``strategy="rex"`` from a global batch of 32, with and without
``RexCallback(global_batch=GlobalBatchScaling(16, 512, lr_rule="adascale"))``, until the
validation loss reaches the target (or ``--max-epochs``); runs alternate, ``--repeat`` times
each::

    python examples/batch_scaling.py [--target 0.12] [--max-epochs 40] [--repeat 3]
        [--lr-rule adascale] [--max-global-batch 512]

It prints, per setting, the median wall time to the target, the final validation loss and
accuracy, and the global batches the scaled runs moved through.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
import lightning_rex
from lightning_rex import GlobalBatchScaling, HeterogeneityEmulator, RexCallback


def datasets() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    tr, va = perm[:1400], perm[1400:]
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[va], y[va])


class Digits(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class StopAtTarget(L.Callback):
    """Stop when the validation loss reaches the target; rank 0 writes what happened."""

    def __init__(self, target: float, out: Path) -> None:
        self.target, self.out = target, out
        self.t0 = 0.0
        self.reached: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loss = float(trainer.callback_metrics.get("val_loss", float("inf")))
        if self.reached is None and loss <= self.target:
            self.reached = time.perf_counter() - self.t0
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank != 0:
            return
        sampler = trainer.strategy.train_loader.batch_sampler
        self.out.write_text(
            json.dumps(
                {
                    "seconds_to_target": self.reached,
                    "seconds": time.perf_counter() - self.t0,
                    "val_loss": float(trainer.callback_metrics["val_loss"]),
                    "val_acc": float(trainer.callback_metrics["val_acc"]),
                    "steps": trainer.global_step,
                    "batches": sorted({sum(p) for _, p in sampler.schedule}),
                }
            )
        )


def run(scaling: bool, target: float, max_epochs: int, rule: str, max_batch: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="rex-scaling-")) / "result.json"
    train, val = datasets()
    cfg = GlobalBatchScaling(16, max_batch, lr_rule=rule) if scaling else None  # type: ignore[arg-type]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="rex_fork",
        max_epochs=max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out.parent),
        callbacks=[
            RexCallback(global_batch=cfg),
            HeterogeneityEmulator([1.0, 2.0]),
            StopAtTarget(target, out),
        ],
    )
    trainer.fit(
        Digits(),
        DataLoader(train, batch_size=16, shuffle=True),
        DataLoader(val, batch_size=200),
    )
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=float, default=0.12)
    p.add_argument("--max-epochs", type=int, default=40)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--lr-rule", default="adascale", choices=["linear", "sqrt", "adascale"])
    p.add_argument("--max-global-batch", type=int, default=512)
    a = p.parse_args()
    assert lightning_rex.__version__
    res: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(a.repeat):
        for name in ("off", "on"):
            res[name].append(
                run(name == "on", a.target, a.max_epochs, a.lr_rule, a.max_global_batch)
            )
    for name, rs in res.items():
        reached = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
        med = statistics.median(reached) if reached else float("nan")
        print(
            f"scaling {name:3s}: {len(reached)}/{len(rs)} reached val_loss <= {a.target} in a "
            f"median {med:.1f} s; final val_loss {statistics.median(r['val_loss'] for r in rs):.4f}"
            f", val_acc {statistics.median(r['val_acc'] for r in rs):.4f}; global batches "
            f"{sorted({b for r in rs for b in r['batches']})}"
        )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
