"""A LightningCLI training script: rex is configured from YAML or flags, the script is plain.

The only rex-specific line is ``import lightning_rex``, which registers the short strategy
names ("rex", "rex_spawn", "rex_fork"); a class path with arguments
(``class_path: lightning_rex.RexStrategy`` and ``init_args`` in YAML) works without it.
Each config runs on two CPU cores (its duration is in the README's examples table)::

    # adaptive: strategy "rex", a RexCallback with its arguments, rank 1 emulated 3x slower;
    # it prints a line for each decision (RexCallback(verbose=false) keeps it quiet)
    python examples/cli/train.py fit --config examples/cli/adaptive.yaml
    # a fixed plan given as a class path with its arguments
    python examples/cli/train.py fit --config examples/cli/static_plan.yaml
    # flags instead of YAML
    python examples/cli/train.py fit --trainer.strategy=rex --trainer.devices=2 \
        --trainer.accelerator=cpu --trainer.max_epochs=1
    # every argument of the callback, as LightningCLI sees it
    python examples/cli/train.py fit --trainer.callbacks.help lightning_rex.RexCallback
"""

import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
import lightning_rex  # noqa: F401  (registers "rex", "rex_spawn", "rex_fork")


class ToyModel(L.LightningModule):
    """An MLP applied to each of a sample's 16 tokens, then mean-pooled.

    Its compute grows with the micro-batch (about 15 MFLOP a sample, forward and backward),
    as a real model's does: a model whose step is all fixed overhead gains nothing from
    moving samples between ranks.
    """

    def __init__(self, lr: float = 0.05, width: int = 384) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
        )
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).mean(dim=1), y)
        self.log("train_loss", loss, sync_dist=True, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class ToyData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, samples: int = 2048) -> None:
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, 16, 16, generator=g)  # 16 tokens of 16 features
        return DataLoader(
            TensorDataset(x, x[:, :, :1].mean(dim=1) * 3.0),
            batch_size=self.batch_size,
            shuffle=True,
        )


def main() -> None:
    LightningCLI(ToyModel, ToyData)


if __name__ == "__main__":
    main()
