"""Uneven per-rank batches cut from one global permutation, with a plan schedule.

Every rank builds the same permutation of the dataset each epoch: the one DDP would use,
produced by :class:`torch.utils.data.DistributedSampler` with one replica (``randperm`` seeded
with ``seed + epoch``). Global batch ``k`` is ``perm[k*B:(k+1)*B]``; rank ``r`` takes the
contiguous sub-slice that the plan in force at batch ``k`` gives it. So under the even plan
every global batch holds the same samples as under DDP; only the final partial global batch
differs, where DDP pads with repeats and REX repeats nothing: it is split in proportion to the
plan, or dropped when it holds fewer samples than there are ranks (no rank may ever get an
empty micro-batch) or when ``drop_last=True``.

Plans are scheduled by optimizer step. Batch ``i`` of an epoch belongs to optimizer step
``epoch_start_step + i // accumulate_grad_batches``, so a gradient-accumulation window always
uses one plan, and a plan change never reaches a batch that was already fetched.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import DistributedSampler, Sampler

from lightning_rex.core.plan import Plan, split_in_proportion, validate_plan

__all__ = ["UnevenBatchSampler"]


class _Sized:
    """A stand-in dataset that only has a length, for DistributedSampler."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class UnevenBatchSampler(Sampler[list[int]]):
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
        step_source: Returns the optimizer step at which the next epoch's first batch is
            trained (``trainer.global_step``). Without it the sampler counts steps itself.
        min_micro_batch_size: The smallest size a scheduled plan may give a rank.
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
        min_micro_batch_size: int = 1,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches must be >= 1, got {accumulate_grad_batches}")
        self.world_size = len(plan)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        self.min_micro_batch_size = min_micro_batch_size
        initial = validate_plan(plan, global_batch, self.world_size, min_micro_batch_size)
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.rank = rank
        self.drop_last = drop_last
        self.accumulate_grad_batches = accumulate_grad_batches
        self.step_source = step_source
        self.sampler: DistributedSampler[int] = DistributedSampler(
            _Sized(num_samples),  # type: ignore[arg-type]
            num_replicas=1,
            rank=0,
            shuffle=shuffle,
            seed=seed,
        )
        self._schedule_steps: list[int] = [0]
        self._schedule_plans: list[Plan] = [initial]
        self._epoch_start_step = 0
        self._next_epoch_start_step = 0
        self._fetched = 0
        self._resume_at: int | None = None
        # Where this epoch's batch grid starts: batch ``origin_batch`` begins at sample
        # ``origin_sample`` of the permutation. (0, 0) except in an epoch resumed from a
        # checkpoint made with another global batch (another world size).
        self._origin_batch = 0
        self._origin_sample = 0

    # ------------------------------------------------------------------ epochs and length
    @property
    def epoch(self) -> int:
        """The epoch whose permutation is used."""
        return int(self.sampler.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation (Lightning calls this through ``.sampler``).

        Args:
            epoch: The epoch number.
        """
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        full, rem = divmod(self.num_samples - self._origin_sample, self.global_batch)
        tail = 1 if (rem >= self.world_size and not self.drop_last) else 0
        return self._origin_batch + full + tail

    # ------------------------------------------------------------------ plan schedule
    @property
    def schedule(self) -> list[tuple[int, Plan]]:
        """The plan schedule as ``(first optimizer step, plan)`` pairs, in step order."""
        return list(zip(self._schedule_steps, self._schedule_plans))

    def plan_at(self, step: int) -> Plan:
        """Return the plan in force at an optimizer step.

        Args:
            step: The optimizer step (``trainer.global_step``).

        Returns:
            The plan scheduled at or before ``step`` (the initial plan before the first entry).
        """
        i = bisect.bisect_right(self._schedule_steps, step) - 1
        return self._schedule_plans[max(i, 0)]

    def last_fetched_step(self) -> int:
        """The last optimizer step any of whose batches this rank has already yielded.

        Returns:
            That step, or ``epoch_start_step - 1`` when nothing of the epoch was fetched.
        """
        if self._fetched == 0:
            return self._epoch_start_step - 1
        return self._epoch_start_step + (self._fetched - 1) // self.accumulate_grad_batches

    def resume_position(self) -> int:
        """The batch index the next iteration starts from (0 unless resuming mid-epoch).

        Returns:
            The number of batches of the epoch already consumed before a resume, else 0.
        """
        return self._resume_at or 0

    def schedule_plan(self, plan: Sequence[int], step: int) -> None:
        """Put ``plan`` in force from optimizer ``step`` on.

        The caller (the strategy) makes sure every rank calls this with the same arguments and
        that no rank has fetched a batch of ``step`` yet; this is checked locally too.

        Args:
            plan: The new per-rank sizes.
            step: The first optimizer step that uses it.

        Raises:
            ValueError: If the plan is invalid or ``step`` has batches fetched already.
        """
        new = validate_plan(plan, self.global_batch, self.world_size, self.min_micro_batch_size)
        if step <= self.last_fetched_step():
            raise ValueError(
                f"cannot change the plan at step {step}: batches up to step "
                f"{self.last_fetched_step()} were already fetched"
            )
        i = bisect.bisect_left(self._schedule_steps, step)
        del self._schedule_steps[i:], self._schedule_plans[i:]
        self._schedule_steps.append(step)
        self._schedule_plans.append(new)

    # ------------------------------------------------------------------ batches
    def sizes_for_batch(self, index: int) -> Plan:
        """The per-rank sizes of batch ``index`` of the current epoch.

        Args:
            index: The batch index within the epoch (Lightning's ``batch_idx``).

        Returns:
            The plan for a full global batch, or the proportional split of the final one.
        """
        plan = self.plan_at(self._epoch_start_step + index // self.accumulate_grad_batches)
        remaining = self.num_samples - self._origin_sample
        full = remaining // self.global_batch
        if index - self._origin_batch < full:
            return plan
        return split_in_proportion(remaining - full * self.global_batch, plan)

    def _first_sample(self, index: int) -> int:
        return self._origin_sample + (index - self._origin_batch) * self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        perm = list(iter(self.sampler))
        if self._resume_at is not None:
            start, self._resume_at = self._resume_at, None
            # the epoch start step was restored by load_state_dict
        else:
            start = 0
            self._origin_batch = self._origin_sample = 0
            self._epoch_start_step = (
                self.step_source() if self.step_source is not None else self._next_epoch_start_step
            )
        self._fetched = start
        n = len(self)
        self._next_epoch_start_step = self._epoch_start_step + math.ceil(
            n / self.accumulate_grad_batches
        )
        for i in range(start, n):
            sizes = self.sizes_for_batch(i)
            lo = self._first_sample(i) + sum(sizes[: self.rank])
            self._fetched = i + 1
            yield perm[lo : lo + sizes[self.rank]]

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
            "schedule": [[s, list(p)] for s, p in self.schedule],
            "global_batch": self.global_batch,
            "world_size": self.world_size,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position so that the next iteration continues where the run stopped.

        Args:
            state: A dictionary from :meth:`state_dict`.

        A checkpoint made with another world size (so another global batch ``B``, as under
        DDP) resumes too: the rest of the epoch is cut into global batches of the new ``B``
        from the first sample not yet consumed, so no sample is lost or repeated; the old
        plan schedule does not apply to the new ranks and is dropped (the initial plan of
        this run stays in force).

        Args:
            state: A dictionary from :meth:`state_dict`.

        Raises:
            ValueError: If the checkpoint was made with another dataset length.
        """
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                "cannot resume the REX sampler: the checkpoint has num_samples="
                f"{state['num_samples']}, this run's dataset has {self.num_samples}"
            )
        same = (
            int(state["global_batch"]) == self.global_batch
            and int(state["world_size"]) == self.world_size
        )
        self.set_epoch(int(state["epoch"]))
        if same:
            self._schedule_steps = [int(s) for s, _ in state["schedule"]]
            self._schedule_plans = [tuple(int(b) for b in p) for _, p in state["schedule"]]
        self._epoch_start_step = int(state["epoch_start_step"])
        consumed = int(state["consumed"])
        done = int(state.get("consumed_samples", consumed * int(state["global_batch"])))
        if same:
            self._origin_batch, self._origin_sample = (int(x) for x in state.get("origin", (0, 0)))
        else:
            self._origin_batch, self._origin_sample = consumed, min(done, self.num_samples)
        self._fetched = consumed
        old_full, old_rem = divmod(self.num_samples, int(state["global_batch"]))
        old_tail = 1 if old_rem >= int(state["world_size"]) and not self.drop_last else 0
        finished = consumed >= (old_full + old_tail if not same else len(self))
        self._resume_at = None if finished else consumed
        if finished:
            self._origin_batch = self._origin_sample = 0
            self._next_epoch_start_step = self._epoch_start_step + math.ceil(
                consumed / self.accumulate_grad_batches
            )
