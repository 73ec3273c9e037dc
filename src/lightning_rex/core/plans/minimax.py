"""The minimax plan on known curves: the integer plan that minimises the synchronous step time.

Given each rank's time curve ``t_r(b)`` on integer sizes, the minimax plan is found by
water-filling (:func:`~lightning_rex.core.plans.filling.water_fill`): the smallest level
``T`` with ``sum_r b_r(T) >= B``, where ``b_r(T)`` is the largest size in ``[lo_r, hi_r]``
whose (monotone envelope of) time is ``<= T``; the few samples left over at the final level
go to the ranks with the lowest time at their next size.

This module holds what every planner shares: the per-rank bounds (:func:`resolve_bounds`),
the most even feasible plan, the size horizon that keeps the tables small, the one helper
that plans on known curves (:func:`minimax_plan`, for affine curves :func:`affine_plan`),
and the one repair of integer sizes into a valid plan (:func:`repair_plan`). The proposal
on the model's posterior, exploration included, is
:func:`~lightning_rex.core.plans.proposal.propose_plan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lightning_rex.core.plans.filling import water_fill
from lightning_rex.core.plans.plan import Plan

__all__ = [
    "affine_plan",
    "device_rates",
    "exploration_kappa",
    "feasible_spread",
    "minimax_plan",
    "plan_from_device_rates",
    "repair_plan",
    "resolve_bounds",
    "size_horizon",
    "water_fill",
]


def resolve_bounds(
    world_size: int, total: int, min_size: int, max_sizes: Sequence[int | None] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank ``lo`` and ``hi`` arrays from a minimum and optional per-rank caps.

    Args:
        world_size: The number of ranks ``N``.
        total: The global batch ``B``.
        min_size: The smallest size for every rank.
        max_sizes: Per-rank caps (None for no cap) or None for no caps at all.

    Returns:
        ``(lo, hi)`` integer arrays; uncapped ranks get ``B - (N - 1) * min_size``.

    Raises:
        ValueError: If the bounds cannot hold ``B`` or a cap is below ``min_size``.
    """
    if min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    free = total - (world_size - 1) * min_size
    if free < min_size:
        raise ValueError(f"global_batch={total} cannot give {world_size} ranks min_size={min_size}")
    caps = [None] * world_size if max_sizes is None else list(max_sizes)
    if len(caps) != world_size:
        raise ValueError(f"max_sizes must have {world_size} entries, got {len(caps)}")
    high = np.array([free if c is None else min(int(c), free) for c in caps], dtype=np.int64)
    bad = [r for r, c in enumerate(caps) if c is not None and int(c) < min_size]
    if bad:
        raise ValueError(f"max_sizes on ranks {bad} are below min_size={min_size}")
    if int(high.sum()) < total:
        raise ValueError(f"max_sizes sum to {int(high.sum())}, below global_batch={total}")
    return np.full(world_size, min_size, dtype=np.int64), high


