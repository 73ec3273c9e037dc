"""Strategies whose gradients and step-logged values are weighted by each rank's share.

Rank ``r`` computes the mean-loss gradient of its ``b_r`` samples; DDP's averaging
all-reduce gives each rank the weight ``1 / N``, which is wrong for uneven batches.
:class:`Weighted` (the mixin the DDP and FSDP strategies share) multiplies each rank's
loss by ``N x b_r / B`` (mean losses) or ``N`` (sum losses) before ``backward``
(:func:`~lightning_rex.data.weighting.loss_scale`), so the all-reduce yields the global
batch's gradient exactly, and weights ``self.log(..., sync_dist=True)`` step values the
same way. A subclass says what the current batch's per-rank sizes are
(:meth:`Weighted.current_batch_sizes`); ``RexStrategy`` and ``RexFSDPStrategy`` are such
subclasses. FSDP's reduce-scatter averages as DDP's all-reduce does, so the same factors
are exact there.

A rank whose micro-batch is larger than its pass cap (:meth:`Weighted.passes_for`) trains it as
accumulation passes inside one ``training_step`` (:mod:`~lightning_rex.lightning.passes`):
every pass but the last runs forward and backward with gradient synchronisation paused
(:meth:`Weighted.passes_unsynced`), each with its own factor; the last is returned to
Lightning, which runs its backward, the synchronising one, as usual. Only the last pass
logs: ``self.log`` is silent in the others, so every rank logs (and, with ``sync_dist``,
reduces) once a step; its values are the last pass's, weighted in epoch means by the rank's
whole micro-batch.

Epoch values are weighted by the batch size Lightning is told: it infers each rank's own size
from the batch, which is exact. ``self.log(..., batch_size=32)`` with the DataLoader's
``batch_size`` (as Lightning recommends where it cannot infer it) would weight every rank
alike; inside ``training_step`` that value is replaced by the rank's true micro-batch, with
one line saying so. Any other ``batch_size`` (a token count, say) is kept as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.optim import Optimizer

from lightning_rex.core.plans.plan import Plan
from lightning_rex.data.weighting import LossReduction, loss_scale, pass_loss_scale
from lightning_rex.lightning.passes import loss_of, mark_batch_dynamic, split_batch

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import STEP_OUTPUT

__all__ = ["Weighted", "WeightedDDP"]

_MEAN_OPS = ("mean", "avg")


@contextmanager
def _quiet(module: Any) -> Iterator[None]:
    """No ``self.log`` in the passes before the last: one log a step on every rank.

    An ``on_step`` value logged with ``sync_dist=True`` is reduced inside ``self.log``; a
    rank that logged once a pass would issue more collectives than a rank without passes.
    """
    if module is None:
        yield
        return
    saved = {name: module.__dict__.get(name) for name in ("log", "log_dict")}
    module.log = module.log_dict = lambda *a, **k: None
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del module.__dict__[name]
            else:
                module.__dict__[name] = value


class Weighted:
    """A strategy mixin: each rank's loss and logged step values weighted by its share.

    It goes ahead of a Lightning strategy in the bases (``class S(Weighted, DDPStrategy)``)
    and overrides its ``training_step``, ``backward`` and ``reduce``.

    Args:
        *args: The Lightning strategy's arguments.
        **kwargs: Likewise.
    """

    global_rank: int
    lightning_module: Any

    loss_reduction: LossReduction = "mean"
    #: Mark each training batch's first dimension dynamic for ``torch.compile``
    #: (:func:`~lightning_rex.lightning.passes.mark_batch_dynamic`)
    dynamic_batch: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_sizes: Plan | None = None
        self._pass_size: int | None = None
        self._set_aside: list[tuple[Tensor, Tensor]] = []  # earlier passes' gradients
        self._in_training_step = False
        self._told_batch_size = False

    def current_batch_sizes(self) -> Plan | None:
        """The per-rank sizes of the batch being trained now (None: no weighting)."""
        return None

    def even_batch_sizes(self) -> tuple[int, ...]:
        """The ``batch_size`` values that mean "this rank's batch" under DDP (the loader's).

        Returns:
            The sizes (none by default).
        """
        return ()

    def passes_for(self, size: int) -> list[int]:
        """The accumulation passes a micro-batch of ``size`` samples runs as on this rank.

        Args:
            size: The micro-batch.

        Returns:
            The passes' sizes: one pass here; a strategy with pass caps cuts more
            (:class:`~lightning_rex.lightning.pass_caps.PassCaps`).
        """
        return [size]

    @contextmanager
    def passes_unsynced(self) -> Iterator[None]:
        """Run the passes before the last with gradient synchronisation paused (no-op here).

        A strategy whose gradient reduction runs in backward says how to pause it without
        leaving its collectives out of step with the other ranks'.

        Yields:
            Nothing.
        """
        yield

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        """Run the user's training_step, remembering this batch's per-rank sizes.

        When the rank's micro-batch is above its pass cap, the batch (the first argument) is
        cut into passes: all but the last run forward and backward here, unsynchronised, and
        the last pass's output is returned.

        Args:
            *args: Forwarded to the LightningModule's ``training_step``.
            **kwargs: Forwarded likewise.

        Returns:
            The LightningModule's output (of the last pass).
        """
        self._step_sizes = self.current_batch_sizes()
        self._pass_size = None
        self._in_training_step = True
        module = self.lightning_module
        sizes = self._step_sizes
        patched = module is not None and sizes is not None and bool(self.even_batch_sizes())
        if patched:
            assert module is not None and sizes is not None
            module.log = self._weighted_log(module.log, sizes[self.global_rank])
        try:
            passes = self.passes_for(sizes[self.global_rank]) if sizes is not None else [0]
            if len(passes) == 1 or not args:
                if args and sizes is not None and self.dynamic_batch:
                    mark_batch_dynamic(args[0], sizes[self.global_rank])
                return super().training_step(*args, **kwargs)  # type: ignore[misc]
            return self._train_passes(passes, *args, **kwargs)
        finally:
            self._in_training_step = False
            if patched and module is not None:
                del module.log  # back to the class's method

    def _train_passes(self, passes: list[int], *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        module = self.lightning_module
        if module is not None and not module.automatic_optimization:
            raise RuntimeError(
                "lightning-rex: this rank's micro-batch must run as accumulation passes (its "
                "pass cap binds), which needs automatic optimization; under manual "
                "optimization give the strategy max_pass_sizes=None and a max_micro_batch_size "
                "that fits instead"
            )
        chunks = split_batch(args[0], passes)
        if self.dynamic_batch:
            for size, chunk in zip(passes, chunks, strict=True):
                mark_batch_dynamic(chunk, size)
        # Lightning divides the returned loss by its accumulation; the earlier passes' too
        accumulate = module.trainer.accumulate_grad_batches if module is not None else 1
        # Lightning zeroes the gradients between training_step and backward: the earlier
        # passes' gradients are set aside, and added back in the last pass's backward
        params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
        before = [p.grad for p in params]
        for param in params:
            param.grad = None
        with self.passes_unsynced(), _quiet(module):
            for size, chunk in zip(passes[:-1], chunks[:-1], strict=True):
                self._pass_size = size
                loss = loss_of(super().training_step(chunk, *args[1:], **kwargs))  # type: ignore[misc]
                if loss is not None:
                    self.backward(loss / accumulate if accumulate > 1 else loss, None)
        self._set_aside = [(p, p.grad) for p in params if p.grad is not None]
        for param, grad in zip(params, before, strict=True):
            param.grad = grad
        self._pass_size = passes[-1]
        return super().training_step(chunks[-1], *args[1:], **kwargs)  # type: ignore[misc]

    def _weighted_log(self, log: Any, mine: int) -> Any:
        """``module.log`` for one training step: the loader's batch size becomes the rank's."""
        even = self.even_batch_sizes()

        def weighted(*args: Any, **kwargs: Any) -> Any:
            given = kwargs.get("batch_size")
            if given is not None and given in even and given != mine:
                kwargs["batch_size"] = mine
                if not self._told_batch_size:
                    self._told_batch_size = True
                    rank_zero_info(
                        f"lightning-rex: self.log(..., batch_size={given}) in training_step is the "
                        "DataLoader's batch size, but each rank trains its own share of the global "
                        "batch: epoch values are weighted by each rank's true micro-batch instead "
                        "(any other batch_size is kept as given)"
                    )
            return log(*args, **kwargs)

        return weighted

    def current_loss_scale(self) -> float:
        """The factor this rank's loss is multiplied by for the current batch.

        Returns:
            ``N * b_r / B`` for mean-reduced losses (``N * s / B`` for an accumulation pass of
            ``s`` samples), ``N`` for sum-reduced ones, ``1.0`` outside training.
        """
        if self._step_sizes is None:
            return 1.0
        if self._pass_size is not None:
            return pass_loss_scale(
                self._step_sizes, self.global_rank, self._pass_size, self.loss_reduction
            )
        return loss_scale(self._step_sizes, self.global_rank, self.loss_reduction)

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        """Scale the loss so DDP's averaging all-reduce gives the exact global gradient.

        Args:
            closure_loss: The loss of this rank's micro-batch.
            optimizer: The optimizer, passed on.
            *args: Passed on to the precision plugin's backward.
            **kwargs: Passed on likewise.

        Returns:
            What the parent strategy's ``backward`` returns.
        """
        scale = self.current_loss_scale()
        if scale != 1.0:
            closure_loss = closure_loss * scale
        aside, self._set_aside = self._set_aside, []
        for param, grad in aside:  # the earlier passes' gradients, before the synchronising one
            param.grad = grad if param.grad is None else param.grad.add_(grad)
        return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]

    def reduce(
        self,
        tensor: Tensor | Any,
        group: Any | None = None,
        reduce_op: Any = "mean",
    ) -> Tensor | Any:
        """Reduce across ranks; step-level means logged in training_step are plan-weighted.

        ``self.log(name, v, sync_dist=True)`` inside ``training_step`` reaches here with
        ``reduce_op="mean"``; DDP would average ranks without weights, so each rank's value is
        weighted by its share ``b_r / B`` of the global batch. Epoch-level values are already
        weighted by Lightning's batch-size bookkeeping and are reduced as under DDP.

        Args:
            tensor: The value to reduce.
            group: The process group (default: world).
            reduce_op: The reduction, as for DDP.

        Returns:
            The reduced value.
        """
        if (
            self._in_training_step
            and self._step_sizes is not None
            and isinstance(tensor, Tensor)
            and isinstance(reduce_op, str)
            and reduce_op.lower() in _MEAN_OPS
            and torch.is_floating_point(tensor)
        ):
            share = self._step_sizes[self.global_rank] / sum(self._step_sizes)
            tensor = tensor * (len(self._step_sizes) * share)
        return super().reduce(tensor, group=group, reduce_op=reduce_op)  # type: ignore[misc]


class WeightedDDP(Weighted, DDPStrategy):
    """DDP with each rank's loss and logged step values weighted by its share of the batch.

    Accumulation passes pause DDP's all-reduce with ``no_sync``.

    Args:
        *args: :class:`~lightning.pytorch.strategies.DDPStrategy`'s arguments.
        **kwargs: Likewise.
    """

    @contextmanager
    def passes_unsynced(self) -> Iterator[None]:
        """Pause DDP's gradient all-reduce (``no_sync``) for the passes before the last.

        Yields:
            Nothing.
        """
        from torch.nn.parallel import DistributedDataParallel

        model = self.model
        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield
