"""The bench's model: a weight-tied deep MLP over each sample's tokens."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import lightning as L

__all__ = ["BenchModel"]


class BenchModel(L.LightningModule):
    """A weight-tied deep MLP over a sample's tokens: many FLOPs per sample, few parameters.

    Args:
        width: The hidden width.
        depth: How many times the shared hidden layer is applied.
        in_features: The feature dimension of each token.
        classes: The number of classes.
    """

    def __init__(self, width: int = 256, depth: int = 6, in_features: int = 32, classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, classes)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the shared layer ``depth`` times.

        Args:
            x: Inputs of shape ``(batch, tokens, in_features)``.

        Returns:
            Logits of shape ``(batch, classes)``.
        """
        activations = torch.tanh(self.inp(x))
        for _ in range(self.depth):
            activations = torch.tanh(self.hidden(activations))
        return self.out(activations.mean(dim=1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on the micro-batch (mean-reduced).

        Args:
            batch: ``(x, y)``.
            batch_idx: The batch index.

        Returns:
            The loss.
        """
        inputs, targets = batch
        return nn.functional.cross_entropy(self(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum.

        Returns:
            The optimizer.
        """
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
