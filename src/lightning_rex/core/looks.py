"""Sequential looks: a window gathered in segments, closed early when the evidence is clear.

With ``Controller(window_steps=W)`` the driver hands the controller *segments* of a window
(``W / looks`` steps each, one gather per segment) instead of whole windows. The controller
joins consecutive segments of one plan (:class:`SegmentBuffer`) and, after every segment,
looks at the partial window:

* **steady**: :func:`early_imbalance` runs the persistence rule
  (:func:`~lightning_rex.core.persistence.persistent_ranks`) on the windows before and the
  partial window, at a level ten times stricter (``alpha / 10``, ``consistency / 10``) and for
  an effect twice the practical one. A large, clear imbalance is acted on before the window
  ends; a small one waits for the whole window, exactly as without looks. When the rule
  needs more than one window, the partial window must hold half a window first, and the
  straggler must not have started inside the first window of the span: one that began late
  in the window before and fills the partial one may be a transient of a window or less.
* **validating**: the non-inferiority test
  (:func:`~lightning_rex.core.validation.non_inferiority`) runs on the steps measured so far
  under the new plan. An early look that shows the plan within the margin, or shows it
  worse, ends the validation at once.

Error rates stay bounded by spending: the family-wise false-alarm level of a window is at
most ``alpha (1 + (looks - 1) / 10)`` (a union bound over its looks). Validation splits its
error budget ``1 - confidence``: 20% over every early look
(:func:`validation_confidences`), 80% over the two whole-window looks, so accepting a plan
truly slower than the margin stays below ``1 - confidence`` over all looks together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_rex.core.persistence import cold_start_ranks, persistent_ranks, pointing
from lightning_rex.core.significance import ending_p_value, imbalance_test
from lightning_rex.core.window import Window

__all__ = [
    "EARLY_LEVEL",
    "SegmentBuffer",
    "default_looks",
    "early_imbalance",
    "validation_confidences",
]

EARLY_LEVEL = 0.1
"""An early look's significance level, as a fraction of a whole window's."""
_EARLY_EFFECT = 2.0
"""An early look's practical effect, as a multiple of ``min_effect``."""
_EARLY_SHARE = 0.2
"""The share of validation's error budget spent on its early looks."""


def default_looks(window: int) -> int:
    """Looks per window when none is asked for: up to 3, with segments of >= 10 steps.

    Args:
        window: Steps per window.

    Returns:
        ``max(1, min(3, window // 10))``: 3 for the default window of 30, 1 below 20.
    """
    return max(1, min(3, int(window) // 10))


class SegmentBuffer:
    """Consecutive segments of one plan, joined into the window being filled.

    Args:
        window_steps: Steps of a whole window (``W``).

    Raises:
        ValueError: If ``window_steps < 2``.
    """

    def __init__(self, window_steps: int) -> None:
        if int(window_steps) != window_steps or window_steps < 2:
            raise ValueError(f"window_steps must be an integer >= 2, got {window_steps}")
        self.window_steps = int(window_steps)
        self._parts: list[Window] = []

    @property
    def n_steps(self) -> int:
        """Steps held."""
        return sum(w.n_steps for w in self._parts)

    def clear(self) -> None:
        """Drop what is held."""
        self._parts = []

    def add(self, segment: Window) -> Window:
        """Append a segment and return the partial window so far.

        A segment of another plan, or one that starts before the last one ended or a whole
        window after it (steps were lost), starts a new window.

        Args:
            segment: The segment.

        Returns:
            The held segments as one :class:`~lightning_rex.core.window.Window`.
        """
        if self._parts:
            last = self._parts[-1]
            gap = segment.step_start - last.step_end
            if segment.plan != last.plan or not 0 <= gap < self.window_steps:
                self._parts = []
        self._parts.append(segment)
        return self.window()

    def window(self) -> Window:
        """The held segments as one window (at least one must be held)."""
        if len(self._parts) == 1:
            return self._parts[0]
        first, last = self._parts[0], self._parts[-1]
        times = np.concatenate([w.times for w in self._parts], axis=1)
        return Window(times, first.plan, first.step_start, last.step_end)

    def state_dict(self) -> list[dict[str, Any]]:
        """The held segments as JSON-able data."""
        return [
            {
                "times": w.times.tolist(),
                "plan": list(w.plan),
                "start": w.step_start,
                "end": w.step_end,
            }
            for w in self._parts
        ]

    def load_state_dict(self, d: Sequence[dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` output.

        Args:
            d: The saved segments.

        Raises:
            ValueError: If a saved segment is malformed.
        """
        self._parts = [
            Window(np.asarray(s["times"], dtype=np.float64), s["plan"], s["start"], s["end"])
            for s in d
        ]


def early_imbalance(
    wins: Sequence[np.ndarray],
    *,
    alpha: float,
    min_effect: float,
    consistency: float,
    ending_alpha: float,
    floors: tuple[float, float],
    cold: bool = False,
) -> list[int]:
    """The ranks an early look flags: the persistence rule at an early look's levels.

    Args:
        wins: The windows' times, each ``(N, K)``, oldest first; the last is the partial
            window.
        alpha: A whole window's family-wise level.
        min_effect: A whole window's practical effect threshold.
        consistency: A whole window's per-window raw p-value.
        ending_alpha: Level of the veto for a straggler that ends or starts in the latest
            window.
        floors: Long-run variance factors from earlier windows, for one window and for the
            windows pooled.
        cold: Cold start (the controller's first window): the ranks
            :func:`~lightning_rex.core.persistence.cold_start_ranks` flags, at an early
            look's levels.

    Returns:
        The flagged ranks, sorted (empty when the evidence is not yet conclusive).
    """
    a, c = alpha * EARLY_LEVEL, consistency * EARLY_LEVEL
    effect = _EARLY_EFFECT * min_effect
    # cheap first: the partial window must point at a rank on its own
    sig = imbalance_test(wins[-1], alpha=a, min_effect=effect, min_inflation=floors[0])
    points = pointing(sig, c, effect)
    if cold:
        return cold_start_ranks(sig, a, effect)
    if not bool(points.any()):
        return []
    flagged = persistent_ranks(
        wins,
        alpha=a,
        min_effect=effect,
        consistency=c,
        ending_alpha=ending_alpha,
        floors=floors,
    )
    # The rule vetoes a straggler that starts inside the latest window. Acting early also
    # needs it not to have started inside the first: a straggler that began late in the
    # window before and fills the partial one may be a transient of one window or less.
    out = []
    for r in flagged:
        slow = bool(sig.effect[r] > 1.0)
        if ending_p_value(wins[0], [r], slower=not slow)[0] >= ending_alpha:
            out.append(r)
    return out


def validation_confidences(confidence: float, looks: int, whole_looks: int) -> tuple[float, float]:
    """Per-look confidences of a validation with early looks (Bonferroni spending).

    Args:
        confidence: The validation's one-sided confidence over all its looks.
        looks: Looks per window (1: only whole windows are looked at).
        whole_looks: The most whole windows a validation measures.

    Returns:
        ``(early, whole)``: the confidence of each early look and of each whole-window look.
        With one look per window all the budget goes to whole windows.
    """
    budget = 1.0 - confidence
    if looks <= 1:
        return 1.0, 1.0 - budget / whole_looks
    early = budget * _EARLY_SHARE / (whole_looks * (looks - 1))
    return 1.0 - early, 1.0 - budget * (1.0 - _EARLY_SHARE) / whole_looks
