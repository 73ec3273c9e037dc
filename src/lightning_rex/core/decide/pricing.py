"""What a change costs and what a rejected one taught: shape prices and rollback floors.

:func:`unpaid_shapes` says why a plan's predicted gain does not pay for the new micro-batch
shapes it brings; :func:`rollback_floors` turns a rolled-back plan's measurements into
floors the planner respects (:func:`~lightning_rex.core.plans.proposal.with_floors`).
docs/controller.md ("The price of a new shape", "Floors from rollbacks") has the account.
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

__all__ = ["rollback_floors", "unpaid_shapes"]


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
    cost = settings.shape_change_s if settings.shape_change_s is not None else state.shape_cost_s
    if cost <= 0:
        return ""
    recent = recent_sizes(model.sizes, settings.shape_cache)
    new = [r for r, b in enumerate(plan) if b not in recent[r]]
    horizon = settings.payback_windows * settings.window
    if not new or gain_s * horizon >= 2.0 * cost:
        return ""
    return (
        f"its gain ({1e3 * gain_s:.2f} ms per step over {horizon} steps) does not pay twice"
        f" for {len(new)} new size(s) at {cost:.3g} s"
    )


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
    sd = math.sqrt(float(model.rel_var[-1]))
    level = np.asarray(state.reference or window.medians, dtype=np.float64)
    group = model.group
    out = []
    for r, (b, m) in enumerate(zip(window.plan, window.medians)):
        if b == back[r]:
            continue  # nothing new was measured on this rank
        jumped = b > back[r] and m / level[r] > b / back[r] * (1 + 2 * sd)
        start = back[r] + 1 if jumped else b
        kin = np.flatnonzero((group == group[r]) & (np.asarray(back) == back[r]))
        out += [[int(q), int(start), float(m * level[q] / level[r]) * (1 - 2 * sd)] for q in kin]
    return out
