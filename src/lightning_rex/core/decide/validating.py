"""The validation phase: is the plan just applied kept, rolled back, or measured longer?

After a change the controller measures the new plan for one or two whole windows (with
sequential looks, also part of one: :func:`closes_early`). :func:`judge` compares what was
measured under it with the old plan's baseline:

* **accept** when the non-inferiority test
  (:func:`~lightning_rex.core.stats.noninferiority.non_inferiority`) shows it is not slower than the
  old plan by more than the margin, and it is not far slower than the model predicted;
* **rollback** when it is not shown within the margin after two windows (or is shown
  slower after one), or when its measured step time exceeds the prediction by more than
  the tolerance plus a noise allowance;
* **extend** (measure one more window) when the first window shows neither.

Each whole-window look runs at half the error rate left by the early looks (Bonferroni),
so that accepting a plan truly slower than the margin stays below ``1 - confidence`` over
all of them (:func:`~lightning_rex.core.decide.looks.validation_confidences`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from lightning_rex.core.stats.noninferiority import non_inferiority

if TYPE_CHECKING:
    from lightning_rex.core.decide.controller_state import ControllerState
    from lightning_rex.core.model.time_model import RankTimeModel
    from lightning_rex.core.settings import DecisionSettings
    from lightning_rex.core.window import Window

__all__ = ["MAX_WINDOWS", "Judgement", "judge", "measure_trial"]

MAX_WINDOWS = 2
"""The most whole windows a new plan is measured for before it is kept or rolled back."""


@dataclass(frozen=True)
class Judgement:
    """What a validation window says about the plan under test.

    Attributes:
        outcome: ``"accept"``, ``"rollback"`` or ``"extend"``.
        ratio: The new plan's geometric-mean step time over the baseline's.
        upper: Its upper confidence bound.
        reason: Why, for the decision record.
    """

    outcome: Literal["accept", "rollback", "extend"]
    ratio: float
    upper: float
    reason: str


def judge(
    trial: list[float],
    baseline: list[float],
    *,
    measured: float,
    predicted: float,
    rel_var: float,
    world_size: int,
    windows: int,
    margin: float,
    tolerance: float,
    confidence: float,
) -> Judgement:
    """Judge the plan under validation on the windows measured under it so far.

    Args:
        trial: Per-step synchronous times under the new plan (every window so far).
        baseline: Per-step synchronous times under the old plan.
        measured: The last window's measured step time (max over ranks of the medians).
        predicted: The model's step time for the new plan now.
        rel_var: The model's relative noise variance of the last window.
        world_size: The number of ranks (the max of ``N`` medians is noisier).
        windows: Whole windows measured under the new plan, this one included.
        margin: The non-inferiority margin.
        tolerance: The fraction by which the measured time may exceed the prediction.
        confidence: The one-sided confidence of this look.

    Returns:
        The :class:`Judgement`.
    """
    verdict = non_inferiority(
        np.asarray(trial), np.asarray(baseline), margin=margin, confidence=confidence
    )
    allowance = 3.0 * math.sqrt(rel_var * 2.0 * math.log(max(world_size, 2)))
    off_model = measured > predicted * (1.0 + tolerance + allowance)
    slower = not verdict.non_inferior
    if slower and not off_model and windows < MAX_WINDOWS and verdict.lower <= verdict.bound:
        # neither shown within the margin nor shown worse: measure one more window
        return Judgement(
            "extend",
            verdict.ratio,
            verdict.upper,
            f"validation inconclusive after {windows} window (x{verdict.ratio:.3f}, upper bound"
            f" x{verdict.upper:.3f}): extended",
        )
    if slower:
        why = (
            f"new plan not shown within {margin:.0%} of the old (x{verdict.ratio:.3f},"
            f" upper bound x{verdict.upper:.3f})"
        )
        return Judgement("rollback", verdict.ratio, verdict.upper, why)
    if off_model:
        why = f"new plan slower than predicted ({measured:.4g}s vs {predicted:.4g}s)"
        return Judgement("rollback", verdict.ratio, verdict.upper, why)
    return Judgement(
        "accept", verdict.ratio, verdict.upper, f"non-inferior (x{verdict.ratio:.3f} vs before)"
    )


def measure_trial(
    state: ControllerState,
    window: Window,
    model: RankTimeModel,
    settings: DecisionSettings,
    measured: float,
    confidence: float,
) -> Judgement | None:
    """Add a window under the plan being validated to its trial, and judge the trial.

    Args:
        state: The controller's state (its baseline, and the trial this window joins).
        window: The window, measured under the plan being validated.
        model: The rank time model (it has taken this window in).
        settings: The decision parameters (margin, tolerance).
        measured: The window's step time (max over ranks of the medians).
        confidence: A whole-window look's confidence.

    Returns:
        The :class:`Judgement`, or None for a window too short to compare (it is not a look).
    """
    assert state.baseline is not None and state.previous is not None
    if window.n_steps < 2 or len(state.baseline) < 2:
        return None
    state.trial.append(window.step_max.tolist())
    return judge(
        [t for w in state.trial for t in w],
        state.baseline,
        measured=measured,
        predicted=float(model.predict(window.plan).max()),
        rel_var=float(model.rel_var[-1]),
        world_size=len(window.plan),
        windows=len(state.trial),
        margin=settings.margin,
        tolerance=settings.tolerance,
        confidence=confidence,
    )
