"""The planner's water-filling as first written: a loop over the ranks that set the level.

Kept as the reference that the fast :func:`~lightning_rex.core.plans.filling.water_fill`
must match plan for plan (it is quadratic in the ranks: 4096 ranks took seconds a plan).
"""

from __future__ import annotations

import numpy as np


def water_fill(curves: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> tuple[int, ...]:
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
    n, g = curves.shape
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if int(hi.max()) > g:
        raise ValueError(f"curves cover sizes up to {g}, but a bound allows {int(hi.max())}")
    if int(lo.sum()) > total or int(hi.sum()) < total:
        raise ValueError(
            f"bounds sum to [{int(lo.sum())}, {int(hi.sum())}], not containing {total}"
        )
    env = np.maximum.accumulate(np.asarray(curves, dtype=np.float64), axis=1)
    plan = lo.copy()
    active = np.arange(n)
    remaining = total
    # Lexicographic minimax: when the level is forced by ranks already at their minimum
    # (slower than everyone else can ever be), they get what is free at that level and the
    # rest are water-filled again, so that the others stay balanced.
    while active.size:
        b, forced = _fill_level(env[active], remaining, lo[active], hi[active])
        if forced is None:
            plan[active] = b
            break
        rest = active[~forced]
        need_rest = int(lo[rest].sum())
        take = max(0, min(int(b[forced].sum()), remaining - need_rest))
        fb = lo[active[forced]].copy()
        spare = take - int(fb.sum())
        room = b[forced] - fb
        cum = np.cumsum(room)
        fb += np.clip(spare - (cum - room), 0, room)
        plan[active[forced]] = fb
        remaining -= int(fb.sum())
        hi = hi.copy()
        hi[rest] = np.minimum(hi[rest], b[~forced])
        active = rest
    return tuple(int(x) for x in plan)


def _fill_level(
    env: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """One water-filling pass on monotone curves.

    Returns:
        ``(plan, None)`` when the level is set by a crossing, or ``(free, forced)`` when the
        lowest possible level already holds ``total``: ``free`` is each rank's largest size at
        that level and ``forced`` marks the ranks whose minimum sets it.
    """
    n, g = env.shape
    sizes = np.arange(1, g + 1)
    valid = (sizes[None, :] > lo[:, None]) & (sizes[None, :] <= hi[:, None])
    rows = np.arange(n)

    def fill(level: float) -> np.ndarray:
        return np.asarray(lo + ((env <= level) & valid).sum(axis=1))

    at_lo = env[rows, lo - 1]
    t_lo = float(at_lo.max())
    b = fill(t_lo)
    if int(b.sum()) >= total:
        forced = at_lo >= t_lo
        if int(b.sum()) == total or forced.all():
            if forced.all():
                return _share(b, lo, total), None
            return b, None
        return b, forced
    t_hi = float(env[rows, hi - 1].max())
    for _ in range(200):
        mid = 0.5 * (t_lo + t_hi)
        if int(fill(mid).sum()) >= total:
            t_hi = mid
        else:
            t_lo = mid
        if t_hi - t_lo <= 1e-12 * max(abs(t_hi), 1e-300):
            break
    b_hi = fill(t_hi)
    b_lo = np.minimum(fill(t_lo), b_hi)
    deficit = total - int(b_lo.sum())
    if deficit > 0:
        extra = b_hi - b_lo
        nxt = env[rows, np.minimum(b_lo, g - 1)]
        order = np.argsort(nxt, kind="stable")
        ex = extra[order]
        cum = np.cumsum(ex)
        b_lo[order] += np.clip(deficit - (cum - ex), 0, ex)
    return b_lo, None


def _share(cap: np.ndarray, lo: np.ndarray, total: int) -> np.ndarray:
    """Give ``total`` to ranks between ``lo`` and ``cap``, spreading evenly."""
    b = lo.copy()
    spare = total - int(b.sum())
    while spare > 0:
        room = cap - b
        open_ = np.flatnonzero(room > 0)
        if open_.size == 0:
            break
        step = max(1, spare // open_.size)
        add = np.minimum(room[open_], step)
        if int(add.sum()) > spare:
            add = np.minimum(add, 1)
            add[np.cumsum(add) > spare] = 0
        b[open_] += add
        spare -= int(add.sum())
    return b
