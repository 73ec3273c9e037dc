"""The two small protocols the window driver talks to the world through, and what it drives.

* :class:`Collectives`: gather rows, broadcast a row, gather small objects. A process hosts
  one or more consecutive ranks: a training process hosts its own rank and passes one row,
  the simulator hosts all ``N`` ranks in one process and passes all ``N`` rows. Modelled on
  Lightning Fabric's ``Collective`` (``TorchCollective`` for real process groups,
  ``SingleDeviceCollective`` in one process), reduced to what the loop needs and typed in
  NumPy, so that the driver needs neither Lightning nor ``torch.distributed``.
  :class:`LocalCollectives` is the in-process implementation; the Lightning layer's
  ``TorchCollectives`` wraps Fabric's ``TorchCollective``.
* :class:`PlanTarget`: the home of the plan schedule. The plan at a step
  (``plan_schedule.plan_at``), setting a plan from a step (``schedule_plan``), and the first step
  whose batches nobody has fetched yet (``first_free_step``). In training it is the uneven
  batch sampler; in the simulator a plain :class:`~lightning_rex.core.plans.schedule.PlanSchedule`.
* :class:`Decider`: what turns windows into decisions, on the process hosting rank 0. The
  :class:`~lightning_rex.core.decide.controller.Controller` is one; the simulator wraps its baseline
  policies into one.

Every collective method is called by every process at the same point of the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule
from lightning_rex.core.window import Window

__all__ = [
    "Collectives",
    "Decider",
    "LocalCollectives",
    "PlanTarget",
    "Resumed",
    "ScheduleTarget",
]


@runtime_checkable
class Collectives(Protocol):
    """Collective operations over all ranks, as the window driver uses them."""

    @property
    def rank(self) -> int:
        """The first global rank this process hosts (0 for the process that decides)."""
        ...

    @property
    def world_size(self) -> int:
        """The number of ranks ``N``."""
        ...

    @property
    def hosted(self) -> int:
        """How many consecutive ranks this process hosts (1 in training)."""
        ...

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """Gather this process's rows (shape ``(hosted, L)``, float64) into ``(N, L)``."""
        ...

    def broadcast_row(self, row: np.ndarray) -> np.ndarray:
        """Return rank 0's 1-D float64 row on every process (same shape everywhere)."""
        ...

    def gather_objects(self, objs: Sequence[Any]) -> list[Any]:
        """Gather one small picklable object per hosted rank into a list of ``N``."""
        ...


class LocalCollectives:
    """All ``N`` ranks in this process: the simulator, or a run without a process group.

    Args:
        world_size: The number of ranks ``N``, all hosted here.
    """

    def __init__(self, world_size: int = 1) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self._n = int(world_size)

    @property
    def rank(self) -> int:
        """Always 0: this process hosts every rank."""
        return 0

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._n

    @property
    def hosted(self) -> int:
        """Every rank."""
        return self._n

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """The rows themselves (they are every rank's).

        Args:
            rows: Shape ``(N, L)``.

        Returns:
            The same rows as float64.

        Raises:
            ValueError: If there are not ``N`` rows.
        """
        out = np.asarray(rows, dtype=np.float64)
        if out.ndim != 2 or out.shape[0] != self._n:
            raise ValueError(f"expected {self._n} rows, got shape {out.shape}")
        return out

    def broadcast_row(self, row: np.ndarray) -> np.ndarray:
        """The row itself (this process is rank 0).

        Args:
            row: The row.

        Returns:
            The row as float64.
        """
        return np.asarray(row, dtype=np.float64)

    def gather_objects(self, objs: Sequence[Any]) -> list[Any]:
        """The objects themselves.

        Args:
            objs: One per rank.

        Returns:
            They, as a list.
        """
        return list(objs)


@dataclass(frozen=True)
class Resumed:
    """How a plan target restored its schedule from a checkpoint.

    Attributes:
        continues: True when the checkpoint's schedule is this run's (same ranks, same
            base global batch, every plan one this run serves); False when only the
            position was kept and the rest of the epoch re-cut at this run's global batch.
        reason: Why it was re-cut, in terms of this run ("" when it continues).
    """

    continues: bool
    reason: str = ""


@runtime_checkable
class PlanTarget(Protocol):
    """Where plans take effect: the home of the plan schedule."""

    @property
    def plan_schedule(self) -> PlanSchedule:
        """The plan schedule (the one record of which plan is in force when)."""
        ...

    @property
    def resumed(self) -> Resumed | None:
        """How the schedule came back from a checkpoint; None when it did not."""
        ...

    def first_free_step(self) -> int:
        """The first step none of whose batches this process has fetched yet."""
        ...

    def schedule_plan(self, plan: Sequence[int], step: int) -> Plan:
        """Put ``plan`` in force from ``step`` (>= :meth:`first_free_step` on every rank)."""
        ...


class ScheduleTarget:
    """A :class:`PlanTarget` that is only a schedule: the simulator's, or a fixed plan.

    Args:
        schedule: The schedule.
        frozen: Refuse plan changes (monitor-only use on a strategy that cannot apply them).
    """

    def __init__(self, schedule: PlanSchedule, frozen: bool = False) -> None:
        self._schedule = schedule
        self.frozen = frozen
        self.now = schedule.entries[0][0]

    @property
    def plan_schedule(self) -> PlanSchedule:
        """The schedule."""
        return self._schedule

    @property
    def resumed(self) -> Resumed | None:
        """Always None: a bare schedule is not restored from a checkpoint."""
        return None

    def first_free_step(self) -> int:
        """The step after the one set as :attr:`now` (nothing is fetched ahead here)."""
        return self.now + 1

    def schedule_plan(self, plan: Sequence[int], step: int) -> Plan:
        """Set the plan from ``step`` on.

        Args:
            plan: The per-rank sizes.
            step: The first step that uses them.

        Returns:
            The validated plan.

        Raises:
            RuntimeError: If the target is frozen.
        """
        if self.frozen:
            raise RuntimeError("this run's plan is fixed: the strategy cannot apply plans")
        return self._schedule.set(plan, step)


@runtime_checkable
class Decider(Protocol):
    """Turns windows into decisions (runs on the process hosting rank 0 only)."""

    def observe(self, window: Window) -> Decision:
        """Decide after one window."""
        ...

    def decline(self) -> None:
        """The last proposal will not be applied (monitor-only)."""
        ...

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Hard size bounds (a rank never gets more than its ``max_sizes`` entry)."""
        ...

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        """Pass caps measured at run time (memory): soft, a larger size accumulates."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for checkpoints."""
        ...

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        ...

    def rank_model_summary(self) -> dict[str, list[float]]:
        """Per-rank fitted ``rate`` and ``overhead_s`` (empty for a decider without a model)."""
        ...

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        """The even plan's predicted synchronous compute time, ``(mean, low, high)`` seconds.

        A 95% interval, from what the windows so far taught the model; None for a decider
        without a model or before its first window.
        """
        ...
