"""The plan schedule: which plan is in force at which step, and the bounds every plan obeys.

A run's plans form a step function: ``(first step, plan)`` pairs in step order, the first
being the plan the run started from. :class:`PlanSchedule` is that record, and it is the
only one: in training the uneven batch sampler holds it (it cuts every global batch by it),
in the simulator the engine does, and everything else (the window driver, the controller's
expectations, the logs) reads it. Every plan put into it is checked against the run's global
batch, world size and :class:`SizeBounds`, so no code path can schedule a plan that the
sampler could not serve.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lightning_rex.core.checks import is_integer
from lightning_rex.core.plans.minimax import resolve_bounds
from lightning_rex.core.plans.plan import Plan, validate_plan
from lightning_rex.core.saved import StateError, int_list, whole

__all__ = ["PlanSchedule", "SizeBounds"]


@dataclass(frozen=True)
class SizeBounds:
    """The micro-batch sizes any plan may give a rank: the one bounds type of the package.

    The user's bounds (``min_micro_batch_size``, ``max_micro_batch_size``) and, on top, the
    per-rank caps measured at run time (free memory); :meth:`arrays` resolves them into the
    planner's per-rank ``(lo, hi)`` arrays for a global batch.

    Args:
        min_size: The smallest size (``min_micro_batch_size``), >= 1.
        max_size: The largest size (``max_micro_batch_size``) for every rank, or None.
        rank_caps: Per-rank caps (None entries for none), or None.

    Raises:
        ValueError: Naming the argument, for a minimum below 1 or a maximum below the minimum.
    """

    min_size: int = 1
    max_size: int | None = None
    rank_caps: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if not (is_integer(self.min_size) and self.min_size >= 1):
            raise ValueError(f"min_micro_batch_size must be an int >= 1, got {self.min_size!r}")
        if self.max_size is not None and not (
            is_integer(self.max_size) and self.max_size >= self.min_size
        ):
            raise ValueError(
                f"max_micro_batch_size must be None or an int >= min_micro_batch_size="
                f"{self.min_size}, got {self.max_size!r}"
            )

    def caps(self, world_size: int) -> list[int | None]:
        """Per-rank upper bounds (None where there is none).

        Args:
            world_size: The number of ranks.

        Returns:
            Each rank's smaller of ``max_size`` and its own cap.
        """
        if self.rank_caps is None:
            return [self.max_size] * world_size
        return [
            c if self.max_size is None else (self.max_size if c is None else min(c, self.max_size))
            for c in self.rank_caps
        ]

    def with_caps(self, rank_caps: Sequence[int | None] | None) -> SizeBounds:
        """These bounds with other per-rank caps.

        Args:
            rank_caps: Per-rank caps (None entries for none), or None.

        Returns:
            The new bounds.
        """
        return replace(self, rank_caps=None if rank_caps is None else tuple(rank_caps))

    def holds(self, plan: Sequence[int], global_batch: int) -> bool:
        """Whether every rank's size of ``plan`` lies within the bounds for ``global_batch``.

        Args:
            plan: The per-rank sizes.
            global_batch: The global batch the bounds are resolved for.

        Returns:
            True when ``lo <= plan <= hi`` rank by rank.
        """
        low, high = resolve_bounds(len(plan), global_batch, self.min_size, self.caps(len(plan)))
        sizes = np.asarray(plan)
        return bool(np.all(sizes >= low) and np.all(sizes <= high))

    def check_feasible(self, global_batch: int, world_size: int) -> None:
        """Check that some plan of ``global_batch`` over ``world_size`` ranks fits the bounds.

        Args:
            global_batch: The global batch ``B``.
            world_size: The number of ranks ``N``.

        Raises:
            ValueError: Naming ``min_micro_batch_size`` or ``max_micro_batch_size`` and ``B``.
        """
        if self.min_size * world_size > global_batch:
            raise ValueError(
                f"min_micro_batch_size={self.min_size} x {world_size} ranks exceeds the global "
                f"batch B={global_batch} (batch_size x world_size); lower min_micro_batch_size"
            )
        if self.max_size is not None and self.max_size * world_size < global_batch:
            raise ValueError(
                f"max_micro_batch_size={self.max_size} x {world_size} ranks is below the global "
                f"batch B={global_batch} (batch_size x world_size): no plan fits; raise "
                "max_micro_batch_size or use a smaller batch_size"
            )

    def arrays(self, global_batch: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-rank ``(lo, hi)`` arrays for the planner.

        Args:
            global_batch: The global batch ``B``.
            world_size: The number of ranks ``N``.

        Returns:
            Integer arrays of shape ``(N,)``.
        """
        self.check_feasible(global_batch, world_size)
        return resolve_bounds(world_size, global_batch, self.min_size, self.caps(world_size))

    def check(self, sizes: Sequence[int], global_batch: int, name: str = "sizes") -> Plan:
        """Validate a plan against ``B`` (its length is the world size) and the bounds.

        Args:
            sizes: The per-rank sizes.
            global_batch: The global batch ``B`` they must sum to.
            name: The argument name for error messages.

        Returns:
            The plan as a tuple of ints.

        Raises:
            ValueError: Naming ``name`` and the rule it breaks.
        """
        return validate_plan(
            sizes, global_batch, len(sizes), self.min_size, self.max_size, name=name
        )


