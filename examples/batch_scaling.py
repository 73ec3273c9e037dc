"""Global batch scaling on a real problem: time to a target validation loss, on and off.

Two problems, both offline (nothing is downloaded), each a small MLP on 2 CPU ranks (gloo),
rank 1 emulated 2x slower, ``strategy="rex"`` from a global batch of 32 (``--batch-size``
per rank), SGD with momentum at a fixed learning rate:

* ``teacher`` (default): 100,000 samples labelled by a fixed random MLP's softmax, so the
  labels are noisy and the loss has a floor (about 1.41); 20 validations per epoch, 2 epochs.
  Late in training the gradient noise dominates, which is where a larger batch pays.
* ``digits``: scikit-learn's 8x8 digits (1,400 training images), validated once per epoch.

Each repeat runs, in turn, scaling ``off`` (B fixed at 32), ``on``
(``RexCallback(global_batch=GlobalBatchScaling(16, --max-global-batch, lr_rule=...))``)
and, with ``--fixed-batch N``, a run at ``B = N`` from the start with the rate set by the same
rule (the batch one would pick in hindsight)::

    python examples/batch_scaling.py [--problem teacher] [--lr-rule sqrt] [--repeat 3]
        [--target 1.53] [--max-epochs 2] [--stop-at-target] [--fixed-batch 512]

It prints, per setting, the median wall time to the target, the final validation loss and
accuracy after the same number of epochs (the same samples), and the global batches used.
"""

from __future__ import annotations

import argparse
import json
import shutil
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
from lightning_rex.core.scaling.noise_scale import lr_factor


def teacher_datasets(
    n_train: int = 100_000, n_val: int = 4_000
) -> tuple[TensorDataset, TensorDataset]:
    """A noisy teacher: labels drawn from a fixed random MLP's softmax (made here, offline).

    The labels are noisy, so the validation loss has a floor (the teacher's own loss, about
    1.41) and the gradient noise scale grows as the loss nears it; the train set is large
    enough that a few epochs do not overfit it.
    """
    g = torch.Generator().manual_seed(0)
    d, h, k = 32, 64, 10
    w1 = torch.randn(d, h, generator=g) / d**0.5
    w2 = torch.randn(h, k, generator=g) * 3 / h**0.5
    x = torch.randn(n_train + n_val, d, generator=g)
    logits = torch.tanh(x @ w1) @ w2
    y = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).squeeze(1)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    tr, va = perm[:1400], perm[1400:]
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[va], y[va])


# problem -> (datasets, input width, learning rate at B0, default target, validations per epoch)
PROBLEMS = {
    "teacher": (teacher_datasets, 32, 0.02, 1.53, 20),
    "digits": (digits_datasets, 64, 0.05, 0.12, 1),
}


class Classifier(L.LightningModule):
    def __init__(self, in_dim: int, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(in_dim, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class StopAtTarget(L.Callback):
    """Stop when the validation loss reaches the target; rank 0 writes what happened."""

    def __init__(self, target: float, out: Path, stop: bool) -> None:
        self.target, self.out, self.stop = target, out, stop
        self.t0 = 0.0
        self.reached: float | None = None
        self.curve: list[tuple[float, int, float]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        loss = float(trainer.callback_metrics.get("val_loss", float("inf")))
        now = time.perf_counter() - self.t0
        self.curve.append((round(now, 2), trainer.global_step, round(loss, 4)))
        if self.reached is None and loss <= self.target:
            self.reached = now
            trainer.should_stop = self.stop

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
                    "batches": [[step, sum(p)] for step, p in sampler.schedule],
                    "curve": self.curve,
                }
            )
        )


def run(name: str, a: argparse.Namespace) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="rex-scaling-")) / "result.json"
    make, in_dim, lr, _, checks = PROBLEMS[a.problem]
    scaling, per_rank = name == "on", a.batch_size
    if name == "fixed":  # B fixed at --fixed-batch from the start, the rate by the same rule
        per_rank = a.fixed_batch // 2
        if a.lr_rule == "adascale":
            raise SystemExit("--fixed-batch needs --lr-rule linear or sqrt (AdaScale adapts)")
        lr *= lr_factor(a.lr_rule, 2 * per_rank, 2 * a.batch_size)
    train, val = make()
    low = min(16, 2 * a.batch_size)  # the range must hold B0 = 2 x --batch-size
    cfg = GlobalBatchScaling(low, a.max_global_batch, lr_rule=a.lr_rule) if scaling else None
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="rex_fork",
        max_epochs=a.max_epochs,
        val_check_interval=1.0 / checks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out.parent),
        callbacks=[
            RexCallback(global_batch=cfg),
            HeterogeneityEmulator([1.0, 2.0]),
            StopAtTarget(a.target, out, a.stop_at_target),
        ],
    )
    trainer.fit(
        Classifier(in_dim, lr),
        DataLoader(train, batch_size=per_rank, shuffle=True),
        DataLoader(val, batch_size=1000),
    )
    result = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return dict(result)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", default="teacher", choices=sorted(PROBLEMS))
    p.add_argument("--target", type=float, default=None, help="default: the problem's")
    p.add_argument("--max-epochs", type=int, default=None, help="default: teacher 2, digits 40")
    p.add_argument("--batch-size", type=int, default=16, help="per rank at the start (B0 / 2)")
    p.add_argument("--stop-at-target", action="store_true", help="stop a run at the target")
    p.add_argument(
        "--fixed-batch",
        type=int,
        default=None,
        help="also run a fixed global batch from the start, its rate by --lr-rule (linear/sqrt)",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--lr-rule", default="sqrt", choices=["linear", "sqrt", "adascale"])
    p.add_argument("--max-global-batch", type=int, default=512)
    a = p.parse_args()
    assert lightning_rex.__version__
    if a.target is None:
        a.target = PROBLEMS[a.problem][3]
    if a.max_epochs is None:
        a.max_epochs = 2 if a.problem == "teacher" else 40
    names = ("off", "on") if a.fixed_batch is None else ("off", "on", "fixed")
    res: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for _ in range(a.repeat):
        for name in names:
            res[name].append(run(name, a))
    for name, rs in res.items():
        reached = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
        med = statistics.median(reached) if reached else float("nan")
        print(
            f"scaling {name:3s}: {len(reached)}/{len(rs)} reached val_loss <= {a.target} in a "
            f"median {med:.1f} s; final val_loss {statistics.median(r['val_loss'] for r in rs):.4f}"
            f", val_acc {statistics.median(r['val_acc'] for r in rs):.4f}; global batches "
            f"{sorted({b for r in rs for _, b in r['batches']})}"
        )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
