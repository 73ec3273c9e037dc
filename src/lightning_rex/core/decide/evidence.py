"""What one whole window tells the controller: :class:`WindowEvidence`, and :func:`weigh_window`.

:func:`weigh_window` runs a window's imbalance test with the long-run variance inflation of
the windows before it, adds the window to that history, and teaches the
:class:`~lightning_rex.core.model.time_model.RankTimeModel` its medians. The
:class:`WindowEvidence` it returns makes every :class:`~lightning_rex.core.decision.Decision`
the controller takes on that window (:meth:`WindowEvidence.decision`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lightning_rex.core.decision import Decision, DecisionKind
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.stats.significance import ImbalanceResult, WindowHistory, imbalance_test
from lightning_rex.core.window import Window

__all__ = ["WindowEvidence", "weigh_window"]

_MAD_TO_SD = 1.4826
"""A normal sample's standard deviation over its median absolute deviation."""


@dataclass(frozen=True)
class WindowEvidence:
    """One window's imbalance test and measured step time, behind its decisions.

    Args:
        window: The window.
        imbalance: Its imbalance test, or None (a plan tried from outside, decided on no
            new window).
        inflation: The long-run variance-inflation factors of the windows before it (over
            one window, and over ``persistence`` windows).
    """

    window: Window
    imbalance: ImbalanceResult | None
    inflation: tuple[float, float]

    @property
    def measured(self) -> float:
        """The window's step time: the slowest rank's median, seconds."""
        return float(self.window.medians.max())

    def decision(
        self,
        kind: DecisionKind,
        plan: Plan | None,
        reason: str,
        predicted: float | None = None,
    ) -> Decision:
        """A decision on this window.

        Args:
            kind: ``"hold"``, ``"propose"``, ``"accept"`` or ``"rollback"``.
            plan: The plan to apply now, or None.
            reason: Why.
            predicted: The predicted step time it carries, or None.

        Returns:
            The :class:`~lightning_rex.core.decision.Decision`, with this window's measured
            step time, test summary and last step.
        """
        return Decision(
            kind,
            plan,
            predicted,
            self.measured,
            None if self.imbalance is None else self.imbalance.to_dict(),
            reason,
            self.window.step_end,
        )


def weigh_window(
    window: Window, model: RankTimeModel, history: WindowHistory, settings: DecisionSettings
) -> WindowEvidence:
    """Test one whole window for an imbalance, and learn from it.

    The long-run variance factors come from the windows before this one (batch means across
    windows): slow autocorrelation that a single window cannot see. The window then joins
    ``history``, and its medians teach ``model`` with a robust noise estimate (the median
    absolute deviation of the log times: a new shape's first step or a stall must not make a
    window look noisy, or its medians would teach the model nothing).

    Args:
        window: The window.
        model: The rank time model; the window's medians are added to it.
        history: The earlier windows' test statistics; the window is added to it.
        settings: The decision parameters (``alpha``, ``min_effect``, ``persistence``).

    Returns:
        The :class:`WindowEvidence`.
    """
    f_one = history.factor(1)
    inflation = (f_one, max(f_one, history.factor(settings.persistence)))
    imbalance = imbalance_test(
        window.times, alpha=settings.alpha, min_effect=settings.min_effect, min_inflation=f_one
    )
    history.add(imbalance.z, window.plan, window.n_steps)
    logs = np.log(window.times)
    mad = np.median(np.abs(logs - np.median(logs, axis=1, keepdims=True)), axis=1)
    rel_var = float(np.median((_MAD_TO_SD * mad) ** 2)) * (math.pi / 2) * imbalance.inflation
    model.add(window.plan, window.medians, rel_var / window.n_steps)
    return WindowEvidence(window, imbalance, inflation)