class PlanSchedule:
    """Plans keyed by step: the plan in force at every step of a run.

    Args:
        initial: The plan in force from ``start`` (and before it).
        global_batch: The global batch ``B`` every plan sums to (the run's base batch when
            ``batch_range`` is given).
        bounds: The size bounds every plan obeys.
        start: The step of the initial entry.
        batch_range: ``(min, max)`` global batches when the global batch may change (global
            batch scaling): a plan may then sum to any ``B`` in the range. None: every plan
            sums to ``global_batch``.

    Raises:
        ValueError: If the bounds cannot hold ``B`` or the initial plan breaks them, or the
            range does not hold ``B``.
    """

    def __init__(
        self,
        initial: Sequence[int],
        global_batch: int,
        bounds: SizeBounds | None = None,
        start: int = 0,
        batch_range: tuple[int, int] | None = None,
    ) -> None:
        self.bounds = bounds or SizeBounds()
        self.global_batch = int(global_batch)
        self.world_size = len(initial)
        self.batch_range: tuple[int, int] | None = None
        if batch_range is not None:
            min_batch, max_batch = int(batch_range[0]), int(batch_range[1])
            if not min_batch <= self.global_batch <= max_batch:
                raise ValueError(
                    f"the global batch range [{min_batch}, {max_batch}] does not hold "
                    f"B={self.global_batch}"
                )
            self.batch_range = (min_batch, max_batch)
        self.bounds.check_feasible(self.global_batch, self.world_size)
        plan = self.bounds.check(initial, self.global_batch, "micro_batch_sizes")
        self._steps: list[int] = [int(start)]
        self._plans: list[Plan] = [plan]

    def _check(self, sizes: Sequence[int], name: str = "sizes") -> Plan:
        """A plan checked against the bounds and ``B`` (or the range of ``B``)."""
        if self.batch_range is None:
            return self.bounds.check(sizes, self.global_batch, name)
        total = sum(int(b) for b in sizes)
        min_batch, max_batch = self.batch_range
        if not min_batch <= total <= max_batch:
            raise ValueError(
                f"{name} sum to a global batch of {total}, outside the range "
                f"[{min_batch}, {max_batch}]"
            )
        self.bounds.check_feasible(total, len(sizes))
        return self.bounds.check(sizes, total, name)

    def batch_at(self, step: int) -> int:
        """The global batch in force at ``step`` (the sum of its plan).

        Args:
            step: The step.

        Returns:
            ``sum(plan_at(step))``.
        """
        return sum(self.plan_at(step))

    @property
    def entries(self) -> list[tuple[int, Plan]]:
        """``(first step, plan)`` pairs in step order; the first is the initial plan."""
        return list(zip(self._steps, self._plans))

    @property
    def changes(self) -> int:
        """The number of plan changes scheduled (entries after the first)."""
        return len(self._steps) - 1

    def plan_at(self, step: int) -> Plan:
        """The plan in force at ``step`` (the initial plan before the first entry).

        Args:
            step: The step.

        Returns:
            The plan.
        """
        index = bisect.bisect_right(self._steps, step) - 1
        return self._plans[max(index, 0)]

    def set(self, sizes: Sequence[int], step: int) -> Plan:
        """Put a plan in force from ``step`` on, replacing any entries at or after it.

        Args:
            sizes: The per-rank sizes.
            step: The first step that uses them.

        Returns:
            The validated plan.

        Raises:
            ValueError: If the plan has the wrong length, does not sum to ``B`` (or to a batch
                in the range) or breaks the bounds.
        """
        if len(sizes) != self.world_size:
            raise ValueError(
                f"sizes must have one entry per rank: expected {self.world_size} entries, got "
                f"{len(sizes)} ({list(sizes)})"
            )
        plan = self._check(sizes)
        index = bisect.bisect_left(self._steps, int(step))
        del self._steps[index:], self._plans[index:]
        self._steps.append(int(step))
        self._plans.append(plan)
        return plan

    def reset(self, plan: Sequence[int], start: int) -> None:
        """Forget every entry; ``plan`` is in force from ``start``.

        Args:
            plan: The new initial plan.
            start: Its step.
        """
        self._steps, self._plans = [int(start)], [self._check(plan)]

    def state_dict(self) -> list[list[Any]]:
        """The entries as JSON-able ``[[step, [sizes...]], ...]``."""
        return [[s, list(p)] for s, p in self.entries]

    def load_state_dict(self, entries: Any, name: str = "schedule") -> None:
        """Replace the entries with saved ones, after checking every one of them.

        Args:
            entries: ``[[step, [sizes...]], ...]`` as from :meth:`state_dict`.
            name: The field's dotted name, for errors.

        Raises:
            StateError: Naming the entry, when the schedule is empty or out of step order, or
                a plan has the wrong length, does not sum to ``B`` or breaks the bounds.
        """
        if not isinstance(entries, list) or not entries:
            raise StateError(name, "must be a non-empty list of [step, plan] entries")
        steps: list[int] = []
        plans: list[Plan] = []
        for index, entry in enumerate(entries):
            where = f"{name}[{index}]"
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise StateError(where, f"must be a [step, plan] pair, got {entry!r}")
            step = whole(entry[0], f"{where}[0]", 0)
            if steps and step <= steps[-1]:
                raise StateError(
                    f"{where}[0]",
                    f"must be after the previous entry's step {steps[-1]}, got {step}",
                )
            sizes = int_list(entry[1], f"{where}[1]", self.world_size)
            try:
                plan = self._check(sizes, "plan")
            except ValueError as err:
                raise StateError(f"{where}[1]", str(err)) from None
            steps.append(step)
            plans.append(plan)
        self._steps, self._plans = steps, plans