def repair_plan(raw: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The smallest change that makes integer sizes a valid plan.

    Clip to ``[lo, hi]``, then take one sample at a time from the largest rank while the sum
    exceeds ``total``, or give one to the smallest while it falls short (ties: lowest rank).

    Args:
        raw: Integer sizes, shape ``(N,)``.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.

    Returns:
        Sizes within the bounds summing to ``total``.

    Raises:
        ValueError: If the bounds cannot hold ``total``.
    """
    if not int(np.sum(lo)) <= total <= int(np.sum(hi)):
        raise ValueError(f"bounds sum to [{int(np.sum(lo))}, {int(np.sum(hi))}], not {total}")
    sizes = np.clip(np.asarray(raw, dtype=np.int64), lo, hi)
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    while (diff := int(sizes.sum()) - total) != 0:
        if diff > 0:
            sizes[int(np.argmax(np.where(sizes > lo, sizes, small)))] -= 1
        else:
            sizes[int(np.argmin(np.where(sizes < hi, sizes, big)))] += 1
    return sizes


def exploration_kappa(explore: float, n_windows: int) -> float:
    """The quantile width ``explore / sqrt(n_windows)`` (0 when ``n_windows`` is 0).

    Args:
        explore: The width at one window of data.
        n_windows: The windows the model has seen.

    Returns:
        The number of posterior standard deviations subtracted from the mean.
    """
    return float(explore) / np.sqrt(n_windows) if n_windows > 0 else 0.0


def feasible_spread(total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The most even plan the bounds allow: every rank at one level, clipped into its bounds.

    Args:
        total: The global batch ``B`` (the bounds must be able to hold it).
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.

    Returns:
        Integer sizes within the bounds summing to ``total``.

    Raises:
        ValueError: If the bounds cannot hold ``total``.
    """
    low = np.asarray(lo, dtype=np.int64)
    high = np.asarray(hi, dtype=np.int64)
    if not int(low.sum()) <= total <= int(high.sum()):
        raise ValueError(f"bounds sum to [{int(low.sum())}, {int(high.sum())}], not {total}")
    # the smallest level with sum(clip(level, low, high)) >= total
    lower, upper = 0, int(high.max())
    while lower < upper:
        level = (lower + upper) // 2
        if int(np.clip(level, low, high).sum()) >= total:
            upper = level
        else:
            lower = level + 1
    plan = np.clip(lower, low, high)
    excess = int(plan.sum()) - total
    at_level = np.flatnonzero((plan == lower) & (plan > low))[:excess]
    plan[at_level] -= 1
    return plan


def size_horizon(
    times_at: Callable[[np.ndarray], np.ndarray],
    level: float,
    lo: np.ndarray,
    hi: np.ndarray,
    keep: Sequence[int] = (),
    total: int = 0,
) -> int:
    """The largest size worth tabulating for plans no slower than ``level``.

    A rank whose time at size ``s`` already exceeds ``level`` gets fewer than ``s`` samples in
    any plan whose slowest rank takes at most ``level``, when its curve does not decrease
    with size (:func:`water_fill` plans on the running maximum of a curve, which never
    does). The curves are probed at doubling sizes 1, 2, 4, ... up to ``max(hi)``, so the
    result is at most twice the largest size that matters, and a planner tabulates
    ``N x horizon`` times instead of ``N x max(hi)``.

    Args:
        times_at: Every rank's time at the given sizes: ``(P,)`` sizes to ``(N, P)`` seconds.
        level: The slowest rank's time in a plan already available (e.g. the even plan).
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.
        keep: Sizes the horizon must cover (e.g. the plan in force).
        total: The global batch: the horizon doubles until the bounds it leaves can hold
            it (a ``level`` from an infeasible plan could cut too short otherwise).

    Returns:
        The horizon, in ``[max(lo, keep), max(hi)]``.
    """
    low = np.asarray(lo, dtype=np.int64)
    high = np.asarray(hi, dtype=np.int64)
    top = int(high.max())
    probes = np.array(sorted({min(1 << k, top) for k in range(top.bit_length() + 1)}))
    over = np.asarray(times_at(probes)) > level  # (N, P)
    over &= probes[None, :] > low[:, None]
    first = np.where(over.any(axis=1), probes[np.argmax(over, axis=1)], top)
    need = max(int(low.max()), max((int(b) for b in keep), default=0))
    horizon = int(min(max(int(np.minimum(first, high).max()), need), top))
    while horizon < top and int(np.minimum(high, horizon).sum()) < total:
        horizon = min(2 * horizon, top)
    return horizon


def minimax_plan(
    times_at: Callable[[np.ndarray], np.ndarray], total: int, lo: np.ndarray, hi: np.ndarray
) -> Plan:
    """The minimax plan on known curves, tabulating only the sizes that can matter.

    No rank needs a size slower than the slowest rank of a feasible plan, the most even one
    (:func:`feasible_spread`), on the running maxima :func:`water_fill` plans on; so the
    curves are tabulated up to :func:`size_horizon` of that level, not up to ``B``. The
    minimax time is the one a full table gives; among plans that tie on it, the one picked
    may differ.

    Args:
        times_at: Every rank's time at the given sizes: ``(P,)`` sizes to ``(N, P)`` seconds.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.

    Returns:
        The plan, as :func:`water_fill` finds it on those curves.
    """
    low = np.asarray(lo, dtype=np.int64)
    high = np.asarray(hi, dtype=np.int64)
    even = feasible_spread(total, low, high)
    envelope = np.maximum.accumulate(times_at(np.arange(1, int(even.max()) + 1)), axis=1)
    level = float(envelope[np.arange(even.size), even - 1].max())
    horizon = size_horizon(times_at, level, low, high, even.tolist(), total)
    curves = times_at(np.arange(1, horizon + 1))
    return water_fill(curves, total, low, np.minimum(high, horizon))


def affine_plan(
    overheads: np.ndarray, slopes: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray
) -> Plan:
    """The minimax plan for known affine step times ``t_r(b) = overheads[r] + slopes[r] * b``.

    Args:
        overheads: Per-rank fixed time per step (seconds), shape ``(N,)``.
        slopes: Per-rank time per sample (seconds, ``1 / rate``), shape ``(N,)``.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes, shape ``(N,)``.
        hi: Per-rank maximum sizes, shape ``(N,)``.

    Returns:
        The plan, as :func:`minimax_plan` finds it on those curves.
    """
    overhead = np.asarray(overheads, dtype=np.float64)
    slope = np.asarray(slopes, dtype=np.float64)

    def times_at(sizes: np.ndarray) -> np.ndarray:
        return np.asarray(overhead[:, None] + slope[:, None] * np.asarray(sizes)[None, :])

    return minimax_plan(times_at, total, lo, hi)


def device_rates(keys: Sequence[str], summary: dict[str, list[float]]) -> dict[str, list[float]]:
    """Fitted rate and overhead per device identity, averaged over the ranks that have it.

    Args:
        keys: Each rank's device identity.
        summary: ``Controller.rank_model_summary()``: per-rank ``rate`` and ``overhead_s``.

    Returns:
        Device identity to ``[rate (samples/s), overhead (s)]``; ranks without a finite
        positive rate are left out.
    """
    out: dict[str, list[list[float]]] = {}
    for key, rate, over in zip(keys, summary.get("rate", []), summary.get("overhead_s", [])):
        if math.isfinite(rate) and rate > 0 and math.isfinite(over):
            out.setdefault(key, []).append([rate, max(over, 0.0)])
    return {
        k: [float(np.mean([v[0] for v in vs])), float(np.mean([v[1] for v in vs]))]
        for k, vs in out.items()
    }


def plan_from_device_rates(
    rates: dict[str, list[float]],
    device_keys: Sequence[str],
    global_batch: int,
    min_size: int,
    max_sizes: Sequence[int | None] | None,
) -> Plan | None:
    """The minimax plan from rates measured per device identity, if every rank's is known.

    Args:
        rates: Device identity to ``[rate (samples/s), overhead (s)]``, from a checkpoint.
        device_keys: This run's device identity per rank.
        global_batch: This run's global batch ``B``.
        min_size: This run's smallest micro-batch.
        max_sizes: Its per-rank caps (None entries for none), or None.

    Returns:
        The plan equalising ``overhead + b / rate`` across ranks, or None when a rank's
        device was not measured before (the caller keeps its plan).
    """
    if not device_keys or any(k not in rates for k in device_keys):
        return None
    over = np.array([rates[k][1] for k in device_keys])
    slope = np.array([1.0 / rates[k][0] for k in device_keys])
    low, high = resolve_bounds(len(device_keys), global_batch, min_size, max_sizes)
    return affine_plan(over, slope, global_batch, low, high)
