"""How the window loop runs: :class:`LoopConfig` (window, looks, decision lag, warm-up).

Training's :class:`~lightning_rex.RexCallback` builds one from its arguments, the simulator
from the scenario and the policy (:func:`~lightning_rex.sim.engine.default_loop`); the
:class:`~lightning_rex.driver.loop.WindowDriver` runs by it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoopConfig"]


@dataclass(frozen=True)
class LoopConfig:
    """How the window loop runs.

    Args:
        window: Steps per observation window (an integer >= 5).
        decision_lag: Steps from a window's (or segment's) end to the exchange of its
            decision, and between polls for a decision not ready yet; None for
            ``segment // 2``. In ``[1, segment)``.
        warmup: Steps at the start of a fit that are not measured (>= 0); not applied again
            when resuming on the same world size.
        background: Run the decider in a background thread on rank 0 (training never waits
            for it); False runs it inline, so every decision lands on a step fixed in advance.
        apply_plans: Apply decisions; False is monitor-only (proposals become
            ``recommend`` records and the decider is told they were declined).
        min_steps: The fewest usable steps a window (or segment) needs after dropping bad
            samples.
        looks: Gathers per window: every ``segment = window // looks`` steps the ranks'
            samples are gathered and handed to the decider, which joins a window's segments
            and may act before the window is whole (``Controller(looks=...)``). 1: one
            gather per window. ``segment`` must be >= 5.

    Raises:
        ValueError: Naming the argument, for values outside those ranges.
    """

    window: int = 30
    decision_lag: int | None = None
    warmup: int = 10
    background: bool = True
    apply_plans: bool = True
    min_steps: int = 5
    looks: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 5:
            raise ValueError(f"window must be an integer >= 5 steps, got {self.window}")
        if isinstance(self.looks, bool) or int(self.looks) != self.looks or self.looks < 1:
            raise ValueError(f"looks must be an integer >= 1, got {self.looks}")
        if self.segment < 5:
            raise ValueError(
                f"looks={self.looks} cuts window={self.window} into segments of"
                f" {self.segment} steps: each needs >= 5"
            )
        if isinstance(self.warmup, bool) or int(self.warmup) != self.warmup or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0 steps, got {self.warmup}")
        if not 1 <= self.min_steps <= self.segment:
            raise ValueError(
                f"min_steps must be in [1, segment={self.segment}], got {self.min_steps}"
            )
        if not 1 <= self.lag < self.segment or int(self.lag) != self.lag:
            raise ValueError(
                f"decision_lag must be in [1, segment={self.segment}), got {self.decision_lag}"
            )

    @property
    def segment(self) -> int:
        """Steps per gather: ``window // looks``."""
        return int(self.window) // int(self.looks)

    @property
    def lag(self) -> int:
        """The decision lag in steps."""
        return self.segment // 2 if self.decision_lag is None else self.decision_lag
