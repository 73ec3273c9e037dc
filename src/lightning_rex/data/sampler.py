"""Uneven per-rank batches cut from one global permutation, with a plan schedule.

Every rank builds the same permutation of the dataset each epoch: the one DDP would use,
produced by :class:`torch.utils.data.DistributedSampler` with one replica (``randperm`` seeded
with ``seed + epoch``). Global batch ``k`` is ``perm[k*B:(k+1)*B]``; rank ``r`` takes the
contiguous sub-slice that the plan in force at batch ``k`` gives it. So under the even plan
every global batch holds the same samples as under DDP; only the final partial global batch
differs, where DDP pads with repeats and REX repeats nothing: it is split in proportion to the
plan, or dropped when it holds fewer samples than there are ranks (no rank may ever get an
empty micro-batch) or when ``drop_last=True``.

Plans are scheduled by step: a step is one optimizer-step boundary, ``accumulate_grad_batches``
batches (``trainer.global_step`` under automatic optimization; one batch under manual
optimization, however many optimizers it steps). Batch ``i`` of an epoch belongs to step
``epoch_start_step + i // accumulate_grad_batches``, so a gradient-accumulation window always
uses one plan, and a plan change never reaches a batch that was already fetched.

With global batch scaling the schedule's plans may sum to different global batches. The
epoch's grid is then piecewise: from the first batch of a step whose plan changes ``B``, the
rest of the epoch is cut into batches of the new ``B`` from the first sample the batches
before it did not take (:func:`~lightning_rex.data.grid.batch_grid`), as when a run resumes
on another world size. A
change is scheduled only at a step no rank has fetched, so every rank cuts the same grid, and
every sample of the epoch is still used once.

The sampler is the home of the run's :class:`~lightning_rex.core.plans.schedule.PlanSchedule` (the
window driver's :class:`~lightning_rex.driver.protocols.PlanTarget`): every plan it serves is
checked against the global batch and the size bounds, and so is every entry of a
checkpoint's state before the run resumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import Sampler

from lightning_rex.core.plans.plan import Plan, split_in_proportion
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.data.grid import Grid, batch_grid, grid_first_sample, grid_length
from lightning_rex.data.handoff import EpochHandoff
from lightning_rex.data.permutation import EpochPermutation, SizedStandIn
from lightning_rex.data.position import check_position

__all__ = ["UnevenBatchSampler"]


class UnevenBatchSampler(EpochHandoff, Sampler[list[int]]):
    """Yield this rank's micro-batches of a global permutation, split by a plan schedule.

    Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``; here that is the
    one-replica :class:`~torch.utils.data.DistributedSampler` that makes the permutation, so
    epochs reach the permutation without further wiring.

    Args:
        num_samples: The dataset length.
        global_batch: The global batch size B (``batch_size x world_size``).
        plan: The initial plan, one size per rank, summing to ``global_batch``.
        rank: This process's global rank.
        shuffle: Shuffle each epoch as DDP does; False keeps dataset order.
        seed: The permutation seed (Lightning uses ``PL_GLOBAL_SEED``).
        drop_last: Drop the final partial global batch.
        accumulate_grad_batches: Batches per optimizer step; plans change only between steps.
        step_source: Returns the step at which the next epoch's first batch is trained.
            Without it the sampler counts steps itself.
        bounds: The size bounds every plan obeys (``min_micro_batch_size``,
            ``max_micro_batch_size``).
        plans: An existing plan schedule to serve (a train loader rebuilt in the same run,
            with ``reload_dataloaders_every_n_epochs``, keeps the run's one schedule); None
            starts one from ``plan``.
        batch_range: ``(min, max)`` global batches a plan may sum to (global batch scaling);
            None keeps every plan at ``global_batch``.

    Raises:
        ValueError: Naming the argument, for a bad plan, rank or bounds that cannot hold
            the global batch.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        plan: Sequence[int],
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        accumulate_grad_batches: int = 1,
        step_source: Callable[[], int] | None = None,
        bounds: SizeBounds | None = None,
        plans: PlanSchedule | None = None,
        batch_range: tuple[int, int] | None = None,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches must be >= 1, got {accumulate_grad_batches}")
        self.world_size = len(plan)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        if plans is not None and (
            plans.global_batch != global_batch or plans.world_size != len(plan)
        ):
            raise ValueError(
                f"the plan schedule is for B={plans.global_batch} over {plans.world_size} "
                f"ranks, not B={global_batch} over {len(plan)}"
            )
        self._plans = (
            plans
            if plans is not None
            else PlanSchedule(plan, global_batch, bounds, batch_range=batch_range)
        )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.rank = rank
        self.drop_last = drop_last
        self.accumulate_grad_batches = accumulate_grad_batches
        self.step_source = step_source
        self.sampler: EpochPermutation = EpochPermutation(
            SizedStandIn(num_samples),  # type: ignore[arg-type]
            num_replicas=1,
            rank=0,
            shuffle=shuffle,
            seed=seed,
        )
        self._init_epoch_state()
        #: Whether a restored checkpoint's schedule continues (True), or its position was
        #: re-cut at this run's global batch (False); None when nothing was restored.
        self.continues: bool | None = None
        #: Why a restored checkpoint was re-cut, in terms of this run ("" otherwise).
        self.recut_reason = ""

    # ------------------------------------------------------------------ length
    def _grid(self) -> Grid:
        start, origin = self._epoch_start_step, (self._origin_batch, self._origin_sample)
        finished_here = self._finished is not None and self._finished[0] == self.epoch
        if self._resume_at is None and not finished_here and self._iter_epoch != self.epoch:
            # set_epoch moved on and the epoch has not started: its grid starts afresh at the
            # step it will start at (a global batch scheduled there changes its length). That
            # holds after an epoch restored as finished too: the next one starts after it,
            # not at the restored epoch's first step
            start = (
                self.step_source() if self.step_source is not None else self._next_epoch_start_step
            )
            origin = (0, 0)
        return batch_grid(
            self._plans,
            self.num_samples,
            origin,
            start,
            self.accumulate_grad_batches,
            self.world_size,
            self.drop_last,
            self.bounds.min_size,
        )

    def __len__(self) -> int:
        if self._finished is not None and self._finished[0] == self.epoch:
            return self._finished[1]
        return grid_length(
            self._grid(), self.num_samples, self.world_size, self.drop_last, self.bounds.min_size
        )

    # ------------------------------------------------------------------ plan schedule
    @property
    def plan_schedule(self) -> PlanSchedule:
        """The run's plan schedule (this sampler is its home)."""
        return self._plans

    @property
    def bounds(self) -> SizeBounds:
        """The size bounds every plan obeys."""
        return self._plans.bounds

    @property
    def schedule(self) -> list[tuple[int, Plan]]:
        """The plan schedule as ``(first step, plan)`` pairs, in step order."""
        return self._plans.entries

    def plan_at(self, step: int) -> Plan:
        """Return the plan in force at a step.

        Args:
            step: The step (an optimizer-step boundary; see the module docstring).

        Returns:
            The plan scheduled at or before ``step`` (the initial plan before the first entry).
        """
        return self._plans.plan_at(step)

    def step_of_batch(self, index: int) -> int:
        """The step batch ``index`` of the current epoch belongs to.

        Args:
            index: The batch index within the epoch (Lightning's ``batch_idx``).

        Returns:
            ``epoch_start_step + index // accumulate_grad_batches``.
        """
        return self._epoch_start_step + index // self.accumulate_grad_batches

    def last_fetched_step(self) -> int:
        """The last step any of whose batches this rank has already yielded.

        Returns:
            That step, or ``epoch_start_step - 1`` when nothing of the epoch was fetched.
        """
        if self._fetched == 0:
            return self._epoch_start_step - 1
        return self.step_of_batch(self._fetched - 1)

    def first_free_step(self) -> int:
        """The first step none of whose batches this rank has yielded yet.

        Returns:
            ``last_fetched_step() + 1``.
        """
        return self.last_fetched_step() + 1

    def resume_position(self) -> int:
        """The batch index the next iteration starts from (0 unless resuming mid-epoch).

        Returns:
            The number of batches of the epoch already consumed before a resume, else 0.
        """
        return self._resume_at or 0

    def schedule_plan(self, plan: Sequence[int], step: int) -> Plan:
        """Put ``plan`` in force from ``step`` on.

        The caller makes sure every rank calls this with the same arguments and that no
        rank has fetched a batch of ``step`` yet; this is checked locally too.

        Args:
            plan: The new per-rank sizes.
            step: The first step that uses them.

        Returns:
            The validated plan.

        Raises:
            ValueError: If the plan breaks the global batch or the bounds, or ``step`` has
                batches fetched already.
        """
        if step <= self.last_fetched_step():
            raise ValueError(
                f"cannot change the plan at step {step}: batches up to step "
                f"{self.last_fetched_step()} were already fetched"
            )
        return self._plans.set(plan, step)

    # ------------------------------------------------------------------ batches
    def sizes_for_batch(self, index: int) -> Plan:
        """The per-rank sizes of batch ``index`` of the current epoch.

        Args:
            index: The batch index within the epoch (Lightning's ``batch_idx``).

        Returns:
            The plan for a full global batch, or the proportional split of the final one.
        """
        plan = self.plan_at(self.step_of_batch(index))
        remaining = self.num_samples - self._first_sample(index)
        if remaining >= sum(plan):
            return plan
        return split_in_proportion(remaining, plan, self.bounds.min_size)

    def _first_sample(self, index: int) -> int:
        return grid_first_sample(self._grid(), index)

    def __iter__(self) -> Iterator[list[int]]:
        if self._finished is not None:
            epoch, done = self._finished
            self._finished = None
            if epoch == self.epoch and self._listener is None:
                return  # the restored epoch was over: nothing left of it
            if epoch == self.epoch:
                # Lightning iterates a loader resumed at an epoch's end once more, mostly for
                # the epoch after; a DataLoader with workers begins (fetches ahead) before
                # Lightning moves the sampler there. Move now, quietly: Lightning's move
                # comes later (if it goes on in the restored epoch instead, it is undone)
                self._quiet = (
                    epoch,
                    done,
                    self._fetched,
                    self._epoch_start_step,
                    self._next_epoch_start_step,
                )
                self.sampler.set_epoch(epoch + 1, notify=False)
                self._iter_epoch = self.epoch
                self._origin_batch = self._origin_sample = 0
                self._epoch_start_step = self._next_epoch_start_step
                yield from self._batches(0)
                return
        self._iter_epoch = self.epoch
        if self._resume_at is not None:
            start, self._resume_at = self._resume_at, None
            # the epoch start step was restored by load_state_dict
        else:
            start = 0
            self._origin_batch = self._origin_sample = 0
            self._epoch_start_step = (
                self.step_source() if self.step_source is not None else self._next_epoch_start_step
            )
        yield from self._batches(start)

    def _batches(self, start: int) -> Iterator[list[int]]:
        perm = list(iter(self.sampler))
        self._fetched = start
        batch_index = start
        # the length is read again at every batch: a change of the global batch scheduled
        # during the epoch re-cuts the rest of it
        while batch_index < (num_batches := len(self)):
            self._next_epoch_start_step = self._epoch_start_step + math.ceil(
                num_batches / self.accumulate_grad_batches
            )
            sizes = self.sizes_for_batch(batch_index)
            begin = self._first_sample(batch_index) + sum(sizes[: self.rank])
            self._fetched = batch_index + 1
            yield perm[begin : begin + sizes[self.rank]]
            batch_index += 1
        self._next_epoch_start_step = self._epoch_start_step + math.ceil(
            len(self) / self.accumulate_grad_batches
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, consumed: int) -> dict[str, Any]:
        """The sampler position and schedule, for a checkpoint.

        Args:
            consumed: Batches of the current epoch that were trained on (not merely fetched).

        Returns:
            A JSON-able dictionary.
        """
        done = min(self.num_samples, self._first_sample(consumed)) if consumed < len(self) else None
        return {
            "epoch": self.epoch,
            "consumed": int(consumed),
            "consumed_samples": self.num_samples if done is None else done,
            "origin": [self._origin_batch, self._origin_sample],
            "epoch_start_step": self._epoch_start_step,
            "schedule": self._plans.state_dict(),
            "global_batch": self.global_batch,
            "world_size": self.world_size,
            "num_samples": self.num_samples,
            "min_size": self.bounds.min_size,
            "batch_range": None
            if self._plans.batch_range is None
            else list(self._plans.batch_range),
        }

    def check_state(self, state: Any, name: str = "rex_sampler") -> dict[str, Any]:
        """Check a saved position against this run without applying it.

        Args:
            state: A dictionary from :meth:`state_dict`.
            name: Its dotted name, for errors.

        Returns:
            See :func:`~lightning_rex.data.position.check_position`.

        Raises:
            StateError: Naming the field (see :func:`~lightning_rex.data.position.
                check_position`).
        """
        return check_position(
            state,
            num_samples=self.num_samples,
            world_size=self.world_size,
            global_batch=self.global_batch,
            bounds=self.bounds,
            batch_range=self._plans.batch_range,
            accumulate=self.accumulate_grad_batches,
            drop_last=self.drop_last,
            name=name,
        )

    def load_state_dict(self, state: dict[str, Any], over: bool = False) -> None:
        """Restore a position so that the next iteration continues where the run stopped.

        A checkpoint whose schedule this run cannot continue (made with another world size,
        so another global batch ``B`` as under DDP; or a global batch that scaling moved
        and this run does not serve) resumes too: the rest of the epoch is cut into global
        batches of this run's ``B`` from the first sample not yet consumed, so no sample is
        lost or repeated, and the checkpoint's plan schedule is dropped (the initial plan of
        this run stays in force). :attr:`continues` says which happened.

        Args:
            state: A dictionary from :meth:`state_dict`.
            over: Whether the saved epoch is over whatever its batches left: Lightning
                resumes after a checkpoint taken at an epoch's end (under
                ``limit_train_batches`` one may end early) in the next epoch.

        Raises:
            StateError: Naming the field, when the state breaks an invariant (see
                :meth:`check_state`); nothing is changed then.
        """
        checked = self.check_state(state)
        finished = checked["finished"] or over
        self.set_epoch(checked["epoch"])
        self.continues, self.recut_reason = checked["continues"], checked["reason"]
        if checked["continues"]:
            self._plans = checked["schedule"]
        self._epoch_start_step = checked["epoch_start_step"]
        consumed = checked["consumed"]
        if checked["continues"]:
            self._origin_batch, self._origin_sample = checked["origin"]
        else:
            self._origin_batch, self._origin_sample = consumed, checked["consumed_samples"]
        self._fetched = consumed
        self._resume_at = None if finished else consumed
        # the restored epoch's length, as Lightning counts it: under its limit on batches an
        # epoch ends early, and Lightning cuts the loader's whole length (not what was used)
        counted = consumed if checked["finished"] else checked["length"]
        self._finished = (checked["epoch"], counted) if finished else None
        self._await_move = checked["epoch"] + 1 if finished else None
        self._length_due, self._quiet = False, None
        if finished:
            self._origin_batch = self._origin_sample = 0
            self._next_epoch_start_step = self._epoch_start_step + math.ceil(
                consumed / self.accumulate_grad_batches
            )
