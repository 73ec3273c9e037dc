import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_rex.core.plans.minimax import (
    affine_plan,
    exploration_kappa,
    feasible_spread,
    minimax_plan,
    resolve_bounds,
    size_horizon,
    water_fill,
)


def brute_minimax(curves, total, lo, hi):
    best = np.inf
    for b in itertools.product(*[range(lo[r], hi[r] + 1) for r in range(len(lo))]):
        if sum(b) == total:
            best = min(best, max(curves[r, b[r] - 1] for r in range(len(b))))
    return best


@given(
    st.integers(2, 3),
    st.integers(0, 10_000),
    st.integers(6, 14),
    st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_water_fill_is_minimax_optimal(n, seed, total, capped):
    rng = np.random.default_rng(seed)
    g = total
    steps = rng.uniform(0, 1, size=(n, g)) * (rng.uniform(size=(n, g)) < 0.7)
    curves = np.cumsum(steps, axis=1) + rng.uniform(0, 2, size=(n, 1))
    lo = np.ones(n, dtype=np.int64)
    hi = np.full(n, total - n + 1, dtype=np.int64)
    if capped:
        hi[0] = max(1, total // n)
        if hi.sum() < total:
            hi[0] = total - n + 1
    plan = water_fill(curves, total, lo, hi)
    assert sum(plan) == total
    assert all(lo[r] <= plan[r] <= hi[r] for r in range(n))
    got = max(curves[r, plan[r] - 1] for r in range(n))
    assert got == pytest.approx(brute_minimax(curves, total, lo, hi), rel=1e-9)


def test_affine_balance_and_forced_slow_rank():
    rates = np.array([1000.0, 2000.0, 3000.0])
    s = np.arange(1, 513)
    plan = water_fill(0.004 + s / rates[:, None], 512, np.ones(3, int), np.full(3, 510))
    assert plan == (85, 171, 256)
    # a rank slower at its minimum than anyone at any size takes what is free; the rest balance
    c = np.vstack([np.full(64, 9.0), 0.01 + s[:64] / 2000.0, 0.01 + s[:64] / 2000.0])
    plan = water_fill(c, 64, np.ones(3, int), np.full(3, 62))
    assert plan[1] + plan[2] + plan[0] == 64 and abs(plan[1] - plan[2]) <= 1


def test_bounds_and_errors():
    lo, hi = resolve_bounds(3, 30, 2, [None, 5, None])
    assert lo.tolist() == [2, 2, 2] and hi.tolist() == [26, 5, 26]
    with pytest.raises(ValueError, match="max_sizes"):
        resolve_bounds(3, 30, 1, [5, 5, 5])
    with pytest.raises(ValueError, match="min_size"):
        resolve_bounds(3, 30, 0, None)
    with pytest.raises(ValueError, match="below min_size"):
        resolve_bounds(3, 30, 4, [3, None, None])
    with pytest.raises(ValueError, match=r"bounds sum to \[2, 8\], not containing 10"):
        water_fill(np.ones((2, 4)), 10, np.ones(2, int), np.full(2, 4))
    assert exploration_kappa(1.0, 4) == 0.5 and exploration_kappa(1.0, 0) == 0.0


def test_large_plan_is_fast():

    rng = np.random.default_rng(0)
    r = rng.uniform(100, 3000, 4096)
    s = np.arange(1, 257)
    # its speed is a benchmark: simulate --scenario mixed-4096 reports decision latency
    plan = water_fill(0.002 + s / r[:, None], 4096 * 64, np.ones(4096, int), np.full(4096, 256))
    assert sum(plan) == 4096 * 64


def test_affine_plan_equalises_known_affine_times() -> None:
    from lightning_rex.core.plans.minimax import affine_plan

    # rank 1 is 3x slower per sample, same overhead: the optimum gives rank 0 ~3x the samples
    plan = affine_plan(
        np.array([0.0, 0.0]), np.array([1.0, 3.0]), 64, np.array([1, 1]), np.array([63, 63])
    )
    assert plan == (48, 16)
    plan = affine_plan(
        np.array([0.0, 0.01]), np.array([0.001, 0.001]), 64, np.array([1, 1]), np.array([63, 63])
    )
    assert plan[0] > plan[1] and sum(plan) == 64


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(100.0, 5000.0), min_size=2, max_size=8),
    st.floats(0.0, 0.02),
    st.integers(1, 40),
)
def test_tabulating_the_sizes_that_matter_gives_the_full_tables_plan(rates, over, per_rank):
    n = len(rates)
    total = n * per_rank
    lo, hi = np.ones(n, dtype=np.int64), np.full(n, total, dtype=np.int64)
    slopes = 1.0 / np.asarray(rates)
    overs = np.full(n, over)
    sizes = np.arange(1, total + 1)
    full = water_fill(overs[:, None] + slopes[:, None] * sizes[None, :], total, lo, hi)
    assert affine_plan(overs, slopes, total, lo, hi) == full


