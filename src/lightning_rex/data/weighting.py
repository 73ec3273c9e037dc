"""The exact gradient weighting for uneven micro-batches, as loss-scale factors.

Rank ``r`` computes ``g_r``, the gradient of its loss over its ``b_r`` samples. The gradient
of the same loss over the whole global batch of ``B`` samples is

* ``sum_r (b_r / B) * g_r`` when each rank's loss is a mean over its micro-batch, and
* ``sum_r g_r`` when it is a sum.

DDP's all-reduce *averages* gradients (it divides the sum by ``N``). Rather than replacing the
all-reduce with a communication hook (Lightning registers hooks only on CUDA, and DDP takes one
hook per model, so a user's own hook would be lost), REX multiplies each rank's loss before
``backward`` by ``N * w_r``. DDP's average then yields ``sum_r w_r g_r`` exactly, on every
backend, alongside any hook the user registers, with AMP's gradient scaler, and with gradient
accumulation (each micro-step carries its own factor).

The same factors make ``self.log(..., sync_dist=True, on_step=True)`` of a per-sample mean a
true global-batch mean: a rank's value ``v_r`` scaled by ``N * b_r / B`` and averaged over
ranks gives ``sum_r (b_r / B) v_r``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

LossReduction = Literal["mean", "sum"]
LOSS_REDUCTIONS: tuple[str, ...] = ("mean", "sum")

__all__ = [
    "LOSS_REDUCTIONS",
    "LossReduction",
    "gradient_weight",
    "loss_scale",
    "mean_weight",
    "pass_loss_scale",
]


def mean_weight(sizes: Sequence[int], rank: int) -> float:
    """The share ``b_r / B`` of rank ``rank`` in a global batch split as ``sizes``.

    Args:
        sizes: The per-rank micro-batch sizes of one global batch.
        rank: The rank whose weight to return.

    Returns:
        ``sizes[rank] / sum(sizes)``.
    """
    return sizes[rank] / sum(sizes)


def gradient_weight(sizes: Sequence[int], rank: int, reduction: LossReduction) -> float:
    """The weight ``w_r`` of rank ``rank``'s gradient in the exact global gradient.

    Args:
        sizes: The per-rank micro-batch sizes of one global batch.
        rank: The rank whose weight to return.
        reduction: ``"mean"`` if the loss is a mean over the micro-batch, ``"sum"`` if a sum.

    Returns:
        ``b_r / B`` for mean-reduced losses, ``1`` for sum-reduced ones.

    Raises:
        ValueError: If ``reduction`` is not one of ``"mean"``, ``"sum"``.
    """
    if reduction == "mean":
        return mean_weight(sizes, rank)
    if reduction == "sum":
        return 1.0
    raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {reduction!r}")


def loss_scale(sizes: Sequence[int], rank: int, reduction: LossReduction) -> float:
    """The factor to multiply rank ``rank``'s loss by before DDP's averaging all-reduce.

    Args:
        sizes: The per-rank micro-batch sizes of one global batch.
        rank: The rank whose factor to return.
        reduction: ``"mean"`` or ``"sum"``, what the loss is over its micro-batch.

    Returns:
        ``N * w_r``, so that DDP's average of the scaled gradients is ``sum_r w_r g_r``.
    """
    return len(sizes) * gradient_weight(sizes, rank, reduction)


def pass_loss_scale(
    sizes: Sequence[int], rank: int, pass_size: int, reduction: LossReduction
) -> float:
    """The factor for one accumulation pass of rank ``rank``'s micro-batch.

    A rank that trains its ``b_r`` samples as passes scales each pass's loss by its own
    share: ``N * s / B`` for a pass of ``s`` samples and a mean loss (``N`` for a sum), so
    the passes' gradients add up to the rank's ``N * w_r * g_r`` exactly.

    Args:
        sizes: The per-rank micro-batch sizes of one global batch.
        rank: The rank.
        pass_size: The pass's size (the whole micro-batch: :func:`loss_scale`).
        reduction: ``"mean"`` or ``"sum"``, what the loss is over its pass.

    Returns:
        The factor.
    """
    if reduction == "sum":
        return float(len(sizes))
    return loss_scale(sizes, rank, reduction) * pass_size / sizes[rank]
