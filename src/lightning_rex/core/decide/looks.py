"""Sequential looks: a window gathered in segments, closed early when the evidence is clear.

With a window of several looks (``Controller(window=WindowSpec(W, looks))``) the driver hands
the controller *segments* of a window (``W / looks`` steps each, one gather per segment)
instead of whole windows. The controller
joins consecutive segments of one plan (:class:`SegmentBuffer`) and, after every segment,
looks at the partial window:

* **steady**: :func:`early_imbalance` runs the persistence rule
  (:func:`~lightning_rex.core.stats.persistence.persistent_ranks`) on the windows before and the
  partial window, at a level ten times stricter (``alpha / 10``, ``consistency / 10``) and for
  an effect twice the practical one. A large, clear imbalance is acted on before the window
  ends; a small one waits for the whole window, exactly as without looks. When the rule
  needs more than one window, the partial window must hold half a window first, and the
  straggler must not have started inside the first window of the span: one that began late
  in the window before and fills the partial one may be a transient of a window or less.
* **validating**: the non-inferiority test
  (:func:`~lightning_rex.core.stats.noninferiority.non_inferiority`) runs on the steps
  measured so far under the new plan. An early look that shows the plan within the margin,
  or shows it worse, ends the validation at once.

Error rates stay bounded by spending: the family-wise false-alarm level of a window is at
most ``alpha (1 + (looks - 1) / 10)`` (a union bound over its looks). Validation splits its
error budget ``1 - confidence``: 20% over every early look
(:func:`validation_confidences`), 80% over the two whole-window looks, so accepting a plan
truly slower than the margin stays below ``1 - confidence`` over all looks together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.decision import Decision
from lightning_rex.core.stats.endings import ending_p_value
from lightning_rex.core.stats.noninferiority import non_inferiority
from lightning_rex.core.stats.persistence import cold_start_flagged, persistent_ranks, pointing
from lightning_rex.core.stats.significance import imbalance_test
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec

if TYPE_CHECKING:
    from lightning_rex.core.decide.controller_state import ControllerState
    from lightning_rex.core.settings import DecisionSettings

__all__ = [
    "EARLY_LEVEL",
    "Looks",
    "SegmentBuffer",
    "closes_early",
    "early_imbalance",
    "validation_confidences",
]

EARLY_LEVEL = 0.1
"""An early look's significance level, as a fraction of a whole window's."""
_EARLY_EFFECT = 2.0
"""An early look's practical effect, as a multiple of ``min_effect``."""
MIN_RANK_STEPS = 10
"""A cold start's look tests single ranks only with at least this many steps."""
_EARLY_SHARE = 0.2
"""The share of validation's error budget spent on its early looks."""


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
    labels: np.ndarray | None = None,
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
            :func:`~lightning_rex.core.stats.persistence.cold_start_flagged` flags (ranks,
            and device kinds against each other), at an early look's levels.
        labels: Each rank's device group, or None (a cold start also tests kinds).

    Returns:
        The flagged ranks, sorted (empty when the evidence is not yet conclusive).
    """
    look_alpha, look_consistency = alpha * EARLY_LEVEL, consistency * EARLY_LEVEL
    effect = _EARLY_EFFECT * min_effect
    if cold:  # the cold start's tests, at an early look's levels
        sig = imbalance_test(wins[-1], alpha=look_alpha, min_effect=effect, min_inflation=floors[0])
        # a fresh fit's first look (5 steps) is too short for a rank test under autocorrelated
        # noise: there only device kinds, many ranks each, are tested against each other
        ranks = wins[-1].shape[1] >= MIN_RANK_STEPS
        return cold_start_flagged(wins[-1], sig, labels, look_alpha, effect, floors[0], ranks)
    # cheap first: the partial window must point at a rank on its own
    sig = imbalance_test(wins[-1], alpha=look_alpha, min_effect=effect, min_inflation=floors[0])
    points = pointing(sig, look_consistency, effect)
    if not bool(points.any()):
        return []
    flagged = persistent_ranks(
        wins,
        alpha=look_alpha,
        min_effect=effect,
        consistency=look_consistency,
        ending_alpha=ending_alpha,
        floors=floors,
    )
    # The rule vetoes a straggler that starts inside the latest window. Acting early also
    # needs it not to have started inside the first: a straggler that began late in the
    # window before and fills the partial one may be a transient of one window or less.
    if not flagged:
        return []
    # (the ranks flagged together are left out of the autocorrelation's reference: a kind
    # that slowed at once would otherwise hide its own start)
    started = ending_p_value(
        wins[0], flagged, slower=[not bool(sig.effect[r] > 1.0) for r in flagged]
    )
    return [r for r, p in zip(flagged, started) if p >= ending_alpha]


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


def closes_early(
    state: ControllerState,
    partial: Window,
    settings: DecisionSettings,
    window_steps: int,
    floors: tuple[float, float],
    confidence: float,
    labels: np.ndarray | None = None,
) -> bool:
    """Whether a partial window's evidence is clear enough to close the window now.

    Args:
        state: The controller's state (its phase, baseline, trial and recent windows).
        partial: The window so far.
        settings: The decision parameters.
        window_steps: Steps of a whole window.
        floors: Long-run variance factors from earlier windows.
        confidence: An early validation look's confidence.
        labels: Each rank's device group, or None.

    Returns:
        While validating: the plan is shown within the margin, or shown worse. While
        steady: :func:`early_imbalance` flags a rank.
    """
    if state.phase == "validating":
        if state.baseline is None or partial.n_steps < 2 or len(state.baseline) < 2:
            return False
        trial = [t for w in state.trial for t in w] + partial.step_max.tolist()
        verdict = non_inferiority(
            np.asarray(trial),
            np.asarray(state.baseline),
            margin=settings.margin,
            confidence=confidence,
        )
        return verdict.non_inferior or verdict.lower > verdict.bound
    cold = (state.reference is None and state.windows_seen == 0) or state.guess
    need = 1 if cold else settings.persistence
    # with more than one window needed, half a window first: a straggler shorter than
    # about (persistence - 1/2) windows is never acted on early
    if need > 1 and (len(state.recent) < need - 1 or 2 * partial.n_steps < window_steps):
        return False
    wins = [np.asarray(w) for w in state.recent[len(state.recent) - need + 1 :]]
    return bool(
        early_imbalance(
            [*wins, partial.times],
            cold=cold,
            alpha=settings.alpha,
            min_effect=settings.min_effect,
            consistency=settings.consistency,
            ending_alpha=settings.ending_alpha,
            floors=floors,
            labels=labels,
        )
    )


class Looks:
    """A controller's looks per window: the segments joined so far and each look's level.

    Args:
        window: The window the loop gathers: ``looks_per_window`` segments of ``segment``
            steps make a whole window (one look: whole windows only).
        validation_confidence: The validation's one-sided confidence over all its looks.
    """

    def __init__(self, window: WindowSpec, validation_confidence: float) -> None:
        from lightning_rex.core.decide.validating import MAX_WINDOWS

        self.looks = window.looks_per_window
        self.segments = None if self.looks == 1 else SegmentBuffer(window.whole)
        self.early_conf, self.whole_conf = validation_confidences(
            validation_confidence, self.looks, MAX_WINDOWS
        )

    @property
    def window_steps(self) -> int:
        """Steps of a whole window (0 with one look per window)."""
        return 0 if self.segments is None else self.segments.window_steps

    def clear(self) -> None:
        """Drop the segments held (a plan change, a restart)."""
        if self.segments is not None:
            self.segments.clear()

    def take(
        self,
        state: ControllerState,
        window: Window,
        settings: DecisionSettings,
        floors: tuple[float, float],
        labels: np.ndarray | None = None,
    ) -> tuple[Window | None, Window]:
        """The window to decide on now, if any, and the window so far.

        Args:
            state: The controller's state.
            window: A segment (or, with one look, a whole window).
            settings: The decision parameters.
            floors: Long-run variance factors from earlier windows.
            labels: Each rank's device group, or None.

        Returns:
            ``(window to decide on or None, the partial window)``: a whole window, one
            closed early (:func:`closes_early`), or a window of a plan that is not being
            measured (a rollback or proposal not yet in force, a plan set outside), which
            the state machine takes as it is.
        """
        if self.segments is None:
            return window, window
        measuring = state.pending if state.phase == "validating" else state.plan
        if state.phase == "rolling_back" or window.plan != measuring:
            self.segments.clear()
            return window, window
        partial = self.segments.add(window)
        whole = self.segments.window_steps
        if partial.n_steps >= whole or closes_early(
            state, partial, settings, whole, floors, self.early_conf, labels
        ):
            self.segments.clear()
            return partial, partial
        return None, partial

    def hold(self, state: ControllerState, partial: Window) -> Decision:
        """The hold after a look that decided nothing: the window is not yet whole.

        Args:
            state: The controller's state.
            partial: The window so far.

        Returns:
            A ``hold`` that names the steps looked at.
        """
        return Decision(
            "hold",
            None,
            state.predicted if state.phase == "validating" else None,
            float(partial.medians.max()),
            None,
            f"look after {partial.n_steps} of {self.window_steps} steps: not yet conclusive",
            partial.step_end,
        )

    def state_dict(self) -> list[dict[str, Any]]:
        """The segments held, as JSON-able data."""
        return [] if self.segments is None else self.segments.state_dict()

    def load_state_dict(self, d: Any) -> None:
        """Restore :meth:`state_dict` output.

        Args:
            d: The saved segments.

        Raises:
            ValueError: If a saved segment is malformed.
        """
        if self.segments is not None:
            self.segments.load_state_dict(d)
