"""``RexStrategy``: DDP with uneven per-rank micro-batches and an exact weighted all-reduce.

The user's script does not change. Its train DataLoader keeps its per-rank ``batch_size``;
the global batch is ``B = batch_size x world_size`` exactly as under ``ddp``, and REX splits
that same ``B`` unevenly according to a *plan*. The strategy swaps an
:class:`~lightning_rex.data.sampler.UnevenBatchSampler` into the train loader by itself, scales each
rank's loss so that DDP's averaging all-reduce yields the exact global-batch gradient (see
:mod:`lightning_rex.data.weighting`), and weights ``self.log(..., sync_dist=True)`` step values by
the plan. Validation, test and predict loaders behave as under ``ddp``. What it shares with
:class:`~lightning_rex.RexFSDPStrategy` lives in :mod:`~lightning_rex.lightning.uneven`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_warn

from lightning_rex.core.checks import check_keywords
from lightning_rex.data.weighting import LossReduction
from lightning_rex.lightning.names import START_METHODS, description
from lightning_rex.lightning.uneven import UnevenPlans
from lightning_rex.lightning.weighted import WeightedDDP

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.fabric.strategies.registry import _StrategyRegistry

__all__ = ["RexStrategy"]


def _valid_keywords() -> list[str]:
    """RexStrategy's own keywords, DDPStrategy's, and DistributedDataParallel's (passed on)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    names = [*inspect.signature(RexStrategy.__init__).parameters]
    names += [*inspect.signature(DDPStrategy.__init__).parameters]
    names += [*inspect.signature(DistributedDataParallel.__init__).parameters]
    return [n for n in names if n not in ("self", "args", "kwargs", "module")]


class RexStrategy(UnevenPlans, WeightedDDP):
    """Distributed data parallel with per-rank micro-batch sizes and exact gradient weighting.

    Registered with Lightning as ``"rex"`` (``start_method="popen"``), ``"rex_spawn"`` and
    ``"rex_fork"`` on ``import lightning_rex``. From LightningCLI the class path
    ``lightning_rex.RexStrategy`` works without that import when it comes with arguments
    (YAML ``class_path`` and ``init_args``, or ``--trainer.strategy.<arg>=...``). It takes
    :class:`DDPStrategy`'s arguments unchanged, positional ones included; its own are
    keyword-only.

    Args:
        *args: :class:`~lightning.pytorch.strategies.DDPStrategy`'s positional arguments
            (``accelerator``, ``parallel_devices``, ...), passed through.
        micro_batch_sizes: The initial plan as per-rank sizes, one per rank (global rank
            order), summing to ``batch_size x world_size``. Mutually exclusive with
            ``batch_fractions``. Default (both None): the even plan.
        batch_fractions: The initial plan as per-rank fractions of the global batch, summing
            to 1 within 1e-6; rounded to sizes by largest remainder, ties to the lowest rank.
        min_micro_batch_size: The smallest micro-batch any plan may give a rank. None (the
            default): 1, or 2 when the module holds a BatchNorm layer (a 1-sample batch
            raises in training mode); the choice is logged.
        max_micro_batch_size: The largest micro-batch any plan may give a rank (None: no
            bound beyond the global batch).
        max_pass_sizes: The largest micro-batch each rank trains in one forward and
            backward: one int for every rank, or one entry per rank (None entries for no
            cap). A plan that gives a rank more runs there as accumulation passes (DDP's
            ``no_sync`` on all but the last), still one optimizer step per global step and
            weighted exactly; the planner prices the extra passes. None (the default): no
            declared cap; on CUDA the callback measures each rank's memory per sample and
            caps its pass by the memory it has.
        loss_reduction: What ``training_step``'s loss is over its micro-batch: ``"mean"`` (the
            default) or ``"sum"``.
        adaptive: Let a :class:`~lightning_rex.RexCallback` change the plan at run time (the
            default). If no ``RexCallback`` is among the Trainer's callbacks, one with default
            arguments is attached, ahead of the checkpoint callbacks. ``adaptive=False`` keeps
            the initial plan fixed (an explicit ``RexCallback`` then only monitors).
        dynamic_batch: Mark each training batch's first dimension dynamic for
            ``torch.compile`` (the default), so that a plan change, which gives a rank a new
            micro-batch size, does not recompile a compiled model once per size.
        **kwargs: Passed through to :class:`~lightning.pytorch.strategies.DDPStrategy`
            (``process_group_backend``, ``timeout``, ``find_unused_parameters``,
            ``ddp_comm_hook``, ``start_method``, ...). ``model_averaging_period`` is rejected:
            it averages parameters without weights.

    Raises:
        ValueError: For a bad configuration, naming the argument and the allowed values.
    """

    strategy_name = "rex"

    def __init__(
        self,
        *args: Any,
        micro_batch_sizes: Sequence[int] | None = None,
        batch_fractions: Sequence[float] | None = None,
        min_micro_batch_size: int | None = None,
        max_micro_batch_size: int | None = None,
        max_pass_sizes: int | Sequence[int | None] | None = None,
        loss_reduction: LossReduction = "mean",
        adaptive: bool = True,
        dynamic_batch: bool = True,
        **kwargs: Any,
    ) -> None:
        check_keywords(
            "RexStrategy",
            kwargs,
            _valid_keywords(),
            "its own arguments, DDPStrategy's and DistributedDataParallel's (see its docstring;"
            " to shard the model, use strategy='rex_fsdp', lightning_rex.RexFSDPStrategy)",
        )
        if kwargs.get("model_averaging_period") is not None:
            raise ValueError(
                "model_averaging_period is not supported by RexStrategy: it averages parameters "
                "across ranks without weights, which breaks the exact weighting of uneven "
                "micro-batches. Allowed value: None."
            )
        super().__init__(
            *args,
            micro_batch_sizes=micro_batch_sizes,
            batch_fractions=batch_fractions,
            min_micro_batch_size=min_micro_batch_size,
            max_micro_batch_size=max_micro_batch_size,
            max_pass_sizes=max_pass_sizes,
            loss_reduction=loss_reduction,
            adaptive=adaptive,
            dynamic_batch=dynamic_batch,
            **kwargs,
        )

    # ------------------------------------------------------------------ registration
    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``rex``, ``rex_spawn`` and ``rex_fork``; calling it again is a no-op.

        The class path ``lightning_rex.rexstrategy`` is registered too (see
        :mod:`~lightning_rex.lightning.names`). ``import lightning_rex`` (or the package's
        startup hook) does this already, with the same names.

        Args:
            strategy_registry: Lightning's ``StrategyRegistry``.
        """
        for name, start_method in START_METHODS.items():
            if name not in strategy_registry:
                strategy_registry.register(
                    name, cls, description=description(start_method), start_method=start_method
                )

    def setup(self, trainer: pl.Trainer) -> None:
        """Check what REX cannot support, then set up DDP.

        Args:
            trainer: The Trainer.

        Raises:
            ValueError: For ``model_averaging_period``.
        """
        if self.world_size == 1:
            rank_zero_warn(
                "lightning-rex: RexStrategy on one device has nothing to balance: every step "
                "trains the whole batch on it, as DDP on one device would. Use devices=N (N > 1) "
                "for uneven micro-batches."
            )
        if getattr(self, "_model_averaging_period", None) is not None:
            raise ValueError(
                "model_averaging_period is not supported by RexStrategy: it averages parameters "
                "across ranks without weights, which breaks the exact weighting of uneven "
                "micro-batches. Allowed value: None."
            )
        super().setup(trainer)
