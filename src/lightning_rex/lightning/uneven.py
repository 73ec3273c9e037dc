"""What the DDP and FSDP strategies share: the uneven train loader, the plan, the bounds.

:class:`UnevenPlans` is a strategy mixin. It holds REX's own arguments (the initial plan,
the size bounds, the loss reduction, adaptivity, the pass caps), swaps an
:class:`~lightning_rex.data.sampler.UnevenBatchSampler` into the train loader, keeps the
run's plan schedule readable (``plan``, ``plan_schedule``, ``set_plan``) and tells the
weighting (:class:`~lightning_rex.lightning.weighted.Weighted`) each batch's per-rank sizes.
:class:`~lightning_rex.RexStrategy` puts it on DDP, :class:`~lightning_rex.RexFSDPStrategy`
on FSDP2; neither copies any of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_rex.core.checks import is_integer
from lightning_rex.core.plans.plan import Plan, even_plan, round_fractions
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.data.loader import RexDataLoader, build_rex_loader
from lightning_rex.data.weighting import LOSS_REDUCTIONS, LossReduction
from lightning_rex.driver.scheduling import agree
from lightning_rex.lightning.callback import attach_default_callback, exceptions_handled
from lightning_rex.lightning.collectives import driver_collectives
from lightning_rex.lightning.interfaces import ReportsHandledExceptions
from lightning_rex.lightning.pass_caps import PassCaps
from lightning_rex.lightning.plan_target import TrainSampler
from lightning_rex.lightning.progress import (
    batches_in_flight,
    count_stopped_epoch_as_unfinished,
    loader_state_to_restore,
    restored_epoch_ended,
    resume_after_epoch_end,
    set_epoch_length,
    steps_done,
)
from lightning_rex.lightning.weighted import Weighted

__all__ = ["UnevenPlans"]


class UnevenPlans(PassCaps, Weighted, ReportsHandledExceptions):
    """A strategy mixin: REX's uneven train loader, plan schedule and size bounds.

    Args:
        *args: The Lightning strategy's positional arguments, passed through.
        micro_batch_sizes: As in :class:`~lightning_rex.RexStrategy`.
        batch_fractions: Likewise.
        min_micro_batch_size: Likewise.
        max_micro_batch_size: Likewise.
        max_pass_sizes: Likewise.
        loss_reduction: Likewise.
        adaptive: Likewise.
        dynamic_batch: Likewise.
        **kwargs: The Lightning strategy's keyword arguments, passed through.

    Raises:
        ValueError: For a bad configuration, naming the argument and the allowed values.
    """

    world_size: int
    num_nodes: int
    num_processes: int
    root_device: Any

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
        if micro_batch_sizes is not None and batch_fractions is not None:
            raise ValueError(
                "give either micro_batch_sizes or batch_fractions, not both (got "
                f"micro_batch_sizes={list(micro_batch_sizes)}, "
                f"batch_fractions={list(batch_fractions)})"
            )
        # checks the bounds' own rules and names the argument
        bounds = SizeBounds(
            1 if min_micro_batch_size is None else min_micro_batch_size, max_micro_batch_size
        )
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}"
            )
        if micro_batch_sizes is not None:
            bad = [b for b in micro_batch_sizes if not is_integer(b)]
            if bad or not micro_batch_sizes:
                raise ValueError(
                    f"micro_batch_sizes must be a non-empty list of integers, got "
                    f"{list(micro_batch_sizes)}"
                )
            bounds.check(micro_batch_sizes, sum(micro_batch_sizes), "micro_batch_sizes")
        if batch_fractions is not None:
            # checks sign and sum now; sizes are rounded once B is known
            round_fractions(
                batch_fractions, 10 * len(batch_fractions) * bounds.min_size, bounds.min_size
            )
        super().__init__(*args, max_pass_sizes=max_pass_sizes, **kwargs)
        self.micro_batch_sizes = None if micro_batch_sizes is None else tuple(micro_batch_sizes)
        self.batch_fractions = None if batch_fractions is None else tuple(batch_fractions)
        self.min_micro_batch_size = min_micro_batch_size
        self.max_micro_batch_size = max_micro_batch_size
        self.loss_reduction: LossReduction = loss_reduction
        self.adaptive = bool(adaptive)
        self.dynamic_batch = bool(dynamic_batch)
        self._loader: RexDataLoader | None = None
        self._loader_batch_size: int | None = None  # the user's DataLoader's batch_size
        #: ``(min, max)`` global batches the train sampler's plans may sum to; set by
        #: ``RexCallback(global_batch=GlobalBatchScaling(...))`` before the loader is built
        self.batch_range: tuple[int, int] | None = None
        # the restore counted a max_steps stop's epoch as unfinished (see on_train_start)
        self._stopped_mid_epoch = False

    # ------------------------------------------------------------------ configuration checks
    @property
    def _expected_world_size(self) -> int:
        return self.num_nodes * self.num_processes

    def _configure_launcher(self) -> None:
        # runs when the Trainer is built, before any process group exists
        if self._expected_world_size > 0:
            self._check_per_rank(self._expected_world_size)
        super()._configure_launcher()  # type: ignore[misc]

    def _check_per_rank(self, n: int) -> None:
        """The per-rank arguments have one entry per rank (the one check of their length)."""
        caps = self.max_pass_sizes
        for name, value in (
            ("micro_batch_sizes", self.micro_batch_sizes),
            ("batch_fractions", self.batch_fractions),
            ("max_pass_sizes", None if caps is None or isinstance(caps, int) else caps),
        ):
            if value is not None and len(value) != n:
                raise ValueError(
                    f"{name} must have one entry per rank: the world size is {n}, got "
                    f"{len(value)} entries ({list(value)})"
                )

    def setup_environment(self) -> None:
        """Attach a default :class:`~lightning_rex.RexCallback` when adaptive and none is given.

        It runs before callbacks are set up and restored from a checkpoint, so the callback
        takes part in both (:func:`~lightning_rex.lightning.callback.attach_default_callback`).
        """
        trainer = self._trainer()
        if self.adaptive and trainer is not None:
            attach_default_callback(trainer.callbacks)
        super().setup_environment()  # type: ignore[misc]

    def _trainer(self) -> Any:
        module = self.lightning_module
        return module._trainer if module is not None else None

    # ------------------------------------------------------------------ bounds and plans
    @property
    def bounds(self) -> SizeBounds:
        """The size bounds every plan obeys (the minimum resolved once the module is known)."""
        return SizeBounds(self._min_size(), self.max_micro_batch_size)

    def _min_size(self) -> int:
        if self.min_micro_batch_size is not None:
            return self.min_micro_batch_size
        module = self.lightning_module
        if module is not None and any(isinstance(m, _BatchNorm) for m in module.modules()):
            return 2
        return 1

    def initial_plan(self, global_batch: int) -> Plan:
        """The plan to start from for a global batch, from the init arguments.

        Args:
            global_batch: B, the loader's ``batch_size`` times the world size.

        Returns:
            The validated initial plan.

        Raises:
            ValueError: Naming the argument, when the plan does not fit ``B``, the world size
                or the bounds.
        """
        world_size = self.world_size
        bounds = self.bounds
        bounds.check_feasible(global_batch, world_size)
        self._check_per_rank(world_size)
        if self.micro_batch_sizes is not None:
            return bounds.check(self.micro_batch_sizes, global_batch, "micro_batch_sizes")
        if self.batch_fractions is not None:
            plan = round_fractions(self.batch_fractions, global_batch, bounds.min_size)
            return bounds.check(plan, global_batch, "batch_fractions")
        return bounds.check(even_plan(global_batch, world_size), global_batch, "the even plan")

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: object) -> object:
        """Swap the uneven batch sampler into the train loader; leave other loaders alone.

        When resuming, the checkpoint's loader position is restored here at once, before
        Lightning sizes the epoch from ``len(loader)``: a position from another world size
        (or a resumed epoch's own grid) changes how many batches the epoch has left.

        Args:
            dataloader: The loader after Lightning injected its DistributedSampler.

        Returns:
            A :class:`~lightning_rex.data.loader.RexDataLoader` for training, else ``dataloader``.
        """
        trainer = self._trainer()
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return dataloader
        bounds = self.bounds
        if self.min_micro_batch_size is None and bounds.min_size > 1:
            rank_zero_info(
                "lightning-rex: the module has BatchNorm layers, so no rank gets a micro-batch "
                "below 2 samples (set RexStrategy(min_micro_batch_size=...) to choose)"
            )
        previous = self.plan_schedule
        # a loader rebuilt in this fit (reload_dataloaders_every_n_epochs) keeps the run's one
        # schedule, if it still fits the global batch
        keep = previous if previous is not None and self._same_batch(previous, dataloader) else None
        loader = build_rex_loader(
            dataloader,
            world_size=self.world_size,
            rank=self.global_rank,
            plan_for=self.initial_plan,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            step_source=lambda: steps_done(trainer),
            bounds=bounds,
            plans=keep,
            use_distributed_sampler=trainer._accelerator_connector.use_distributed_sampler,
            batch_range=self.batch_range,
        )
        if self._loader is not None and trainer.fit_loop._combined_loader is not None:
            # rebuilt in this fit (Lightning clears its loader when a fit attaches data): an
            # epoch restored as over stays so
            loader.batch_sampler.carry_restored_epoch(self._loader.batch_sampler)
        # a checkpoint taken inside a step leaves the batch in flight to the resumed run
        loader.in_flight = lambda: batches_in_flight(trainer)
        self._loader = loader
        batch_size = getattr(dataloader, "batch_size", None)
        self._loader_batch_size = None if batch_size is None else int(batch_size)
        saved = loader_state_to_restore(trainer)
        if saved is not None:
            # over when Lightning will not go on in it (under limit_train_batches an epoch
            # ends before the loader's)
            state, over = saved
            loader.load_state_dict(state, over=over or restored_epoch_ended(trainer))
            self._stopped_mid_epoch = count_stopped_epoch_as_unfinished(trainer)
        # every epoch is sized from the sampler, when Lightning moves it to the epoch (it
        # counted the batches once, for the epoch the fit starts in)
        loader.batch_sampler.on_epoch_set(lambda epoch: self.resize_epoch())
        return self._loader

    def resize_epoch(self) -> None:
        """Tell Lightning how many batches the train loader's epoch has now.

        Lightning counts an epoch's batches once, at the start of the fit, in four places
        (the fit loop's ``max_batches``, the combined loader's limits, the data fetcher's
        length, and ``val_check_batch`` for a fractional ``val_check_interval``) and ends
        every epoch, and validates, there. Global batch scaling changes the count: a new
        global batch re-cuts the rest of the epoch (see
        :func:`~lightning_rex.lightning.progress.set_epoch_length`), and so does a resume:
        the epoch a checkpoint is resumed in is cut at this run's global batch from the
        first sample not yet trained, and the epochs after it are whole again. It runs at
        every epoch's start (when Lightning moves the sampler to the epoch) and whenever a
        new global batch re-cuts the rest of an epoch.
        """
        trainer = self._trainer()
        if trainer is not None and self._loader is not None:
            set_epoch_length(trainer, len(self._loader))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Tell Lightning the epoch's length at its first batch, where the sampler held it.

        After a resume from a checkpoint made at an epoch's end, Lightning decides whether
        the restored epoch is over by its count of the epoch it has already moved the sampler
        past; the new epoch's count waits until here (see
        :meth:`~lightning_rex.data.sampler.UnevenBatchSampler.on_epoch_set`).

        Args:
            batch: The batch.
            batch_idx: Its index in the epoch.
        """
        if self._loader is not None and self._loader.batch_sampler.take_length_due():
            self.resize_epoch()
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]

    @property
    def train_loader(self) -> RexDataLoader | None:
        """The processed train loader, or None before it is set up."""
        return self._loader

    def _same_batch(self, schedule: PlanSchedule, dataloader: object) -> bool:
        batch_size = getattr(dataloader, "batch_size", None)
        return (
            batch_size is not None
            and schedule.world_size == self.world_size
            and schedule.global_batch == int(batch_size) * self.world_size
        )

    @property
    def plan_schedule(self) -> PlanSchedule | None:
        """The run's plan schedule, held by the train sampler (None before it exists)."""
        return None if self._loader is None else self._loader.batch_sampler.plan_schedule

    @property
    def plan_target(self) -> TrainSampler | None:
        """The window driver's plan target: whichever train sampler this strategy holds now."""
        return (
            None if self._loader is None else TrainSampler(lambda: self._loader, self.resize_epoch)
        )

    @property
    def plan(self) -> Plan | None:
        """The plan in force at the current step; None before the train loader.

        After a fit has ended, the plan its last step trained with (a decision exchanged at
        the last step schedules a plan for a step that never ran; ``plan_schedule`` has it).
        """
        if self._loader is None:
            return None
        step = self._current_step()
        module = self.lightning_module
        if module is not None and module._trainer is not None and module.trainer.state.stopped:
            step = max(0, step - 1)
        return self._loader.batch_sampler.plan_at(step)

    @property
    def global_batch(self) -> int | None:
        """B, the global batch per micro-step; None before the train loader is set up."""
        return None if self._loader is None else self._loader.batch_sampler.global_batch

    def _current_step(self) -> int:
        module = self.lightning_module
        if module is None or module._trainer is None:
            return 0
        return steps_done(module.trainer)

    def set_plan(self, sizes: Sequence[int], at_step: int | None = None) -> int:
        """Schedule a new plan on every rank; all ranks must call this together.

        Rank 0's arguments are broadcast, so ranks cannot diverge. The plan takes effect at
        the first step boundary at or after ``at_step`` whose batches no rank has fetched
        yet (DataLoader worker prefetch included); a gradient-accumulation window always
        uses one plan. A :class:`~lightning_rex.RexCallback` keeps monitoring: it takes the
        new plan as the one in force.

        Args:
            sizes: The new per-rank sizes, summing to the global batch, within
                ``min_micro_batch_size`` and ``max_micro_batch_size``.
            at_step: The step to switch at (``trainer.global_step`` under automatic
                optimization; batches under manual optimization); None means as soon as
                possible.

        Returns:
            The step from which the plan is in force.

        Raises:
            RuntimeError: Before the train loader is set up.
            ValueError: If the plan is invalid for this run (on every rank alike).
        """
        target = self.plan_target
        if target is None:
            raise RuntimeError("set_plan needs the train loader: call it once fit has started")
        wanted = self._current_step() if at_step is None else int(at_step)
        # rank 0's plan and step, at the first step no rank has fetched: the driver's rule
        plan, step = agree(driver_collectives(self.root_device), target, sizes, wanted)
        sched = target.plan_schedule
        if len(plan) != sched.world_size:
            raise ValueError(
                f"sizes must have one entry per rank: expected {sched.world_size} entries, got "
                f"{len(plan)} ({list(plan)})"
            )
        sched.bounds.check(plan, sched.global_batch)  # set_plan keeps the global batch
        target.schedule_plan(plan, step)
        return step

    # ------------------------------------------------------------------ weighting
    def even_batch_sizes(self) -> tuple[int, ...]:
        """The train DataLoader's ``batch_size`` and ``B / N`` now: what DDP's ranks each get.

        Returns:
            The sizes; empty before the train loader is set up.
        """
        if self._loader is None or self._loader_batch_size is None:
            return ()
        now = self._loader.batch_sampler.global_batch // self.world_size
        return tuple(sorted({self._loader_batch_size, now}))

    def current_batch_sizes(self) -> Plan | None:
        """The per-rank sizes of the batch being trained now (None outside training).

        Returns:
            The sizes of the current batch of the epoch: the plan, or the final partial split.
        """
        if self._loader is None or self.lightning_module is None:
            return None
        batch_idx = self.lightning_module.trainer.fit_loop.epoch_loop.batch_idx
        return self._loader.batch_sampler.sizes_for_batch(batch_idx)

    def on_train_start(self) -> None:
        """Reject several train loaders, which one plan cannot split consistently."""
        trainer = self._trainer()
        combined = trainer.fit_loop._combined_loader if trainer is not None else None
        if combined is not None and len(combined.flattened) > 1:
            raise ValueError(
                "RexStrategy supports exactly one train dataloader, got "
                f"{len(combined.flattened)}; combine the datasets into one (for example with "
                "torch.utils.data.ConcatDataset)"
            )
        if trainer is not None:
            resume_after_epoch_end(trainer, self._stopped_mid_epoch)
            self._stopped_mid_epoch = False
        loader = self._loader
        limit = trainer.limit_train_batches if trainer is not None else None
        if (
            loader is not None
            and trainer is not None
            and isinstance(limit, float)
            and limit == 1.0
            and not loader.batch_sampler.serves_next_epoch  # Lightning counts the last one
            and trainer.fit_loop.max_batches != len(loader)
        ):
            raise RuntimeError(
                f"lightning-rex: Lightning sized this epoch at {trainer.fit_loop.max_batches} "
                f"batches but the REX loader has {len(loader)}; training on would lose or repeat "
                "samples. Please report this with your Lightning version."
            )
        super().on_train_start()  # type: ignore[misc]

    def on_exception(self, exception: BaseException) -> None:
        """Every ``on_exception`` hook has run: the callback's watchdog stops watching them."""
        exceptions_handled(self._trainer())
        super().on_exception(exception)  # type: ignore[misc]

    def teardown(self) -> None:
        """Tear DDP down; the train loader is kept so ``plan`` stays readable after fit."""
        exceptions_handled(self._trainer())  # an exception's handlers ran, whatever stopped them
        self._step_sizes = None
        super().teardown()  # type: ignore[misc]
