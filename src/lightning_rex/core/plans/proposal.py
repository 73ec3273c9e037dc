"""One step of Bayesian optimisation: the next plan from the rank models' posterior.

The objective is the synchronous step time ``max_r t_r(b_r)`` over integer plans summing to
``B``. The acquisition is the posterior's optimistic quantile ``mean - kappa * sd`` (read
through BoTorch, :func:`~lightning_rex.core.model.posterior.optimistic_quantile`), and its exact
minimiser over plans is found by water-filling
(:func:`~lightning_rex.core.plans.filling.water_fill`). Only the sizes that can matter are
tabulated (:func:`~lightning_rex.core.plans.minimax.size_horizon`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.filling import water_fill_many
from lightning_rex.core.plans.minimax import size_horizon, water_fill
from lightning_rex.core.plans.plan import Plan

__all__ = [
    "best_plan_for",
    "plan_step_interval",
    "propose_plan",
    "recent_sizes",
    "refit_due",
    "refit_when_due",
    "with_floors",
]


def refit_when_due(model: RankTimeModel, fitted_at: int) -> int:
    """Refit the model's hyperparameters when due; the window count of the last fit.

    Only once there is data to fit them to (6 windows held), and then when the windows seen
    since have doubled, or grown by 20: they move slowly, and a BoTorch fit (a few hundred
    ms of CPU) dominates a proposal's cost.

    Args:
        model: The rank time model.
        fitted_at: ``model.n_added`` at the last fit (-1: never).

    Returns:
        ``fitted_at``, moved on when a fit ran.
    """
    if refit_due(model, fitted_at):
        fits = model.n_fits
        model.fit_hyperparameters()
        if model.n_fits != fits:  # it ran (it skips data with one size per rank)
            return model.n_added
    return fitted_at


def refit_due(model: RankTimeModel, fitted_at: int) -> bool:
    """Whether :func:`refit_when_due` would fit now.

    Args:
        model: The rank time model.
        fitted_at: ``model.n_added`` at the last fit (-1: never).

    Returns:
        True once 6 windows are held and the windows seen since the last fit have doubled
        or grown by 20 (or there was none).
    """
    added = model.n_added
    return model.n_obs >= 6 and (fitted_at < 0 or added >= min(2 * fitted_at, fitted_at + 20))


def recent_sizes(sizes: Sequence[Sequence[int]], keep: int) -> list[set[int]]:
    """Each rank's last ``keep`` distinct sizes, from windows' plans (oldest first).

    Args:
        sizes: The plans of the windows held, oldest first.
        keep: How many distinct sizes count as recent.

    Returns:
        One set per rank.
    """
    if not sizes:
        return []
    out: list[list[int]] = [[] for _ in sizes[0]]
    for plan in reversed(sizes):
        for rank, size in enumerate(plan):
            if len(out[rank]) < keep and size not in out[rank]:
                out[rank].append(int(size))
    return [set(x) for x in out]


def best_plan_for(
    model: RankTimeModel, lo: np.ndarray, hi: np.ndarray, global_batch: int
) -> tuple[Plan, float]:
    """The posterior-mean best plan for a global batch, and its predicted step time.

    What global batch scaling plans throughput on: the same water-filling as a proposal, on
    the posterior mean (no exploration), for any ``B`` the bounds hold.

    Args:
        model: The rank time model (at least one window held).
        lo: Per-rank minimum sizes for ``global_batch``.
        hi: Per-rank maximum sizes for ``global_batch``.
        global_batch: The global batch.

    Returns:
        ``(plan, predicted synchronous step time in seconds)``.
    """
    max_size = int(np.max(hi))
    mean, _ = model.predict_grid(np.arange(1, max_size + 1))
    plan = water_fill(mean, global_batch, lo, hi)
    return plan, float(mean[np.arange(len(plan)), np.asarray(plan) - 1].max())


def best_plans_for(
    model: RankTimeModel, bounds: Sequence[tuple[np.ndarray, np.ndarray]], batches: Sequence[int]
) -> list[tuple[Plan, np.ndarray]]:
    """:func:`best_plan_for` of several global batches, on one posterior of the size grid.

    Args:
        model: The rank time model (at least one window held).
        bounds: ``(lo, hi)`` per-rank sizes for each batch.
        batches: The global batches.

    Returns:
        ``(plan, each rank's predicted step time)`` per batch: the plan :func:`best_plan_for`
        gives, and its ranks' times, whose maximum is that function's step time.
    """
    if not batches:
        return []
    max_size = max(int(np.max(hi)) for _, hi in bounds)
    mean, _ = model.predict_grid(np.arange(1, max_size + 1))
    env = np.maximum.accumulate(mean, axis=1)  # what water_fill plans on, once for all
    # batches under the same bounds share one filling (groups, shares, levels)
    same: dict[tuple[bytes, bytes], list[int]] = {}
    for batch_index, (low, high) in enumerate(bounds):
        key = (
            np.asarray(low, dtype=np.int64).tobytes(),
            np.asarray(high, dtype=np.int64).tobytes(),
        )
        same.setdefault(key, []).append(batch_index)
    plans: dict[int, Plan] = {}
    for idx in same.values():
        low, high = bounds[idx[0]]
        many = water_fill_many(
            env[:, : int(np.max(high))], [int(batches[i]) for i in idx], low, high, monotone=True
        )
        plans.update(zip(idx, many))
    rows = np.arange(mean.shape[0])
    return [(plans[i], mean[rows, np.asarray(plans[i]) - 1]) for i in range(len(batches))]


def with_floors(
    curves: np.ndarray, sizes: np.ndarray, floors: Sequence[Sequence[float]] = ()
) -> np.ndarray:
    """Curves no faster than measured: a rolled-back plan's times are floors from there up.

    Args:
        curves: Every rank's predicted time on ``sizes``, shape ``(N, G)``.
        sizes: The increasing grid of sizes, shape ``(G,)``.
        floors: ``[rank, size, seconds]``: the rank is predicted no faster than ``seconds``
            at ``size`` and above (time never falls as the batch grows).

    Returns:
        The curves, shape ``(N, G)``.
    """
    out = np.asarray(curves, dtype=np.float64)
    if not len(floors):
        return out
    floor_rows = np.asarray(floors, dtype=np.float64).reshape(-1, 3)
    cols = np.searchsorted(sizes, floor_rows[:, 1])
    keep = cols < sizes.size
    floor_grid = np.full(out.shape, -np.inf)
    np.maximum.at(
        floor_grid, (floor_rows[keep, 0].astype(np.int64), cols[keep]), floor_rows[keep, 2]
    )
    return np.maximum(out, np.maximum.accumulate(floor_grid, axis=1))


def propose_plan(
    model: RankTimeModel,
    plan: Plan,
    lo: np.ndarray,
    hi: np.ndarray,
    global_batch: int,
    *,
    kappa: float,
    explore_slack: float,
    in_bounds: bool = True,
    floors: Sequence[Sequence[float]] = (),
) -> tuple[Plan, float, float]:
    """The plan minimising the slowest rank's optimistic quantile, and two predictions.

    Args:
        model: The rank time model (at least one window held).
        plan: The plan in force.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.
        global_batch: The global batch ``B``.
        kappa: Standard deviations of the optimistic quantile below the mean.
        explore_slack: The exploring plan is used only while its posterior-mean step time is
            within this fraction of the best posterior-mean plan's; otherwise the latter.
        in_bounds: Whether ``plan`` respects ``lo`` and ``hi`` (if not, it gives no level to
            bound the tabulated sizes, and the whole range is tabulated).
        floors: Measured floors from rolled-back plans (:func:`with_floors`).

    Returns:
        ``(new plan, its posterior-mean step time, the plan in force's)``, in seconds, both
        with the floors.
    """
    rows = np.arange(len(plan))
    cur = np.asarray(plan)
    # Tabulate only the sizes that matter: no plan worth proposing is slower, in the
    # optimistic curves the planner uses, than the plan in force, and a rank whose optimistic
    # time at a size exceeds that level never gets that size. So the grid grows with the
    # sizes in play, not with B (4096 uncapped ranks stay in memory). (water_fill plans on
    # running maxima; the mean's bounds the optimistic curve's.)
    grid = np.arange(1, int(cur.max()) + 1)
    mean = with_floors(model.predict_grid(grid)[0], grid, floors)
    pred_cur = float(mean[rows, cur - 1].max())
    level = float(np.maximum.accumulate(mean, axis=1)[rows, cur - 1].max())

    def optimistic(sizes: np.ndarray) -> np.ndarray:
        return with_floors(model.predict_grid(sizes, kappa)[1], sizes, floors)

    horizon = int(np.max(hi))
    if in_bounds:
        horizon = size_horizon(optimistic, level, lo, hi, plan, global_batch)
    top = np.minimum(hi, horizon)
    # The acquisition is the posterior's optimistic quantile (BoTorch's), and water-filling
    # is its inner optimiser: the plan minimising the slowest rank's quantile.
    grid = np.arange(1, horizon + 1)
    mean, quantile = model.predict_grid(grid, kappa)
    mean = with_floors(mean, grid, floors)
    quantile = with_floors(quantile, grid, floors)
    greedy = water_fill(mean, global_batch, lo, top)
    pred_greedy = float(mean[rows, np.asarray(greedy) - 1].max())
    new = water_fill(quantile, global_batch, lo, top)
    pred_new = float(mean[rows, np.asarray(new) - 1].max())
    # Optimism, not recklessness: explore only where the posterior mean of the exploring plan
    # stays within `explore_slack` of the best mean plan.
    if pred_new > pred_greedy * (1.0 + explore_slack):
        new, pred_new = greedy, pred_greedy
    return new, pred_new, pred_cur


def plan_step_interval(
    model: RankTimeModel, plan: Plan, seed: int, draws: int = 400
) -> tuple[float, float, float]:
    """A plan's predicted synchronous compute time with a 95% interval.

    Each rank's posterior at its size in ``plan`` (mean and standard deviation, mixed over
    its tile hypotheses); the maximum over ranks, its distribution by ``draws`` seeded draws.

    Args:
        model: The rank time model (at least one window held).
        plan: The plan (the even split, for the report's baseline).
        seed: The draws' seed.
        draws: How many draws.

    Returns:
        ``(mean, 2.5%, 97.5%)`` seconds; the interval holds the mean.
    """
    sizes_of = np.asarray(plan)
    sizes = np.unique(sizes_of)
    mean, lower = model.predict_grid(sizes.astype(np.float64), kappa=1.0)
    col = np.searchsorted(sizes, sizes_of)
    rows = np.arange(len(sizes_of))
    rank_mean, rank_std = mean[rows, col], np.maximum(mean[rows, col] - lower[rows, col], 0.0)
    rng = np.random.default_rng(seed)
    top = (rank_mean + rank_std * rng.standard_normal((draws, len(sizes_of)))).max(axis=1)
    low, high = np.percentile(top, [2.5, 97.5])
    centre = float(rank_mean.max())
    return centre, float(min(low, centre)), float(max(high, centre))
