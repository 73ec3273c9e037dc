"""Water-filling: the same plans as the first, quadratic loop, on any curves, at any scale."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core.plans.reference_water_fill import water_fill as reference

from lightning_rex.core.plans import filling
from lightning_rex.core.plans.filling import water_fill, water_fill_many


@st.composite
def problems(draw: st.DrawFn) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """Curves with flats and ties (tiles, equal ranks, forced levels), bounds and a batch."""
    n = draw(st.integers(1, 9))
    g = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["affine", "tiles", "integers", "flat-then-steep"]))
    sizes = np.arange(1, g + 1)
    if kind == "affine":
        curves = rng.uniform(0, 1, (n, 1)) + rng.uniform(0.01, 1, (n, 1)) * sizes
    elif kind == "tiles":
        tile = rng.choice([1, 2, 4, 8], size=(n, 1))
        curves = rng.uniform(0, 1, (n, 1)) + np.ceil(sizes / tile) * tile * rng.uniform(0.1, 1)
    elif kind == "integers":  # many exact ties, non-monotone
        curves = rng.integers(0, 6, (n, g)).astype(float)
    else:  # slow ranks whose minimum already sets the level: the lexicographic phase
        over = rng.choice([0.0, 1.0, 5.0, 9.0], size=(n, 1))
        curves = over + np.maximum(sizes - rng.integers(1, g + 1, (n, 1)), 0) * 0.5
    hi = rng.integers(1, g + 1, n)
    lo = np.minimum(rng.integers(1, 3, n), hi)
    total = draw(st.integers(int(lo.sum()), int(hi.sum())))
    return curves, total, lo, hi


@settings(max_examples=400, deadline=None)
@given(problems())
def test_the_same_plans_as_the_reference(problem):
    curves, total, lo, hi = problem
    assert water_fill(curves, total, lo, hi) == reference(curves, total, lo, hi)


def test_4096_ranks_with_forced_levels_match_the_reference():
    """Flat curves to a knee and memory caps: most ranks forced, the reference's slow case."""
    rng = np.random.default_rng(1)
    n, g = 512, 160
    kinds = rng.choice(3, n)
    rate = np.array([2600.0, 1400.0, 450.0])[kinds] * rng.uniform(0.95, 1.05, n)
    knee = np.array([24, 16, 8])[kinds]
    cap = np.array([160, 64, 32])[kinds]
    sizes = np.arange(1, g + 1)
    curves = 0.006 + np.maximum(sizes, knee[:, None]) / rate[:, None]
    lo, hi = np.ones(n, dtype=np.int64), cap
    for total in (n, 4 * n, 16 * n, int(hi.sum()) - 7, int(hi.sum())):
        assert water_fill(curves, total, lo, hi) == reference(curves, total, lo, hi)


@settings(max_examples=100, deadline=None)
@given(problems(), st.lists(st.integers(0, 10**6), min_size=1, max_size=6))
def test_many_batches_share_the_work_and_plan_as_one_at_a_time(problem, draws):
    curves, _, lo, hi = problem
    low, high = int(lo.sum()), int(hi.sum())
    totals = [low + d % (high - low + 1) for d in draws]
    assert water_fill_many(curves, totals, lo, hi) == [reference(curves, t, lo, hi) for t in totals]


@pytest.mark.parametrize(
    "setting",
    [
        ("_GATHER", 0),  # no room to sort: the level's bracket shrinks to a few entries first
        ("_SHARE_FROM", 1),  # even one batch reads its level off one sort of the entries
    ],
)
@settings(max_examples=400, deadline=None)
@given(problem=problems())
def test_the_level_found_either_way_is_the_exact_one(setting, problem):
    """Bisection to a bracket, or a level read off the shared sort: the reference's plan."""
    curves, total, lo, hi = problem
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(filling, *setting)
        assert water_fill(curves, total, lo, hi) == reference(curves, total, lo, hi)


def test_many_batches_at_1024_ranks_with_forced_levels_match_the_reference():
    """The scaler's case: a geometric grid of batches, slow ranks forced at their minimum."""
    rng = np.random.default_rng(2)
    n, g = 1024, 96
    kinds = rng.choice(3, n)
    rate = np.array([2600.0, 1400.0, 450.0])[kinds] * rng.uniform(0.95, 1.05, n)
    over = np.array([0.004, 0.006, 0.030])[kinds] * rng.uniform(0.9, 1.1, n)
    sizes = np.arange(1, g + 1)
    curves = over[:, None] + np.ceil(sizes / 8) * 8 / rate[:, None]
    lo, hi = np.ones(n, dtype=np.int64), np.array([96, 64, 32])[kinds]
    totals = np.unique(np.geomspace(n, int(hi.sum()), 12).astype(np.int64)).tolist()
    got = water_fill_many(curves, totals, lo, hi)
    assert got == [water_fill(curves, t, lo, hi) for t in totals]  # one at a time: bisection
    for t, plan in zip(totals[::6], got[::6]):  # the reference is quadratic in the ranks
        assert plan == reference(curves, t, lo, hi)


@pytest.mark.parametrize("guess", [-np.finfo(np.float64).max, np.finfo(np.float64).max])
def test_a_guess_at_the_end_of_the_floats_is_caught_without_an_overflow_warning(guess):
    """The level just below the lowest float is -inf (nothing is below it); numpy's
    overflow warning there said nothing wrong (it printed in the test run once)."""
    curves = np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 4.0]])
    env, lo, hi = curves, np.ones(2, dtype=np.int64), np.full(2, 3, dtype=np.int64)
    exact = filling._level(env, 4, lo, hi)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(filling._level(env, 4, lo, hi, guess), exact)


@settings(max_examples=200, deadline=None)
@given(problems(), st.floats(allow_nan=True, allow_infinity=True))
def test_a_wrong_guess_of_the_level_is_caught(problem, guess):
    """A guessed level that does not hold the batch exactly falls back to the bisection."""
    curves, total, lo, hi = problem
    env = np.maximum.accumulate(curves, axis=1)
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    exact = filling._level(env, total, lo, hi)
    assert np.array_equal(filling._level(env, total, lo, hi, guess), exact)
