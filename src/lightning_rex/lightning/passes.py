"""A rank's micro-batch as accumulation passes, when more samples than fit in one pass.

A plan may give a rank more samples than its memory holds in one forward and backward
(its *pass cap*, declared or measured). That rank then trains its micro-batch as
``k = ceil(b / cap)`` passes of sizes as even as possible
(:func:`~lightning_rex.core.passes.passes`), with gradient synchronisation
paused on all but the last. Every rank still takes one optimizer step per global step, and
each pass's loss carries its own factor (:func:`~lightning_rex.data.weighting.pass_loss_scale`),
so the reduced gradient is the global batch's exactly.

This module cuts a collated batch into passes: every tensor whose first dimension is the
micro-batch is sliced along it; anything else (a scalar, a tensor of another length, a
string) is passed to every pass unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

__all__ = ["loss_of", "mark_batch_dynamic", "split_batch"]


def split_batch(batch: Any, sizes: Sequence[int]) -> list[Any]:
    """Cut a collated batch into consecutive passes of ``sizes`` samples.

    Args:
        batch: The rank's collated micro-batch (tensors, or collections of them).
        sizes: The passes' sizes, summing to the micro-batch's size.

    Returns:
        One batch per pass, in order.

    Raises:
        ValueError: If no tensor in the batch has the micro-batch's size as its first
            dimension (nothing could be cut).
    """
    total = int(sum(sizes))
    found = False

    def check(t: Tensor) -> Tensor:
        nonlocal found
        found = found or (t.dim() > 0 and t.shape[0] == total)
        return t

    apply_to_collection(batch, Tensor, check)
    if not found:
        raise ValueError(
            f"lightning-rex: this rank's micro-batch of {total} samples must run as "
            f"{len(sizes)} accumulation passes (its pass cap binds), but no tensor in the batch "
            f"has {total} rows to cut; a batch of tensors whose first dimension is the sample "
            "is needed (or raise the pass cap: max_pass_sizes)"
        )
    out: list[Any] = []
    start = 0
    for size in sizes:
        stop = start + int(size)

        def cut(t: Tensor, a: int = start, b: int = stop) -> Tensor:
            return t[a:b] if t.dim() > 0 and t.shape[0] == total else t

        out.append(apply_to_collection(batch, Tensor, cut))
        start = stop
    return out


def mark_batch_dynamic(batch: Any, size: int) -> Any:
    """Tell ``torch.compile`` that the batch dimension varies, so a new size does not recompile.

    Every plan change gives a rank a new micro-batch size; a compiled model specialised on
    the size compiles once per size (and falls back to eager at dynamo's recompile limit).
    Each tensor whose first dimension is ``size`` is marked with
    ``torch._dynamo.maybe_mark_dynamic``: compiled code is then traced for a symbolic batch
    (dynamo may still specialise a size of 1). Tensors of a model that is not compiled are
    unaffected.

    Args:
        batch: A batch (tensors, or collections of them).
        size: Its number of samples.

    Returns:
        The batch, its tensors marked in place.
    """
    from torch._dynamo import maybe_mark_dynamic

    def mark(t: Tensor) -> Tensor:
        if t.dim() > 0 and t.shape[0] == size:
            maybe_mark_dynamic(t, 0)
        return t

    apply_to_collection(batch, Tensor, mark)
    return batch


def loss_of(output: Any) -> Tensor | None:
    """The loss in a ``training_step``'s output, as Lightning reads it.

    Args:
        output: A loss tensor, a mapping with a ``"loss"`` entry, or None (skip the pass).

    Returns:
        The loss, or None.

    Raises:
        ValueError: For an output Lightning would not accept as a loss either.
    """
    if output is None or isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        if loss is None or isinstance(loss, Tensor):
            return loss
    raise ValueError(
        "lightning-rex: under accumulation passes, training_step must return a loss tensor, "
        f"a dict with a 'loss' entry, or None; got {type(output).__name__}"
    )
