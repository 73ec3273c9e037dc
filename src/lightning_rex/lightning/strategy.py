"""``RexStrategy``: DDP with uneven per-rank micro-batches and an exact weighted all-reduce.

The user's script does not change. Its train DataLoader keeps its per-rank ``batch_size``;
the global batch is ``B = batch_size x world_size`` exactly as under ``ddp``, and REX splits
that same ``B`` unevenly according to a *plan*. The strategy swaps an
:class:`~lightning_rex.data.sampler.UnevenBatchSampler` into the train loader by itself, scales each
rank's loss so that DDP's averaging all-reduce yields the exact global-batch gradient (see
:mod:`lightning_rex.data.weighting`), and weights ``self.log(..., sync_dist=True)`` step values by
the plan. Validation, test and predict loaders behave as under ``ddp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage
from torch import Tensor
from torch.optim import Optimizer

from lightning_rex.core.plan import Plan, even_plan, round_fractions, validate_plan
from lightning_rex.data.loader import RexDataLoader, build_rex_loader
from lightning_rex.data.weighting import LOSS_REDUCTIONS, LossReduction, loss_scale

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.fabric.strategies.registry import _StrategyRegistry
    from lightning.pytorch.utilities.types import STEP_OUTPUT

__all__ = ["RexStrategy"]

_MEAN_OPS = ("mean", "avg")


class RexStrategy(DDPStrategy):
    """Distributed data parallel with per-rank micro-batch sizes and exact gradient weighting.

    Registered with Lightning as ``"rex"`` (``start_method="popen"``), ``"rex_spawn"`` and
    ``"rex_fork"`` on ``import lightning_rex``. The class path ``lightning_rex.RexStrategy``
    works from LightningCLI without that import.

    Args:
        micro_batch_sizes: The initial plan as per-rank sizes, one per rank (global rank
            order), summing to ``batch_size x world_size``. Mutually exclusive with
            ``batch_fractions``. Default (both None): the even plan.
        batch_fractions: The initial plan as per-rank fractions of the global batch, summing
            to 1 within 1e-6; rounded to sizes by largest remainder, ties to the lowest rank.
        min_micro_batch_size: The smallest micro-batch any rank may get (default 1;
            BatchNorm models want >= 2).
        loss_reduction: What ``training_step``'s loss is over its micro-batch: ``"mean"`` (the
            default) or ``"sum"``.
        adaptive: Let a :class:`~lightning_rex.RexCallback` change the plan at run time (the
            default). If no ``RexCallback`` is among the Trainer's callbacks, one with default
            arguments is attached. ``adaptive=False`` keeps the initial plan fixed (an
            explicit ``RexCallback`` then only monitors).
        **kwargs: Passed through to :class:`~lightning.pytorch.strategies.DDPStrategy`
            (``process_group_backend``, ``find_unused_parameters``, ``ddp_comm_hook``,
            ``start_method``, ...). ``model_averaging_period`` is rejected: it averages
            parameters without weights.

    Raises:
        ValueError: For a bad configuration, naming the argument and the allowed values.
    """

    strategy_name = "rex"

    def __init__(
        self,
        micro_batch_sizes: Sequence[int] | None = None,
        batch_fractions: Sequence[float] | None = None,
        min_micro_batch_size: int = 1,
        loss_reduction: LossReduction = "mean",
        adaptive: bool = True,
        **kwargs: Any,
    ) -> None:
        if micro_batch_sizes is not None and batch_fractions is not None:
            raise ValueError(
                "give either micro_batch_sizes or batch_fractions, not both (got "
                f"micro_batch_sizes={list(micro_batch_sizes)}, "
                f"batch_fractions={list(batch_fractions)})"
            )
        if not isinstance(min_micro_batch_size, int) or min_micro_batch_size < 1:
            raise ValueError(
                f"min_micro_batch_size must be an int >= 1, got {min_micro_batch_size!r}"
            )
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}"
            )
        if kwargs.get("model_averaging_period") is not None:
            raise ValueError(
                "model_averaging_period is not supported by RexStrategy: it averages parameters "
                "across ranks without weights, which breaks the exact weighting of uneven "
                "micro-batches. Allowed value: None."
            )
        if micro_batch_sizes is not None:
            bad = [b for b in micro_batch_sizes if int(b) != b or b < min_micro_batch_size]
            if bad:
                raise ValueError(
                    f"micro_batch_sizes must be integers >= min_micro_batch_size="
                    f"{min_micro_batch_size}, got {list(micro_batch_sizes)}"
                )
        if batch_fractions is not None:
            # checks sign and sum now; sizes are rounded once B is known
            round_fractions(
                batch_fractions,
                10 * len(batch_fractions) * min_micro_batch_size,
                min_micro_batch_size,
            )
        super().__init__(**kwargs)
        self.micro_batch_sizes = None if micro_batch_sizes is None else tuple(micro_batch_sizes)
        self.batch_fractions = None if batch_fractions is None else tuple(batch_fractions)
        self.min_micro_batch_size = min_micro_batch_size
        self.loss_reduction: LossReduction = loss_reduction
        self.adaptive = bool(adaptive)
        self._loader: RexDataLoader | None = None
        self._step_sizes: Plan | None = None
        self._in_training_step = False

    # ------------------------------------------------------------------ registration
    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``rex``, ``rex_spawn`` and ``rex_fork``; calling it again is a no-op.

        The class path is registered too (Lightning lowercases strategy names), so that a bare
        ``--trainer.strategy=lightning_rex.RexStrategy``, which jsonargparse passes on as a
        string, resolves once ``lightning_rex`` is imported (for example by a
        ``--trainer.callbacks+=lightning_rex.RexCallback`` on the same command line).

        Args:
            strategy_registry: Lightning's ``StrategyRegistry``.
        """
        names = (
            ("rex", "popen"),
            ("rex_spawn", "spawn"),
            ("rex_fork", "fork"),
            ("lightning_rex.rexstrategy", "popen"),
        )
        for name, start_method in names:
            if name in strategy_registry:
                continue
            strategy_registry.register(
                name,
                cls,
                description=f"REX uneven micro-batches over DDP with start_method '{start_method}'",
                start_method=start_method,
            )

    # ------------------------------------------------------------------ configuration checks
    @property
    def _expected_world_size(self) -> int:
        return self.num_nodes * self.num_processes

    def _configure_launcher(self) -> None:
        # runs when the Trainer is built, before any process group exists
        n = self._expected_world_size
        if self.micro_batch_sizes is not None and n > 0 and len(self.micro_batch_sizes) != n:
            raise ValueError(
                f"micro_batch_sizes must have one entry per rank: the world size is {n}, got "
                f"{len(self.micro_batch_sizes)} entries ({list(self.micro_batch_sizes)})"
            )
        if self.batch_fractions is not None and n > 0 and len(self.batch_fractions) != n:
            raise ValueError(
                f"batch_fractions must have one entry per rank: the world size is {n}, got "
                f"{len(self.batch_fractions)} entries ({list(self.batch_fractions)})"
            )
        super()._configure_launcher()

    def setup_environment(self) -> None:
        """Attach a default :class:`~lightning_rex.RexCallback` when adaptive and none is given.

        This runs before callbacks are set up and restored from a checkpoint, so the attached
        callback takes part in both.
        """
        module = self.lightning_module
        trainer = module._trainer if module is not None else None
        if self.adaptive and trainer is not None:
            from lightning_rex.lightning.callback import RexCallback

            callbacks = trainer.callbacks  # type: ignore[attr-defined]
            if not any(isinstance(c, RexCallback) for c in callbacks):
                callbacks.append(RexCallback())
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        """Check what REX cannot support, then set up DDP.

        Args:
            trainer: The Trainer.
        """
        module = self.lightning_module
        if module is not None and not module.automatic_optimization:
            raise ValueError(
                "RexStrategy supports automatic optimization only (automatic_optimization=True): "
                "with manual optimization REX cannot weight the uneven micro-batches' gradients."
            )
        super().setup(trainer)

    def initial_plan(self, global_batch: int) -> Plan:
        """The plan to start from for a global batch, from the init arguments.

        Args:
            global_batch: B, the loader's ``batch_size`` times the world size.

        Returns:
            The validated initial plan.
        """
        n = self.world_size
        if self.micro_batch_sizes is not None:
            return validate_plan(self.micro_batch_sizes, global_batch, n, self.min_micro_batch_size)
        if self.batch_fractions is not None:
            if len(self.batch_fractions) != n:
                raise ValueError(
                    f"batch_fractions must have one entry per rank: expected {n}, got "
                    f"{len(self.batch_fractions)}"
                )
            return round_fractions(self.batch_fractions, global_batch, self.min_micro_batch_size)
        plan = even_plan(global_batch, n)
        return validate_plan(plan, global_batch, n, self.min_micro_batch_size, name="the even plan")

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: object) -> object:
        """Swap the uneven batch sampler into the train loader; leave other loaders alone.

        Args:
            dataloader: The loader after Lightning injected its DistributedSampler.

        Returns:
            A :class:`~lightning_rex.data.loader.RexDataLoader` for training, else ``dataloader``.
        """
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return dataloader
        accumulate = trainer.accumulate_grad_batches
        self._loader = build_rex_loader(
            dataloader,
            world_size=self.world_size,
            rank=self.global_rank,
            plan_for=self.initial_plan,
            accumulate_grad_batches=accumulate,
            step_source=lambda: trainer.global_step,
            min_micro_batch_size=self.min_micro_batch_size,
            use_distributed_sampler=trainer._accelerator_connector.use_distributed_sampler,
        )
        return self._loader

    @property
    def train_loader(self) -> RexDataLoader | None:
        """The processed train loader, or None before it is set up."""
        return self._loader

    @property
    def plan(self) -> Plan | None:
        """The plan in force at the current optimizer step; None before the train loader."""
        if self._loader is None:
            return None
        return self._loader.batch_sampler.plan_at(self._current_step())

    @property
    def global_batch(self) -> int | None:
        """B, the global batch per micro-step; None before the train loader is set up."""
        return None if self._loader is None else self._loader.batch_sampler.global_batch

    def _current_step(self) -> int:
        module = self.lightning_module
        if module is None or module._trainer is None:
            return 0
        return int(module.trainer.global_step)

    def set_plan(self, sizes: Sequence[int], at_step: int | None = None) -> int:
        """Schedule a new plan on every rank; all ranks must call this together.

        Rank 0's arguments are broadcast, so ranks cannot diverge. The plan takes effect at
        the first optimizer-step boundary at or after ``at_step`` whose batches no rank has
        fetched yet (DataLoader worker prefetch included); a gradient-accumulation window
        always uses one plan.

        Args:
            sizes: The new per-rank sizes, summing to the global batch.
            at_step: The optimizer step (``trainer.global_step``) to switch at; None means as
                soon as possible.

        Returns:
            The optimizer step from which the plan is in force.

        Raises:
            RuntimeError: Before the train loader is set up.
            ValueError: If the plan is invalid for this run.
        """
        if self._loader is None:
            raise RuntimeError("set_plan needs the train loader: call it once fit has started")
        sampler = self._loader.batch_sampler
        payload = self.broadcast(
            (tuple(int(b) for b in sizes), None if at_step is None else int(at_step)), src=0
        )
        plan = validate_plan(
            payload[0],
            sampler.global_batch,
            sampler.world_size,
            self.min_micro_batch_size,
            name="sizes",
        )
        wanted = self._current_step() if payload[1] is None else payload[1]
        fetched = sampler.last_fetched_step()
        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([fetched], dtype=torch.int64, device=self._collective_device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            fetched = int(t.item())
        effective = max(wanted, fetched + 1)
        sampler.schedule_plan(plan, effective)
        return effective

    def _collective_device(self) -> torch.device:
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
        return self.root_device if backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ weighting
    def current_batch_sizes(self) -> Plan | None:
        """The per-rank sizes of the batch being trained now (None outside training).

        Returns:
            The sizes of the current batch of the epoch: the plan, or the final partial split.
        """
        if self._loader is None or self.lightning_module is None:
            return None
        batch_idx = self.lightning_module.trainer.fit_loop.epoch_loop.batch_idx
        return self._loader.batch_sampler.sizes_for_batch(batch_idx)

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        """Run the user's training_step, remembering this batch's per-rank sizes.

        Args:
            *args: Forwarded to the LightningModule's ``training_step``.
            **kwargs: Forwarded likewise.

        Returns:
            The LightningModule's output.
        """
        self._step_sizes = self.current_batch_sizes()
        self._in_training_step = True
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self._in_training_step = False

    def current_loss_scale(self) -> float:
        """The factor this rank's loss is multiplied by for the current batch.

        Returns:
            ``N * b_r / B`` for mean-reduced losses, ``N`` for sum-reduced ones, ``1.0``
            outside training.
        """
        if self._step_sizes is None:
            return 1.0
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
        return super().backward(closure_loss, optimizer, *args, **kwargs)

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
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def on_train_start(self) -> None:
        """Reject several train loaders, which one plan cannot split consistently."""
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        combined = trainer.fit_loop._combined_loader if trainer is not None else None
        if combined is not None and len(combined.flattened) > 1:
            raise ValueError(
                "RexStrategy supports exactly one train dataloader, got "
                f"{len(combined.flattened)}; combine the datasets into one (for example with "
                "torch.utils.data.ConcatDataset)"
            )
        super().on_train_start()

    def teardown(self) -> None:
        """Tear DDP down; the train loader is kept so ``plan`` stays readable after fit."""
        self._step_sizes = None
        super().teardown()
