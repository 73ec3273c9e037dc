"""Which rank has stopped while the others wait for it: the hang watchdog's rule.

Synchronous training cannot tell a slow rank from a hung one at a collective: the ranks that
arrive wait, by default for NCCL's 30 minutes, and a rank stuck in user code (a deadlock, a
``time.sleep``, a dead file system) is never noticed by its own collectives. The watchdog
(:mod:`lightning_rex.lightning.watchdog`) follows every rank's *progress*, a counter each
rank advances at the points of every step it passes (batch start, backward, batch end, and
around lightning-rex's own collectives), with its *age*: the seconds since it last moved, on
that rank's own clock. A rank ``r`` is **silent** when another rank ``j`` is ahead of it and

    min(age_r, age_j) > limit = max(floor, factor x the slowest rank's typical step),

for the longest-standing such ``j``: over the last ``min(age_r, age_j)`` seconds ``r`` stood
still at its count and ``j`` stood at a higher one, so ``r`` has been behind for at least
that long. A pause every rank shares (validation, a checkpoint write, a slow first step) is
never counted: nobody is ahead during it, and when the first rank moves on, its age starts
from zero, so a rank that follows a moment later (a slow fetch after the pause) is behind
only for that moment. Ages are read from each rank's latest publication, so a rank is
found at most one publication interval late; no clock is compared across processes. This
module holds the rule, framework-free, so that it can be tested with injected values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Hang", "HangDetector"]


@dataclass(frozen=True)
class Hang:
    """A silent rank.

    Attributes:
        rank: The silent rank (the one stalled longest; the lowest of equals).
        stalled_s: Seconds it has stood behind another rank without moving.
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
    """Find a rank that stands behind another for longer than the limit (module docstring).

    Args:
        world_size: The number of ranks.
        floor_s: The shortest limit, seconds (> 0).
        factor: The limit is at least this many times the slowest rank's typical step (>= 1).
    """

    def __init__(self, world_size: int, floor_s: float, factor: float) -> None:
        if not (math.isfinite(floor_s) and floor_s > 0):
            raise ValueError(f"floor_s must be a finite number > 0, got {floor_s!r}")
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
        self.world_size = int(world_size)
        self.floor_s = float(floor_s)
        self.factor = float(factor)

    def limit(self, step_s: Sequence[float]) -> float:
        """The limit for typical step times ``step_s`` (non-finite entries are unknown).

        Args:
            step_s: Each rank's typical step time in seconds.

        Returns:
            ``max(floor, factor x max(step_s))``.
        """
        known = [s for s in step_s if math.isfinite(s) and s > 0]
        return max(self.floor_s, self.factor * max(known, default=0.0))

    def stalls(self, progress: Sequence[int], ages: Sequence[float]) -> list[float]:
        """Each rank's seconds behind another rank without moving (0 for a rank not behind).

        Args:
            progress: Each rank's progress counter.
            ages: Each rank's seconds since its counter last moved (NaN: unknown, taken as 0).

        Returns:
            ``min(age_r, max(age_j for j ahead of r))`` per rank.
        """
        count = np.asarray(progress, dtype=np.int64)
        age = np.asarray(ages, dtype=np.float64)
        age = np.where(np.isfinite(age) & (age > 0), age, 0.0)
        order = np.argsort(count, kind="stable")
        # the oldest age among the ranks from each sorted position on (0 past the end)
        oldest = np.append(np.maximum.accumulate(age[order][::-1])[::-1], 0.0)
        first_ahead = np.searchsorted(count[order], count, side="right")
        return [float(x) for x in np.minimum(age, oldest[first_ahead])]

    def observe(
        self, progress: Sequence[int], step_s: Sequence[float], ages: Sequence[float]
    ) -> Hang | None:
        """Take every rank's progress and age; return a silent rank, if any.

        Args:
            progress: Each rank's progress counter.
            step_s: Each rank's typical step time in seconds (NaN when unknown).
            ages: Each rank's seconds since its counter last moved (its own clock).

        Returns:
            The :class:`Hang`, or None.

        Raises:
            ValueError: If there is not one entry per rank.
        """
        n = self.world_size
        if len(progress) != n or len(step_s) != n or len(ages) != n:
            raise ValueError(f"expected {n} entries per argument")
        limit = self.limit(step_s)
        stalls = self.stalls(progress, ages)
        behind = [(s, r) for r, s in enumerate(stalls) if s > limit]
        if not behind:
            return None
        stalled, rank = max(behind, key=lambda x: (x[0], -x[1]))
        return Hang(rank, stalled, limit, tuple(int(p) for p in progress))
