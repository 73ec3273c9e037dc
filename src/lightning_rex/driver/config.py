"""How the window loop runs: :class:`LoopConfig` (the window, decision lag, first look).

Training's :class:`~lightning_rex.RexCallback` builds one from its arguments, the simulator
from the scenario and the policy (:func:`~lightning_rex.sim.engine.engine.default_loop`); the
:class:`~lightning_rex.driver.loop.WindowDriver` runs by it. Its
:class:`~lightning_rex.core.window_spec.WindowSpec` is the object the controller gets too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_rex.core.checks import is_integer
from lightning_rex.core.window_spec import WindowSpec

__all__ = ["LoopConfig"]


@dataclass(frozen=True)
class LoopConfig:
    """How the window loop runs.

    Args:
        window: The window: its steps, looks, segment and warm-up (a
            :class:`~lightning_rex.core.window_spec.WindowSpec`, the one the controller's
            settings hold).
        decision_lag: Steps from a window's (or segment's) end to the exchange of its
            decision, and between polls for a decision not ready yet; None for
            ``segment // 2``. In ``[1, segment)``.
        background: Run the decider in a background thread on rank 0 (training never waits
            for it); False runs it inline, so every decision lands on a step fixed in advance.
        apply_plans: Apply decisions; False is monitor-only (proposals become
            ``recommend`` records and the decider is told they were declined).
        min_steps: The fewest usable steps a window (or segment) needs after dropping bad
            samples.
        first_look: With ``looks > 1``, the steps of a fresh fit's first gather after the
            warm-up (the cold start's look at the initial plan, a guess worth replacing
            early); its decision is exchanged ``first_look // 2`` steps later (at least 1).
            None: ``min_steps``. In ``[min_steps, segment]``.
        estimate: After every window, record the decider's estimate of the even split's
            step time (``even_step_ms`` in the record: what the report sets the measured
            throughput against). The simulator, which knows the true times, turns it off.

    Raises:
        ValueError: Naming the argument, for values outside those ranges.
    """

    window: WindowSpec = field(default_factory=WindowSpec)
    decision_lag: int | None = None
    background: bool = True
    apply_plans: bool = True
    min_steps: int = 5
    first_look: int | None = None
    estimate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.window, WindowSpec):
            raise ValueError(f"window must be a WindowSpec, got {type(self.window).__name__}")
        if not isinstance(self.background, bool):
            raise ValueError(f"background must be True or False, got {self.background!r}")
        if not isinstance(self.estimate, bool):
            raise ValueError(f"estimate must be True or False, got {self.estimate!r}")
        if not (is_integer(self.min_steps) and 1 <= self.min_steps <= self.segment):
            raise ValueError(
                f"min_steps must be in [1, segment={self.segment}], got {self.min_steps}"
            )
        first = self.first_look
        if first is not None and not (
            is_integer(first) and self.min_steps <= first <= self.segment
        ):
            raise ValueError(
                f"first_look must be an integer in [min_steps={self.min_steps},"
                f" segment={self.segment}], got {first}"
            )
        lag = self.decision_lag
        if (lag is not None and not is_integer(lag)) or not 1 <= self.lag < self.segment:
            raise ValueError(
                f"decision_lag must be in [1, segment={self.segment}), got {self.decision_lag}"
            )

    @property
    def segment(self) -> int:
        """Steps per gather (the window's ``segment``)."""
        return self.window.segment

    @property
    def looks(self) -> int:
        """Gathers per window (the window's ``looks_per_window``)."""
        return self.window.looks_per_window

    @property
    def lag(self) -> int:
        """The decision lag in steps."""
        return self.segment // 2 if self.decision_lag is None else self.decision_lag

    def look(self, first: bool) -> tuple[int, int]:
        """``(steps, lag)`` of a gather: a fresh fit's first one, or any other.

        Args:
            first: Whether the gather is a fresh fit's first.

        Returns:
            Its length in steps and the lag of its decision.
        """
        return (self.first_segment, self.first_lag) if first else (self.segment, self.lag)

    @property
    def first_segment(self) -> int:
        """Steps of a fresh fit's first gather: ``first_look`` with looks, else ``segment``."""
        if self.looks == 1:
            return self.segment
        return int(self.min_steps if self.first_look is None else self.first_look)

    @property
    def first_lag(self) -> int:
        """The decision lag after the first gather: ``lag``, at most half the first look."""
        return min(self.lag, max(1, self.first_segment // 2))
