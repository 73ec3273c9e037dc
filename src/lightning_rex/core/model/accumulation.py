"""The time model's accumulation passes: it learns one pass, it predicts whole steps.

A rank's pass cap (:mod:`lightning_rex.core.passes`) is the largest micro-batch it runs in
one forward/backward pass; a larger size runs as ``k = ceil(b / c)`` passes. The time model
learns every rank's *single-pass* time: a window measured while a rank accumulated is turned
into one pass, ``(b / k, T / k)`` (:func:`~lightning_rex.core.passes.per_pass`), before the
posterior sees it, under the caps the window ran with (kept per window, since caps move).
What it predicts is a *step*: ``t_r(b) = m t1(q + 1) + (k - m) t1(q)`` under each rank's
current cap (:func:`~lightning_rex.core.passes.pass_total`), a staircase that rises by a
pass's fixed cost at every multiple of the cap, and never below the single-pass curve at
``b`` itself: a pass's fixed cost is not negative, so splitting a batch never saves time (a
fit whose overhead came out negative, from sizes too close together to separate overhead
from rate, would otherwise offer accumulation as a speed-up). So every reader of the model
(the planner's water-filling, validation, change points, the global batch scaler) prices
accumulation without knowing about it. The optimistic quantile of a step is the sum of its
passes' quantiles: the passes share one curve, so their errors move together.

:class:`AccumulationCaps` is the part of the time model
(:class:`~lightning_rex.core.model.time_model.RankTimeModel`) that knows the caps: the model
holds one, hands it the windows it learns from, and asks it for steps with its single-pass
predictions. Without any cap it changes nothing: the data and the predictions are the tile
mixture's own, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lightning_rex.core.passes import cap_array, pass_split, pass_total, per_pass

__all__ = ["AccumulationCaps", "GridPredictor", "PlanPredictor"]


GridPredictor = Callable[[np.ndarray, float, int], tuple[np.ndarray, np.ndarray]]
"""``(sizes, kappa, var_points) -> (mean, quantile)``, each ``(N, G)``: a grid prediction."""
PlanPredictor = Callable[[tuple[int, ...]], np.ndarray]
"""``plan -> (N,)`` seconds: every rank's time at its size in the plan."""


class AccumulationCaps:
    """Pass caps now and per window; observations as single passes; predictions as steps.

    Args:
        world_size: The number of ranks ``N``.
        caps: Per-rank caps (samples per pass, None entries for none), or None.

    Raises:
        ValueError: For the wrong number of caps or a cap below 1.
    """

    def __init__(self, world_size: int, caps: Sequence[int | None] | None = None) -> None:
        self.world_size = int(world_size)
        self.current: np.ndarray | None = cap_array(caps, self.world_size)
        self.windows: list[list[int] | None] = []  # the caps each held window ran under

    def set(self, caps: Sequence[int | None] | None) -> None:
        """Each rank's current pass cap: the next windows run under it, predictions use it.

        Args:
            caps: Per-rank caps (samples per pass, None entries for none), or None.

        Raises:
            ValueError: For the wrong number of caps or a cap below 1.
        """
        self.current = cap_array(caps, self.world_size)

    def as_list(self) -> list[int | None] | None:
        """The current pass caps (None entries for none), or None when no rank has one."""
        if self.current is None:
            return None
        return [None if cap <= 0 else int(cap) for cap in self.current]

    def row(self) -> list[int] | None:
        """The current caps as a window's record (0: none), or None without caps."""
        return None if self.current is None else [int(cap) for cap in self.current]

    def _window_caps(self, rows: Sequence[list[int] | None]) -> np.ndarray | None:
        """Windows' caps as ``(N, W)`` (0: none), or None when no window had any."""
        if all(r is None for r in rows):
            return None
        zero = [0] * self.world_size
        return np.asarray([zero if r is None else r for r in rows], dtype=np.int64).T

    def single_passes(
        self, sizes: np.ndarray, times: np.ndarray, rows: Sequence[list[int] | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Windows' sizes and times ``(N, W)`` as single passes under their caps.

        Args:
            sizes: Per-rank sizes, ``(N, W)`` (or ``(N,)`` for one window).
            times: Their medians, of the same shape.
            rows: Each window's caps (from :meth:`row`).

        Returns:
            ``(sizes, times)``; the inputs themselves when no window had caps.
        """
        caps = self._window_caps(rows)
        if caps is None:
            return sizes, times
        return per_pass(sizes, times, caps.reshape(np.shape(sizes)))

    def step_grid(
        self, single: GridPredictor, sizes: np.ndarray, kappa: float = 0.0, var_points: int = 96
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and optimistic quantile of every rank's step time on a size grid.

        A rank whose size exceeds its pass cap takes the sum of its passes' single-pass
        predictions (see the module docstring); without caps this is ``single``'s own.

        Args:
            single: The single-pass prediction on a grid (the tile mixture's).
            sizes: The grid, shape ``(G,)``, shared by all ranks.
            kappa: Standard deviations of the quantile below the mean (0: the mean).
            var_points: Points the quantile's distance is computed on (then interpolated).

        Returns:
            ``(mean, quantile)``, both shape ``(N, G)`` in seconds.
        """
        caps = self.current
        if caps is None:
            return single(sizes, kappa, var_points)
        grid = np.rint(np.asarray(sizes, dtype=np.float64)).astype(np.int64)
        k, q, m = pass_split(grid[None, :], caps[:, None])
        q_next = np.where(m > 0, q + 1, q)
        need = np.unique(np.concatenate([grid, q.ravel(), q_next.ravel()]))
        mean1, quant1 = single(need.astype(np.float64), kappa, var_points)
        rows = np.arange(self.world_size)[:, None]
        index_q, index_q_next = np.searchsorted(need, q), np.searchsorted(need, q_next)
        whole = np.searchsorted(need, grid)[None, :]
        mean = np.maximum(
            pass_total(k, m, mean1[rows, index_q], mean1[rows, index_q_next]), mean1[rows, whole]
        )
        if kappa <= 0:
            return mean, mean.copy()
        low = pass_total(k, m, quant1[rows, index_q], quant1[rows, index_q_next])
        return mean, np.maximum(low, quant1[rows, whole])

    def step_times(self, single: PlanPredictor, plan: tuple[int, ...]) -> np.ndarray:
        """Mean step time of every rank at its size in ``plan``, passes included.

        Args:
            single: The single-pass prediction at a plan (the tile mixture's).
            plan: Per-rank sizes.

        Returns:
            Seconds, shape ``(N,)``.
        """
        caps = self.current
        if caps is None:
            return single(plan)
        k, q, m = pass_split(np.asarray(plan, dtype=np.int64), caps)
        whole = single(tuple(int(b) for b in plan))
        if not bool((k > 1).any()):
            return whole
        time_q = single(tuple(int(x) for x in q))
        time_q_next = single(tuple(int(x) for x in q + 1)) if bool((m > 0).any()) else time_q
        return np.maximum(pass_total(k, m, time_q, time_q_next), whole)
