"""Which rank has stopped while the others wait for it: the hang watchdog's rule.

Synchronous training cannot tell a slow rank from a hung one at a collective: the ranks that
arrive wait, by default for NCCL's 30 minutes, and a rank stuck in user code (a deadlock, a
``time.sleep``, a dead file system) is never noticed by its own collectives. The watchdog
(:mod:`lightning_rex.lightning.watchdog`) follows every rank's *progress*, a counter each
rank advances at the points of every step it passes (batch start, backward, batch end). A
rank is **silent** when its progress is behind another rank's and has not moved for

    limit = max(floor, factor x the slowest rank's typical step time),

on the clock of the process that looks. Ranks waiting at a collective all stand at the same
point, so none of them is behind; validation and checkpoints, where no rank advances,
never look like a hang. This module holds that rule, framework-free, so that it can be
tested with injected clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Hang", "HangDetector"]


@dataclass(frozen=True)
class Hang:
    """A silent rank.

    Attributes:
        rank: The silent rank (the one stalled longest; the lowest of equals).
        stalled_s: Seconds its progress has not moved while another rank's was ahead.
        limit_s: The limit it passed.
        progress: Every rank's progress when it was found.
    """

    rank: int
    stalled_s: float
    limit_s: float
    progress: tuple[int, ...]

    def message(self) -> str:
        """What to tell the user."""
        ahead = max(self.progress)
        return (
            f"rank {self.rank} made no progress for {self.stalled_s:.0f} s while other ranks "
            f"waited for it (limit {self.limit_s:.0f} s; progress {self.progress[self.rank]} "
            f"against {ahead}): it is hung or stalled outside lightning-rex, for example in "
            "its training_step, its data loading or its file system"
        )


class HangDetector:
    """Watch every rank's progress and find one that stopped while others are ahead.

    Args:
        world_size: The number of ranks.
        floor_s: The shortest limit, seconds (> 0).
        factor: The limit is at least this many times the slowest rank's typical step.
    """

    def __init__(self, world_size: int, floor_s: float, factor: float) -> None:
        if not (math.isfinite(floor_s) and floor_s > 0):
            raise ValueError(f"floor_s must be a finite number > 0, got {floor_s!r}")
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
        self.world_size = int(world_size)
        self.floor_s = float(floor_s)
        self.factor = float(factor)
        self._last: list[int] = [-1] * self.world_size
        self._since: list[float] = [math.nan] * self.world_size

    def limit(self, step_s: Sequence[float]) -> float:
        """The limit for typical step times ``step_s`` (non-finite entries are unknown).

        Args:
            step_s: Each rank's typical step time in seconds.

        Returns:
            ``max(floor, factor x max(step_s))``.
        """
        known = [s for s in step_s if math.isfinite(s) and s > 0]
        return max(self.floor_s, self.factor * max(known, default=0.0))

    def observe(self, progress: Sequence[int], step_s: Sequence[float], now: float) -> Hang | None:
        """Take every rank's progress at ``now``; return a silent rank, if any.

        Args:
            progress: Each rank's progress counter.
            step_s: Each rank's typical step time in seconds (NaN when unknown).
            now: The looking process's clock, seconds.

        Returns:
            The :class:`Hang`, or None.

        Raises:
            ValueError: If there is not one entry per rank.
        """
        if len(progress) != self.world_size or len(step_s) != self.world_size:
            raise ValueError(f"expected {self.world_size} entries per argument")
        for rank_index, count in enumerate(progress):
            if count != self._last[rank_index]:
                self._last[rank_index], self._since[rank_index] = int(count), float(now)
        ahead = max(progress)
        limit = self.limit(step_s)
        behind = [
            (now - self._since[r], r)
            for r, p in enumerate(progress)
            if p < ahead and now - self._since[r] > limit
        ]
        if not behind:
            return None
        stalled, rank = max(behind, key=lambda x: (x[0], -x[1]))
        return Hang(rank, stalled, limit, tuple(int(p) for p in progress))
