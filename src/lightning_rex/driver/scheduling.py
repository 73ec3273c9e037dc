"""The one way a plan changes: from the first step no rank has fetched, agreed by all.

A plan may change only at a step none of whose batches any rank has fetched yet (DataLoader
workers prefetch), and every rank must switch at the same step, or ranks would cut the same
global batch differently. :func:`agreed_step` is that rule; the window loop's exchange, a
resume's first plan, ``RexStrategy.set_plan`` (through :func:`agree`) and the simulator's
per-step peers (through :func:`schedule_agreed`) all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lightning_rex.core.plans.plan import Plan
from lightning_rex.driver.protocols import Collectives, PlanTarget

__all__ = ["agree", "agreed_step", "schedule_agreed"]


def agreed_step(free_steps: Iterable[float], not_before: int) -> int:
    """The first step no rank has fetched, at ``not_before`` or later.

    Args:
        free_steps: Every rank's first step none of whose batches it has fetched.
        not_before: The earliest step wanted.

    Returns:
        ``max(not_before, max(free_steps))``.
    """
    return max(int(not_before), *(int(s) for s in free_steps))


def agree(
    collectives: Collectives, target: PlanTarget, plan: Sequence[int], not_before: int
) -> tuple[Plan, int]:
    """Every rank, together: rank 0's plan, and the step it can start at on every rank.

    One collective (small objects, so that ranks that pass plans of different lengths do
    not hang; rank 0's is the one taken).

    Args:
        collectives: The collectives.
        target: This process's plan target (its first free step).
        plan: The plan (rank 0's counts).
        not_before: The earliest step wanted (rank 0's counts).

    Returns:
        ``(rank 0's plan, the agreed step)``, the same on every rank.
    """
    mine = (tuple(int(b) for b in plan), int(not_before), target.first_free_step())
    objs = collectives.gather_objects([mine] * collectives.hosted)
    first, wanted, _ = objs[0]
    return tuple(first), agreed_step((o[2] for o in objs), wanted)


def schedule_agreed(
    collectives: Collectives, target: PlanTarget, plan: Sequence[int], not_before: int
) -> int:
    """:func:`agree`, then put the plan in force from the agreed step on every rank.

    Args:
        collectives: The collectives.
        target: This process's plan target.
        plan: The plan (rank 0's counts).
        not_before: The earliest step wanted.

    Returns:
        The step the plan is in force from.

    Raises:
        ValueError: On every rank alike, for a plan the schedule refuses.
    """
    agreed, step = agree(collectives, target, plan, not_before)
    target.schedule_plan(agreed, step)
    return step
