"""Model code that waits on peers inside the step: the cases rex must time right.

Each case is the bench's model (:class:`~lightning_rex.tools.bench_model.BenchModel`) with one thing
real training steps hold, which makes a fast rank wait for a slow one *inside* its step:

* ``plain``: nothing (the gradient all-reduce only, after the backward);
* ``sync_dist``: ``self.log("train_loss", loss, sync_dist=True, on_step=True)``;
* ``unused_head``: an auxiliary head that gets no gradient, under
  ``find_unused_parameters=True``;
* ``all_gather``: ``self.all_gather`` of the loss, as a contrastive loss gathers;
* ``sync_bn``: a CPU stand-in for ``SyncBatchNorm``, a batch norm whose statistics are
  all-reduced in the forward (``torch.nn.SyncBatchNorm`` runs on accelerators only);
* ``checkpoint``: the hidden layers under activation checkpointing (recomputed in the
  backward).

A rank can be made slow by the model's own code instead of the emulator
(``forward_delay_s``): it sleeps that many seconds per sample *inside its forward*, before
any collective of the step, the way every kernel of a slower GPU is slower. The bench's
``--model-code`` and ``--slow-forward`` run these; the tests use them too.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_rex.tools.bench_model import BenchModel

__all__ = [
    "CASES",
    "AllReduceBatchNorm",
    "CaseModel",
    "case_model",
    "needs_unused_parameters",
]

CASES = ("plain", "sync_dist", "unused_head", "all_gather", "sync_bn", "checkpoint")
"""The model-code cases, by name."""


def needs_unused_parameters(case: str) -> bool:
    """Whether the case's strategy must be built with ``find_unused_parameters=True``.

    Args:
        case: A name from :data:`CASES`.

    Returns:
        True for ``unused_head``.
    """
    return case == "unused_head"


class AllReduceBatchNorm(nn.Module):
    """A batch norm over channels whose mean and variance are all-reduced across ranks.

    A stand-in for ``torch.nn.SyncBatchNorm`` on CPU: every forward sums each rank's
    per-channel sum, sum of squares and count with ``torch.distributed.all_reduce``, so a
    rank that reaches it first waits there for the others, as under ``SyncBatchNorm``. The
    statistics enter the normalisation as constants (no gradient through them).

    Args:
        channels: The feature dimension (the last one).
        eps: Added to the variance.
    """

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` by the statistics of every rank's batch.

        Args:
            x: Shape ``(..., channels)``.

        Returns:
            The normalised, scaled and shifted ``x``.
        """
        flat = x.detach().reshape(-1, x.shape[-1])
        stats = torch.cat([flat.sum(0), (flat * flat).sum(0), flat.new_tensor([len(flat)])])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(stats)
        channels = x.shape[-1]
        count = stats[-1]
        mean = stats[:channels] / count
        var = (stats[channels : 2 * channels] / count - mean * mean).clamp_min(0.0)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class CaseModel(BenchModel):
    """The bench's model with one case of in-step model code, and optional forward slowness.

    Args:
        case: A name from :data:`CASES`.
        forward_delay_s: Seconds slept per sample inside the forward, per global rank (None:
            no sleep); the rank's own code making it slow, before any in-step collective.
        width: The hidden width.
        depth: How many times the shared hidden layer is applied.

    Raises:
        ValueError: For an unknown case.
    """

    def __init__(
        self,
        case: str = "plain",
        forward_delay_s: Sequence[float] | None = None,
        width: int = 256,
        depth: int = 6,
    ) -> None:
        if case not in CASES:
            raise ValueError(f"case must be one of {list(CASES)}, got {case!r}")
        super().__init__(width=width, depth=depth)
        self.case = case
        self.forward_delay_s = None if forward_delay_s is None else list(forward_delay_s)
        self.norm = AllReduceBatchNorm(width) if case == "sync_bn" else None
        self.aux = nn.Linear(width, 10) if case == "unused_head" else None

    def _delay(self, samples: int) -> None:
        if self.forward_delay_s is not None:
            time.sleep(self.forward_delay_s[self.global_rank] * samples)

    def _hidden(self, activations: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            activations = torch.tanh(self.hidden(activations))
        return activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The bench model's forward, with the case's batch norm or checkpointing.

        Args:
            x: Inputs of shape ``(batch, tokens, in_features)``.

        Returns:
            Logits of shape ``(batch, classes)``.
        """
        self._delay(len(x))
        activations = torch.tanh(self.inp(x))
        if self.norm is not None:
            activations = self.norm(activations)
        if self.case == "checkpoint":
            activations = checkpoint(self._hidden, activations, use_reentrant=False)
        else:
            activations = self._hidden(activations)
        return self.out(activations.mean(dim=1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy, with the case's in-step collective.

        Args:
            batch: ``(x, y)``.
            batch_idx: The batch index.

        Returns:
            The loss.
        """
        loss = super().training_step(batch, batch_idx)
        if self.case == "sync_dist":
            self.log("train_loss", loss, sync_dist=True, on_step=True, prog_bar=False)
        elif self.case == "all_gather":
            gathered = self.all_gather(loss.detach())
            assert isinstance(gathered, torch.Tensor)
            loss = loss + 0.0 * gathered.sum()
        return loss


def case_model(args: argparse.Namespace, case: str) -> BenchModel:
    """The bench's model for a run: the case's model code, slow where ``args`` says.

    Args:
        args: The bench's arguments: ``width``, ``depth``, ``slowdowns`` and
            ``slow_forward`` (milliseconds a sample that a rank of slowdown 1 sleeps in its
            forward; a rank of slowdown ``s`` sleeps ``s`` times that; None: no sleep, the
            emulator makes ranks slow).
        case: A name from :data:`CASES`.

    Returns:
        The model.
    """
    slow = getattr(args, "slow_forward", None)
    delays = None if slow is None else [slow / 1000.0 * s for s in args.slowdowns]
    if case == "plain" and delays is None:
        return BenchModel(width=args.width, depth=args.depth)
    return CaseModel(case, delays, width=args.width, depth=args.depth)
