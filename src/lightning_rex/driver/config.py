"""How the window loop runs: :class:`LoopConfig` (window, looks, decision lag, warm-up).

Training's :class:`~lightning_rex.RexCallback` builds one from its arguments, the simulator
from the scenario and the policy (:func:`~lightning_rex.sim.engine.default_loop`); the
:class:`~lightning_rex.driver.loop.WindowDriver` runs by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_rex.core.checks import is_integer

__all__ = ["LoopConfig"]


@dataclass(frozen=True)
class LoopConfig:
    """How the window loop runs.

    Args:
        window: Steps per observation window (an integer >= 5).
        decision_lag: Steps from a window's (or segment's) end to the exchange of its
            decision, and between polls for a decision not ready yet; None for
            ``segment // 2``. In ``[1, segment)``.
        warmup: Steps at the start of a fit that are never measured (>= 0); not applied
            again when resuming on the same world size.
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
        first_look: With ``looks > 1``, the steps of a fresh fit's first gather after the
            warm-up (the cold start's look at the initial plan, a guess worth replacing
            early); its decision is exchanged ``first_look // 2`` steps later (at least 1).
            None: ``min_steps``. In ``[min_steps, segment]``.
        estimate: After every window, record the decider's estimate of the even split's
            step time (``even_step_ms`` in the record: what the report sets the measured
            throughput against). The simulator, which knows the true times, turns it off.
        max_warmup: The most steps the warm-up may last (an integer >= 0). After ``warmup``
            steps it goes on while rank 0 finds, in a gathered block, any rank's steps
            still getting faster (:func:`~lightning_rex.core.stats.at_speed.warming_ranks`):
            the block is dropped and the next one judged, until every rank is at speed or
            the block ends at ``max_warmup``. ``max_warmup <= warmup``: a fixed warm-up.

    Raises:
        ValueError: Naming the argument, for values outside those ranges.
    """

    window: int = 30
    decision_lag: int | None = None
    warmup: int = 1
    background: bool = True
    apply_plans: bool = True
    min_steps: int = 5
    looks: int = 1
    first_look: int | None = None
    estimate: bool = True
    max_warmup: int = 200

    def __post_init__(self) -> None:
        if not (is_integer(self.window) and self.window >= 5):
            raise ValueError(f"window must be an integer >= 5 steps, got {self.window!r}")
        if not (is_integer(self.looks) and self.looks >= 1):
            raise ValueError(f"looks must be an integer >= 1, got {self.looks!r}")
        if not isinstance(self.background, bool):
            raise ValueError(f"background must be True or False, got {self.background!r}")
        if not isinstance(self.estimate, bool):
            raise ValueError(f"estimate must be True or False, got {self.estimate!r}")
        if self.segment < 5:
            raise ValueError(
                f"looks={self.looks} cuts window={self.window} into segments of"
                f" {self.segment} steps: each needs >= 5"
            )
        if not (is_integer(self.warmup) and self.warmup >= 0):
            raise ValueError(f"warmup must be an integer >= 0 steps, got {self.warmup!r}")
        if not (is_integer(self.max_warmup) and self.max_warmup >= 0):
            raise ValueError(f"max_warmup must be an integer >= 0 steps, got {self.max_warmup!r}")
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
        """Steps per gather: ``window // looks``."""
        return int(self.window) // int(self.looks)

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
