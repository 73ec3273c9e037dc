"""Water-filling: the integer plan that minimises the largest predicted time of any rank.

:func:`water_fill` finds, on each rank's predicted time curve, the smallest level ``T`` with
``sum_r b_r(T) >= B``, where ``b_r(T)`` is the largest size in ``[lo_r, hi_r]`` whose
running maximum of predicted time is ``<= T``: the ``k``-th smallest time among the sizes the
bounds allow (``k = B - sum lo``), found exactly with one partial sort. The samples left over
at that level go to the ranks in order of their time at their next size. Nothing assumes a
curve convex or smooth: on nondecreasing curves, such as the staircases of accumulation
passes (:mod:`~lightning_rex.core.model.accumulation`), that level is the exact minimax; on
others the running maximum is a bound the plan's true times never exceed.

The plan is lexicographically minimax. When a rank's time at its *minimum* size already
sets the level (a rank slower at ``lo`` than the others can ever be), the level is forced:
every rank whose time at its minimum is that level gets what is free at it, and the rest are
water-filled again, so that they stay balanced among themselves. The ranks are taken in
order of their time at their minimum, slowest first; whether the level is still forced after
``g`` groups of them is monotone in ``g``, so the last forced group is found by bisection
over the groups. A plan costs ``O(N G log N)`` for ``N`` ranks and ``G`` sizes, against
``O(N^2 G)`` for one group at a time (4096 ranks: milliseconds, not seconds).

Several batches under the same bounds (the scaler's candidates) share one sort of the allowed
entries: what the ranks hold at a level is then a binary search, and each batch's level is
read off the sorted entries and checked exactly, instead of bracketed by a bisection per batch
(at 4096 ranks, 24 batches took 0.4-0.5 s, a bisection costing a millisecond a step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_rex.core.plans.plan import Plan

__all__ = ["water_fill", "water_fill_many"]


def water_fill(curves: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> Plan:
    """The integer plan minimising ``max_r curves[r, b_r - 1]`` under ``sum b = total``.

    Args:
        curves: Predicted times, shape ``(N, G)``; column ``j`` is size ``j + 1``. Must
            cover every size up to ``hi.max()``.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.

    Returns:
        The plan, a tuple of ints summing to ``total`` within the bounds.

    Raises:
        ValueError: If the bounds cannot hold ``total`` or the grid is too short.
    """
    return water_fill_many(curves, [total], lo, hi)[0]


def water_fill_many(
    curves: np.ndarray,
    totals: Sequence[int],
    lo: np.ndarray,
    hi: np.ndarray,
    monotone: bool = False,
) -> list[Plan]:
    """:func:`water_fill` for several global batches under the same bounds, sharing the work.

    Args:
        curves: Predicted times, shape ``(N, G)`` (as :func:`water_fill`'s).
        totals: The global batches.
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.
        monotone: The curves are already their running maxima along each row.

    Returns:
        One plan per batch, each what :func:`water_fill` gives.

    Raises:
        ValueError: If the bounds cannot hold a batch or the grid is too short.
    """
    num_sizes = curves.shape[1]
    low = np.asarray(lo, dtype=np.int64)
    high = np.asarray(hi, dtype=np.int64)
    if int(high.max()) > num_sizes:
        raise ValueError(
            f"curves cover sizes up to {num_sizes}, but a bound allows {int(high.max())}"
        )
    for total in totals:
        if int(low.sum()) > total or int(high.sum()) < total:
            raise ValueError(
                f"bounds sum to [{int(low.sum())}, {int(high.sum())}], not containing {total}"
            )
    env = np.asarray(curves, dtype=np.float64)
    if not monotone:
        env = np.maximum.accumulate(env, axis=1)
    filling = _Filling(env, low, high, shared=len(totals) >= _SHARE_FROM)
    return [tuple(filling.plan(int(t)).tolist()) for t in totals]


_SHARE_FROM = 2
"""Batches under one set of bounds from which their levels are read off one sort."""


def _fill(env: np.ndarray, level: float | np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Each rank's largest size in ``[lo, hi]`` whose time is at most ``level``."""
    return np.clip(_count(env, level), lo, hi)


def _count(env: np.ndarray, level: float | np.ndarray) -> np.ndarray:
    """How many of each row's leading entries are at most ``level`` (scalar or per row).

    ``env`` rises along each row (NaN only at a row's end), so those entries are a prefix:
    a branch-free bisection over the columns, all rows at once, in ``O(N log G)``.
    """
    num_rows, num_cols = env.shape
    flat = env.reshape(-1)
    base = np.arange(num_rows, dtype=np.int64) * num_cols - 1
    limit = np.broadcast_to(np.asarray(level, dtype=np.float64).reshape(-1), (num_rows,))
    count = np.zeros(num_rows, dtype=np.int64)
    step = 1 << (num_cols.bit_length() - 1) if num_cols else 0
    while step:
        longer = count + step
        fits = longer <= num_cols
        fits &= flat.take(base + np.minimum(longer, num_cols)) <= limit
        count = np.where(fits, longer, count)
        step >>= 1
    return count


class _Filling:
    """One set of curves and bounds, planned for any number of global batches.

    What does not depend on the batch (the groups of ranks by their time at their minimum,
    each rank's share at its own level, what the ranks hold at each group's level) is
    computed once, so the scaler's candidate batches share it. With ``shared``, the allowed
    entries (sizes in ``(lo, hi]``) are also sorted once: the ranks hold ``sum lo`` plus the
    number of them at or below a level.
    """

    def __init__(self, env: np.ndarray, lo: np.ndarray, hi: np.ndarray, shared: bool) -> None:
        num_ranks, num_sizes = env.shape
        self.env, self.lo, self.hi = env, lo, hi
        at_lo = env[np.arange(num_ranks), lo - 1]
        self.order = np.argsort(-at_lo, kind="stable")
        self.levels = at_lo[self.order]
        self.starts = np.flatnonzero(np.r_[True, self.levels[1:] != self.levels[:-1]])
        self.ends = np.r_[self.starts[1:], num_ranks]
        self.own = _fill(env, at_lo[:, None], lo, hi)  # each rank's share at its own level
        self.got = np.add.reduceat(self.own[self.order], self.starts)  # per group, forced
        lo_g = np.add.reduceat(lo[self.order], self.starts)
        self.before = np.r_[0, np.cumsum(self.got)[:-1]]  # given to the groups before
        self.lo_before = np.r_[0, np.cumsum(lo_g)[:-1]]
        self.lo_after = int(lo.sum()) - self.lo_before - lo_g
        self._held: dict[int, int] = {}
        self.sorted: np.ndarray | None = None
        if shared:
            cols = np.arange(num_sizes)
            allowed = (cols >= lo[:, None]) & (cols < hi[:, None])
            self.sorted = np.sort(env[allowed])  # (NaN last: never at or below a level)

    def holding(self, level: float) -> int:
        """What all ranks hold at ``level``: ``sum fill(level)``."""
        if self.sorted is None or np.isnan(level):
            return int(_fill(self.env, level, self.lo, self.hi).sum())
        return int(self.lo.sum()) + int(np.searchsorted(self.sorted, level, side="right"))

    def guess(self, k: int) -> float | None:
        """The ``k``-th smallest allowed entry of all ranks (a level to check), if sorted."""
        if self.sorted is None or not 0 < k <= self.sorted.size:
            return None
        return float(self.sorted[k - 1])

    def held(self, k: int) -> int:
        """What the ranks left after ``k`` forced groups hold at the level of group ``k``."""
        if k not in self._held:
            level = float(self.levels[self.starts[k]])
            self._held[k] = self.holding(level) - int(self.lo_before[k])
        return self._held[k]

    def plan(self, total: int) -> np.ndarray:
        """The plan for ``total``: the forced groups, slowest first, then one free level.

        Args:
            total: The global batch.

        Returns:
            The sizes, in rank order.
        """
        env, low, high, order, starts = self.env, self.lo, self.hi, self.order, self.starts
        num_groups = starts.size
        remaining = total - self.before
        # A forced group whose share leaves the later groups less than their minimums
        # ("limited") ends the forcing: it takes what is left above their minimums.
        limited = np.flatnonzero(self.got[:-1] > (remaining - self.lo_after)[:-1])
        last = int(limited[0]) if limited.size else num_groups - 1
        # the first group that is not forced, by bisection (monotone)
        first_free, upper = 0, last + 1
        while first_free < upper:
            mid = (first_free + upper) // 2
            if self.held(mid) >= int(remaining[mid]):
                first_free = mid + 1
            else:
                upper = mid
        plan = low.copy()
        done = order[: starts[min(first_free, last)]]
        plan[done] = self.own[done]
        if first_free <= last:  # group first_free is free: water-fill the ranks left at one level
            if first_free == 0:
                k = int(remaining[0]) - int(low.sum())
                return _level(env, int(remaining[0]), low, high, self.guess(k))
            # the forced ranks keep their shares (bounds pinned at them) and no rank left
            # goes above its size at the last forced level
            free = np.ones(low.size, dtype=bool)
            free[done] = False
            top = np.where(free, _fill(env, self.levels[starts[first_free - 1]], low, high), plan)
            # the forced ranks' allowed entries are all at or above that level, so the k-th
            # entry of the ranks left (all at or below it) is the k-th of all ranks
            k = int(remaining[first_free]) - int(low[free].sum())
            return _level(
                env, int(plan[done].sum()) + int(remaining[first_free]), plan, top, self.guess(k)
            )
        group = np.sort(order[starts[last] : self.ends[last]])
        if last == num_groups - 1:  # every rank is forced: spread what is left over the slowest
            plan[group] = _share(self.own[group], low[group], int(remaining[last]))
            return plan
        take = int(remaining[last]) - int(self.lo_after[last])  # the later groups get lo
        room = self.own[group] - low[group]
        spare = take - int(low[group].sum())
        cum = np.cumsum(room)
        plan[group] = low[group] + np.clip(spare - (cum - room), 0, room)
        return plan


def _level(
    env: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray, guess: float | None = None
) -> np.ndarray:
    """Water-filling at one level: the ``k``-th smallest time among the allowed sizes.

    Args:
        env: The running maxima of the curves, shape ``(N, G)``.
        total: The global batch.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.
        guess: A candidate level. It is the level exactly when the ranks hold fewer than
            ``total`` strictly below it and at least ``total`` at it; otherwise the level is
            found by bisection.

    Returns:
        The sizes.
    """
    k = total - int(lo.sum())
    if k <= 0:
        return lo.copy()
    num_sizes = env.shape[1]
    for level in (guess, None):
        if level is None:
            level = _kth_allowed(env, total, lo, hi)
        b_hi = _fill(env, level, lo, hi)
        with np.errstate(over="ignore"):  # below the lowest float: -inf, nothing is below
            below = np.nextafter(level, -np.inf)  # the entries strictly below the level
        sizes = np.minimum(_fill(env, below, lo, hi), b_hi)
        if int(sizes.sum()) < total <= int(b_hi.sum()):  # (always so for the exact level)
            break
    deficit = total - int(sizes.sum())
    if deficit > 0:  # the ranks whose next size is at the level, by their time there
        extra = b_hi - sizes
        nxt = env[np.arange(env.shape[0]), np.minimum(sizes, num_sizes - 1)]
        order = np.argsort(nxt, kind="stable")
        extra_sorted = extra[order]
        cum = np.cumsum(extra_sorted)
        sizes[order] += np.clip(deficit - (cum - extra_sorted), 0, extra_sorted)
    return sizes


_GATHER = 4096
"""Entries between the bracket's ends below which the level's rank is found by sorting."""


def _kth_allowed(env: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> float:
    """The smallest level at which the ranks hold ``total``: an allowed entry, exactly.

    The allowed entries (sizes in ``(lo, hi]``) at or below a level number
    ``sum fill(level) - sum lo``, so the level is the ``total - sum lo``-th smallest of them.
    A bisection on the value brackets it until few entries lie inside the bracket (each
    step costs ``O(N log G)``), and a partial sort of those entries gives it exactly.
    """
    num_ranks, num_sizes = env.shape
    rows = np.arange(num_ranks)
    open_ = lo < hi
    first = env[rows[open_], lo[open_]]  # each rank's smallest allowed entry
    level_low = float(np.nextafter(first.min(), -np.inf))
    level_high = float(env[rows[open_], hi[open_] - 1].max())
    at_low, at_high = _fill(env, level_low, lo, hi), _fill(env, level_high, lo, hi)
    for _ in range(64):  # at_low holds fewer than total, at_high at least total
        if int(at_high.sum() - at_low.sum()) <= max(_GATHER, 4 * num_ranks):
            break
        mid = 0.5 * (level_low + level_high)
        if not level_low < mid < level_high:  # ties: the bracket cannot shrink further
            break
        at_mid = _fill(env, mid, lo, hi)
        if int(at_mid.sum()) >= total:
            level_high, at_high = mid, at_mid
        else:
            level_low, at_low = mid, at_mid
    # each rank's entries in (level_low, level_high]: columns at_low .. at_high - 1
    lengths = at_high - at_low
    num_inside = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    idx = np.repeat(rows * num_sizes + at_low - offsets, lengths) + np.arange(num_inside)
    inside = env.reshape(-1)[idx]
    kth = total - int(at_low.sum())
    return float(np.partition(inside, kth - 1)[kth - 1])


def _share(cap: np.ndarray, lo: np.ndarray, total: int) -> np.ndarray:
    """Give ``total`` to ranks between ``lo`` and ``cap``, spreading evenly."""
    sizes = lo.copy()
    spare = total - int(sizes.sum())
    while spare > 0:
        room = cap - sizes
        open_ = np.flatnonzero(room > 0)
        if open_.size == 0:
            break
        step = max(1, spare // open_.size)
        add = np.minimum(room[open_], step)
        if int(add.sum()) > spare:
            add = np.minimum(add, 1)
            add[np.cumsum(add) > spare] = 0
        sizes[open_] += add
        spare -= int(add.sum())
    return sizes
