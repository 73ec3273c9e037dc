"""The observation window's shape, validated once: :class:`WindowSpec`.

A window is ``steps`` steps, gathered in ``looks`` segments of ``segment`` steps, after a
warm-up of ``warmup`` to ``max_warmup`` unmeasured steps. Training's
:class:`~lightning_rex.RexCallback` builds one from its arguments, the simulator one from the
scenario and the policy (:func:`~lightning_rex.sim.engine.engine.default_loop`); the same
object goes to the window loop (:attr:`LoopConfig.window
<lightning_rex.driver.config.LoopConfig>`) and to the controller (:attr:`DecisionSettings.window
<lightning_rex.core.settings.DecisionSettings>`), so the segments the driver gathers are the
segments the controller joins.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_rex.core.checks import is_integer

__all__ = ["MIN_SEGMENT", "WindowSpec", "default_looks"]

MIN_SEGMENT = 5
"""The fewest steps a window, and each of its segments, may have."""


def default_looks(window: int) -> int:
    """Looks per window when none is asked for: up to 3, with segments of >= 10 steps.

    Args:
        window: Steps per window.

    Returns:
        ``max(1, min(3, window // 10))``: 3 for the default window of 30, 1 below 20.
    """
    return max(1, min(3, int(window) // 10))


@dataclass(frozen=True)
class WindowSpec:
    """The window the loop gathers and the controller decides on.

    Args:
        steps: Steps per whole window (an integer >= 5).
        looks: Gathers per window: every ``segment = steps // looks`` steps the ranks'
            samples are gathered and handed to the decider, which joins a window's segments
            and may act before the window is whole; None for :func:`default_looks` (3 at
            30 steps). ``segment`` must be >= 5.
        warmup: Steps at the start of a fit that are never measured (>= 0); not applied
            again when resuming on the same world size.
        max_warmup: The most steps the warm-up may last (an integer >= 0). After ``warmup``
            steps it goes on while rank 0 finds, in a gathered block, any rank's steps
            still getting faster (:func:`~lightning_rex.core.stats.at_speed.warming_ranks`):
            the block is dropped and the next one judged, until every rank is at speed or
            the block ends at ``max_warmup``. ``max_warmup <= warmup``: a fixed warm-up.

    Raises:
        ValueError: Naming the argument, for values outside those ranges.
    """

    steps: int = 30
    looks: int | None = None
    warmup: int = 1
    max_warmup: int = 200

    def __post_init__(self) -> None:
        if not (is_integer(self.steps) and self.steps >= MIN_SEGMENT):
            raise ValueError(
                f"window must be an integer >= {MIN_SEGMENT} steps, got {self.steps!r}"
            )
        if self.looks is not None and not (is_integer(self.looks) and self.looks >= 1):
            raise ValueError(f"looks must be an integer >= 1 or None, got {self.looks!r}")
        if self.segment < MIN_SEGMENT:
            raise ValueError(
                f"looks={self.looks} cuts window={self.steps} into segments of"
                f" {self.segment} steps: each needs >= {MIN_SEGMENT}"
            )
        if not (is_integer(self.warmup) and self.warmup >= 0):
            raise ValueError(f"warmup must be an integer >= 0 steps, got {self.warmup!r}")
        if not (is_integer(self.max_warmup) and self.max_warmup >= 0):
            raise ValueError(f"max_warmup must be an integer >= 0 steps, got {self.max_warmup!r}")

    @property
    def looks_per_window(self) -> int:
        """``looks``, or the default for the window."""
        return default_looks(self.steps) if self.looks is None else int(self.looks)

    @property
    def segment(self) -> int:
        """Steps per gather: ``steps // looks_per_window``."""
        return int(self.steps) // self.looks_per_window

    @property
    def whole(self) -> int:
        """Steps of the whole window the segments make: ``looks_per_window * segment``."""
        return self.looks_per_window * self.segment

    def for_steps(self, steps: int) -> WindowSpec:
        """The same looks and warm-up over a window of another length.

        Args:
            steps: Steps per whole window.

        Returns:
            A new spec (``looks`` None stays None: the default for the new length).
        """
        return WindowSpec(steps, self.looks, self.warmup, self.max_warmup)
