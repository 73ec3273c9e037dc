"""What a change costs and what a rejected one taught: shape prices and rollback floors.

:func:`unpaid_shapes` says why a plan's predicted gain does not pay for the new micro-batch
shapes it brings; :func:`trial_min_gain` prices a trial of a new global batch against the
run that remains; :func:`rollback_floors` turns a rolled-back plan's measurements into
floors the planner respects (:func:`~lightning_rex.core.plans.proposal.with_floors`).
docs/controller.md ("The price of a new shape", "Floors from rollbacks") and
docs/batch_scaling.md ("The price of a trial") have the account.
"""

from __future__ import annotations

import math

import numpy as np

from lightning_rex.core.decide.controller_state import ControllerState
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.proposal import recent_sizes
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window import Window

__all__ = ["rollback_floors", "shape_price", "trial_min_gain", "unpaid_shapes"]


def shape_price(settings: DecisionSettings, state: ControllerState) -> float:
    """The seconds a step pays for new micro-batch sizes (0 while unknown).

    Args:
        settings: The decision parameters (``shape_change_s`` when known).
        state: The controller's state (its measured ``shape_cost_s`` otherwise).
    """
    return settings.shape_change_s if settings.shape_change_s is not None else state.shape_cost_s


def unpaid_shapes(
    settings: DecisionSettings,
    state: ControllerState,
    model: RankTimeModel,
    plan: Plan,
    gain_s: float,
) -> str:
    """Why a plan's gain does not pay for the new sizes it brings ("" when it does).

    A size a rank has not run among its last ``shape_cache`` distinct ones costs a step its
    one-off price (``settings.shape_change_s`` when known, else the state's measured
    ``shape_cost_s``); the predicted gain per step over ``payback_windows`` windows must pay
    it twice (the validation window at risk, the chance of a rollback).

    Args:
        settings: The decision parameters.
        state: The controller's state (its measured shape cost).
        model: The time model (the sizes each rank ran).
        plan: The proposed plan.
        gain_s: Its predicted gain per step, seconds.

    Returns:
        The reason to hold, or "".
    """
    cost = shape_price(settings, state)
    if cost <= 0:
        return ""
    recent = recent_sizes(model.sizes, settings.shape_cache)
    new = [r for r, b in enumerate(plan) if b not in recent[r]]
    horizon = settings.payback_windows * settings.window.steps
    if not new or gain_s * horizon >= 2.0 * cost:
        return ""
    return (
        f"its gain ({1e3 * gain_s:.2f} ms per step over {horizon} steps) does not pay twice"
        f" for {len(new)} new size(s) at {cost:.3g} s"
    )


def trial_min_gain(
    floor: float, shape_cost_s: float, elapsed_s: float, done: float | None
) -> float:
    """The smallest predicted goodput gain worth a trial of a new global batch now.

    A trial brings new micro-batch shapes; a kept gain ``g`` saves ``(1 - 1/g)`` of the
    run that remains. As for a plan (:func:`unpaid_shapes`), the saving must pay the
    shapes' one-off cost twice (the trial's window at risk, the chance of a rollback):
    ``g >= R / (R - 2c)``. The run that remains, ``R``, is estimated from the share of it
    done at the pace so far, ``elapsed * (1 - done) / done``. Near the end of a run a trial
    cannot pay (infinite); early in it, or in a long run, the floor holds.

    Args:
        floor: The configured ``min_gain``, the least gain worth a trial in any run.
        shape_cost_s: The seconds a step pays for new sizes (0 while unknown).
        elapsed_s: The seconds the run has measured so far.
        done: The fraction of the run done, in ``[0, 1]``, or None when unknown (the floor
            alone then holds).

    Returns:
        The least gain, as a fraction (``0.03`` for x1.03), or inf when no trial can pay.
    """
    if done is None or shape_cost_s <= 0 or not 0.0 < done <= 1.0 or elapsed_s <= 0:
        return floor
    remaining = elapsed_s * (1.0 - done) / done
    cost = 2.0 * shape_cost_s
    if remaining <= cost:
        return math.inf
    return max(floor, cost / (remaining - cost))


def rollback_floors(
    model: RankTimeModel, state: ControllerState, window: Window, back: Plan
) -> list[list[float]]:
    """What a rejected plan measured, as floors: no rank is predicted faster there.

    A rank whose time grew by more than its size (beyond noise) met a jump, which lies
    somewhere between its size before the trial and its size in it: its floor holds from
    just above the former, so that a size a few samples smaller is not the next proposal.
    A rank's floor also holds for the members of its device group that ran the same size
    before the trial (the same kernels jump at the same sizes), scaled by their level
    relative to it there, so that one rollback teaches the whole kind.

    Args:
        model: The time model (window noise, device groups).
        state: The controller's state (the medians when the plan in force was accepted).
        window: The window that rolled the plan back (measured under it).
        back: The plan rolled back to.

    Returns:
        ``[rank, size, seconds]`` floors.
    """
    noise_sd = math.sqrt(float(model.rel_var[-1]))
    level = np.asarray(state.reference or window.medians, dtype=np.float64)
    plan = np.asarray(window.plan, dtype=np.int64)
    before = np.asarray(back, dtype=np.int64)
    med = np.asarray(window.medians, dtype=np.float64)
    moved = np.flatnonzero(plan != before)  # nothing new was measured on the others
    if not moved.size:
        return []
    jumped = (plan > before) & (med / level > plan / np.maximum(before, 1) * (1 + 2 * noise_sd))
    start = np.where(jumped, before + 1, plan)
    # One floor per (rank, start): a rank's kin (its device group, the same size before
    # the trial) share every start measured among them, at the largest level measured
    # there relative to the rank that measured it (what with_floors would keep anyway).
    # Grouped, not rank by rank: 4096 ranks of one kind would give 16 million floors.
    kind = np.unique(np.stack([np.asarray(model.group), before]), axis=1, return_inverse=True)[1]
    kind = np.asarray(kind).reshape(-1)
    rel: dict[tuple[int, int], float] = {}
    for rank in moved.tolist():
        key = (int(kind[rank]), int(start[rank]))
        rel[key] = max(rel.get(key, -math.inf), float(med[rank] / level[rank]))
    starts: dict[int, list[tuple[int, float]]] = {}
    for (kind_id, size), ratio in sorted(rel.items()):
        starts.setdefault(kind_id, []).append((size, ratio))
    return [
        [q, b, float(x * level[q]) * (1 - 2 * noise_sd)]
        for q in range(plan.size)
        for b, x in starts.get(int(kind[q]), [])
    ]