def test_the_horizon_grows_with_the_sizes_in_play_not_with_the_global_batch():
    n, total = 4096, 4096 * 64
    rates = np.where(np.arange(n) % 2 == 0, 3000.0, 1000.0)

    def times_at(sizes):
        return 0.005 + np.asarray(sizes)[None, :] / rates[:, None]

    lo, hi = np.ones(n, dtype=np.int64), np.full(n, total, dtype=np.int64)
    level = float(times_at(np.array([64])).max())  # the even plan's slowest rank
    g = size_horizon(times_at, level, lo, hi, [64] * n, total)
    # the fast ranks can take up to ~3 x 64 samples at that level: probes stop at 256
    assert g == 256 and g < total // 1000
    # a level from a plan the bounds cannot hold is widened until they can
    assert size_horizon(times_at, 0.0, lo, np.full(n, 100), (), 100 * n - 1) == 100


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(0.01, 1.0), st.integers(1, 3), st.integers(1, 80)),
        min_size=2,
        max_size=6,
    ),
    st.integers(0, 60),
)
def test_the_horizon_keeps_the_minimax_time_with_caps_below_the_even_split(ranks, extra):
    over = np.array([r[0] for r in ranks])
    slope = np.array([r[1] for r in ranks])
    lo = np.array([r[2] for r in ranks], dtype=np.int64)
    hi = np.maximum(np.array([r[3] for r in ranks], dtype=np.int64), lo)
    total = int(min(lo.sum() + extra, hi.sum()))
    sizes = np.arange(1, int(hi.max()) + 1)
    table = over[:, None] + slope[:, None] * sizes[None, :]
    full = np.asarray(water_fill(table, total, lo, hi))
    got = np.asarray(affine_plan(over, slope, total, lo, hi))
    assert got.sum() == total and np.all((got >= lo) & (got <= hi))
    assert (over + slope * got).max() == pytest.approx((over + slope * full).max())


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000), st.integers(1, 30), st.booleans())
def test_minimax_plan_on_curves_that_dip_keeps_the_full_tables_minimax_time(n, seed, per, cap):
    # staircase curves with dips (a tile's padding): the level is read on their running
    # maximum, as water_fill plans, so the short table keeps the full table's minimax time
    rng = np.random.default_rng(seed)
    total = n * per
    over, slope = rng.uniform(0.0, 0.5, n), rng.uniform(0.01, 1.0, n)
    tile = rng.integers(2, 9, n)

    def times_at(sizes):
        sizes = np.asarray(sizes)[None, :]
        return over[:, None] + slope[:, None] * (-(-sizes // tile[:, None]) * tile[:, None])

    lo = np.ones(n, dtype=np.int64)
    hi = np.full(n, total - n + 1, dtype=np.int64)
    if cap:
        hi[0] = max(1, min(int(hi[0]), per // 2))
        if hi.sum() < total:
            return
    full = np.asarray(water_fill(times_at(np.arange(1, int(hi.max()) + 1)), total, lo, hi))
    got = np.asarray(minimax_plan(times_at, total, lo, hi))
    assert got.sum() == total and np.all((got >= lo) & (got <= hi))
    rows = np.arange(n)
    table = times_at(np.arange(1, int(hi.max()) + 1))
    assert table[rows, got - 1].max() == pytest.approx(table[rows, full - 1].max())


def test_feasible_spread_is_the_most_even_plan_inside_the_bounds():
    lo, hi = np.array([1, 1, 1, 2]), np.array([52, 12, 4, 62])
    plan = feasible_spread(72, lo, hi)
    assert plan.sum() == 72 and list(plan) == [28, 12, 4, 28]
    assert list(feasible_spread(10, np.array([1, 1]), np.array([9, 9]))) == [5, 5]
    with pytest.raises(ValueError, match="bounds sum to"):
        feasible_spread(30, np.array([1, 1]), np.array([9, 9]))
