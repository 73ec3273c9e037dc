"""The start of a fit: what the ranks tell each other, and the first plan fitted from rates.

Every rank contributes, for each rank it hosts, its device identity, the first step its
loader has not yet prepared, a failure message if it already failed, and (rank 0 only) the
run id and the prior; :func:`join` gathers them into a :class:`Joined` that every rank then
reads alike. :func:`fitted_first_plan` is the plan a fit starts from when rates per device
are known (a resume on another world size, or a prior), and the step it takes effect at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_rex.core.plans.minimax import plan_from_device_rates
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule
from lightning_rex.driver.protocols import Collectives
from lightning_rex.driver.scheduling import agreed_step

__all__ = ["Joined", "fitted_first_plan", "join"]


@dataclass(frozen=True)
class Joined:
    """What every rank knows after the start's gather.

    Attributes:
        device_keys: Each rank's device identity.
        free_steps: Each rank's first step its loader has not yet prepared.
        failed: Per rank, whether it had already failed.
        run_id: Rank 0's id for this run.
        prior: Rank 0's rates per device identity, or None.
    """

    device_keys: list[str]
    free_steps: list[int]
    failed: list[bool]
    run_id: str
    prior: dict[str, list[float]] | None


def join(
    collectives: Collectives,
    device_keys: Sequence[str],
    free: int,
    run_id: str,
    failure: str | None,
    prior: dict[str, list[float]] | None,
    is_rank_zero: bool,
) -> Joined:
    """Gather the start's facts from every rank (a collective: every rank calls it).

    Args:
        collectives: The ranks' collectives.
        device_keys: Each hosted rank's device identity.
        free: This process's first step not yet prepared by its loader.
        run_id: This process's candidate run id (rank 0's is used).
        failure: This process's failure message, or None.
        prior: This process's prior (rank 0's is used).
        is_rank_zero: Whether this process hosts rank 0.

    Returns:
        The :class:`Joined` facts, the same on every rank.
    """
    objs = collectives.gather_objects(
        [
            (
                str(k),
                free,
                run_id,
                failure if i == 0 else None,
                prior if is_rank_zero and i == 0 else None,
            )
            for i, k in enumerate(device_keys)
        ]
    )
    return Joined(
        device_keys=[o[0] for o in objs],
        free_steps=[o[1] for o in objs],
        failed=[o[3] is not None for o in objs],
        run_id=str(objs[0][2]),
        prior=objs[0][4],
    )


def fitted_first_plan(
    rates: dict[str, list[float]] | None,
    joined: Joined,
    schedule: PlanSchedule,
    step: int,
) -> tuple[Plan, int] | None:
    """The plan fitted from rates per device, and the step every rank can start it at.

    Args:
        rates: Rates per device identity (a checkpoint's, or a prior), or None.
        joined: The start's facts.
        schedule: The plan schedule (its batch, bounds and plan at ``step``).
        step: The fit's first step.

    Returns:
        ``(plan, step)``, or None when there are no rates, a rank's device is not among
        them, or the fitted plan is the one the schedule already holds.
    """
    if not rates:
        return None
    world_size, bounds = schedule.world_size, schedule.bounds
    fitted = plan_from_device_rates(
        rates, joined.device_keys, schedule.global_batch, bounds.min_size, bounds.caps(world_size)
    )
    if fitted is None or fitted == schedule.plan_at(step):
        return None
    return fitted, agreed_step(joined.free_steps, step)
