"""A plan change, from its proposal to its verdict: :func:`propose_change`, :func:`judge_trial`.

:func:`propose_change` asks the planner for the plan minimising the posterior's optimistic
quantile of the step time (:func:`~lightning_rex.core.plans.proposal.propose_plan`) and
proposes it when it is predicted ``min_gain`` faster (twice that after a rollback) and pays
back the sizes it brings (:func:`~lightning_rex.core.decide.pricing.unpaid_shapes`).
:func:`judge_trial` validates the plan under trial on a window
(:func:`~lightning_rex.core.decide.validating.measure_trial`): accept, roll back, or one more
window. The :class:`~lightning_rex.core.decide.controller.Controller` calls both on the state
it owns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from lightning_rex.core.decide.controller_state import ControllerState
from lightning_rex.core.decide.evidence import WindowEvidence
from lightning_rex.core.decide.pricing import rollback_floors, unpaid_shapes
from lightning_rex.core.decide.validating import measure_trial
from lightning_rex.core.decision import Decision
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.minimax import exploration_kappa
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.proposal import propose_plan, refit_due
from lightning_rex.core.settings import DecisionSettings

__all__ = ["MAX_FLOORS", "judge_trial", "propose_change"]

MAX_FLOORS = 256
"""The most floors from rolled-back plans kept, or 4 per rank if more (the oldest go first)."""


def propose_change(
    model: RankTimeModel,
    state: ControllerState,
    settings: DecisionSettings,
    sizes: tuple[np.ndarray, np.ndarray],
    evidence: WindowEvidence,
    reason: str,
    *,
    force: bool = False,
    trigger: int = 1,
    plan: Plan | None = None,
) -> Decision:
    """Propose the planner's plan (or ``plan``), or hold when it is not worth the change.

    Args:
        model: The rank time model.
        state: The controller's state; a proposal puts the plan under trial.
        settings: The decision parameters (``min_gain``, ``margin``, exploration).
        sizes: Per-rank ``(lo, hi)`` size bounds for the global batch in force.
        evidence: The window the proposal answers.
        reason: Why a change is wanted.
        force: Propose even a plan predicted no faster (the plan in force breaks the bounds,
            or ``plan`` is given).
        trigger: Windows of the imbalance behind it (the validation's baseline).
        plan: A plan chosen outside (:meth:`Controller.try_plan
            <lightning_rex.core.decide.controller.Controller.try_plan>`); None asks the
            planner.

    Returns:
        The ``propose`` decision, or a ``hold`` that says why not.
    """
    if plan is None:
        state.refit_wanted = state.refit_wanted or refit_due(model, state.fitted_at)
        low, high = sizes
        current = np.asarray(state.plan)
        plan, pred_new, pred_cur = propose_plan(
            model,
            state.plan,
            low,
            high,
            state.global_batch,
            kappa=exploration_kappa(settings.explore, model.n_obs),
            explore_slack=settings.explore_slack,
            in_bounds=not bool(np.any(current < low) or np.any(current > high)),
            floors=state.floors,
        )
        gain = settings.min_gain * (2.0 if state.rolled_back else 1.0)
        if not force and (plan == state.plan or pred_new > pred_cur * (1.0 - gain)):
            state.changed = False
            return evidence.decision("hold", None, f"{reason}; no plan predicted {gain:.0%} faster")
        unpaid = unpaid_shapes(settings, state, model, plan, pred_cur - pred_new)
        if not force and unpaid:
            state.changed = False
            return evidence.decision("hold", None, f"{reason}; {unpaid}")
    else:
        pred_new = float(model.predict(plan).max())
    base = state.baseline_for(evidence.window.step_max.tolist(), trigger, settings.margin)
    state.propose(plan, pred_new, base)
    return evidence.decision("propose", plan, reason, pred_new)


def judge_trial(
    model: RankTimeModel,
    state: ControllerState,
    settings: DecisionSettings,
    evidence: WindowEvidence,
    confidence: float,
    refine: Callable[[WindowEvidence, str], Decision],
) -> Decision:
    """Validate the plan under trial on a window of it: accept, roll back, or hold.

    Args:
        model: The rank time model.
        state: The controller's state (validating).
        settings: The decision parameters.
        evidence: A window under the plan on trial.
        confidence: The one-sided confidence of a whole window's look.
        refine: Proposes again from an accepted window (``(evidence, reason)`` to a
            decision): an accepted change that helped and leaves a significant imbalance is
            refined at once.

    Returns:
        The decision: ``accept`` (or a refining ``propose``), both marked ``validated``;
        ``rollback``; or ``hold`` (too short to count, or one more window wanted).
    """
    predicted, window, decide = state.predicted, evidence.window, evidence.decision
    if not state.trial and state.previous is not None:
        state.measure_shape_cost(window, state.previous)
    verdict = measure_trial(state, window, model, settings, evidence.measured, confidence)
    if verdict is None:  # too short to compare (a window cut by dropped steps): not a look
        return decide("hold", None, "validation window too short: not counted", predicted)
    if verdict.outcome == "extend":
        return decide("hold", None, verdict.reason, predicted)
    if verdict.outcome == "rollback":
        back = state.previous
        assert back is not None
        keep = max(MAX_FLOORS, 4 * window.n_ranks)
        state.floors = (state.floors + rollback_floors(model, state, window, back))[-keep:]
        return decide("rollback", state.roll_back(), verdict.reason, predicted)
    state.accept(window.medians.tolist(), state.trial, window.times.tolist())
    imbalance = evidence.imbalance
    if imbalance is not None and imbalance.imbalanced and verdict.ratio < 1.0:
        # The change helped, and the plan just validated is still significantly imbalanced:
        # most likely the model's error at the new sizes, which this window has just
        # corrected, not a transient straggler. Refine now rather than after `persistence`
        # more windows. A change that did not help ends the chain: no drift through plans
        # each within the margin of the one before.
        refined = refine(evidence, f"{verdict.reason}; still imbalanced: refined")
        if refined.kind == "propose":
            return replace(refined, validated=True)
    return replace(decide("accept", None, verdict.reason, predicted), validated=True)
