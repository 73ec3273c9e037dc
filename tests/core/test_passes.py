"""Accumulation passes: the split rule, its array form, step times and single-pass views."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_rex.core.passes import (
    cap_array,
    pass_count,
    pass_split,
    pass_total,
    passes,
    per_pass,
)
from lightning_rex.core.plans.filling import water_fill


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10_000), st.one_of(st.none(), st.integers(1, 600)))
def test_passes_sum_to_the_size_fit_the_cap_and_are_as_few_as_possible(size, cap):
    p = passes(size, cap)
    assert sum(p) == size
    assert len(p) == pass_count(size, cap)
    if cap is None or size <= cap:
        assert p == [size]
    else:
        assert len(p) == -(-size // cap)  # ceil(size / cap)
        assert max(p) <= cap
    assert max(p) - min(p) <= 1 and p == sorted(p, reverse=True)  # even, larger first


def test_the_example_of_the_docs():
    assert passes(20, 8) == [7, 7, 6]
    assert passes(16, 6) == [6, 5, 5]
    assert passes(6, 6) == [6] and passes(5, None) == [5]


@pytest.mark.parametrize(("size", "cap"), [(-1, 4), (3.5, 4), (8, 0), (8, 2.5)])
def test_bad_arguments_are_named(size, cap):
    with pytest.raises(ValueError, match=r"size|cap"):
        passes(size, cap)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=12), st.data())
def test_the_array_form_is_the_same_rule(sizes, data):
    caps = data.draw(st.lists(st.integers(0, 80), min_size=len(sizes), max_size=len(sizes)))
    k, q, m = pass_split(sizes, caps)
    for b, c, kk, qq, mm in zip(sizes, caps, k, q, m):
        p = passes(b, c or None)
        assert kk == len(p) and sorted(p) == sorted([qq + 1] * mm + [qq] * (kk - mm))


def test_pass_total_sums_the_passes_single_pass_times():
    def t1(x):
        return 0.1 + 0.01 * np.asarray(x, dtype=float) ** 1.5

    sizes, caps = np.array([5, 20, 21, 64]), np.array([8, 8, 0, 16])
    k, q, m = pass_split(sizes, caps)
    got = pass_total(k, m, t1(q), t1(q + 1))
    want = [sum(float(t1(x)) for x in passes(int(b), int(c) or None)) for b, c in zip(sizes, caps)]
    assert np.allclose(got, want)


def test_per_pass_is_exact_for_an_affine_single_pass_time_even_with_uneven_passes():
    a, s = 0.2, 0.03
    sizes, caps = np.array([[20, 7, 33]]), np.array([[8, 8, 0]])
    step = np.array([[sum(a + s * x for x in passes(int(b), int(c) or None))]
                     for b, c in zip(sizes[0], caps[0])]).reshape(1, -1)  # fmt: skip
    b1, t1 = per_pass(sizes, step, caps)
    assert np.allclose(t1, a + s * b1)
    assert np.allclose(b1, [[20 / 3, 7, 33]])


def test_cap_array_is_none_without_caps_and_checks_its_length():
    assert cap_array(None, 3) is None and cap_array([None, None], 2) is None
    assert cap_array([4, None], 2).tolist() == [4, 0]
    with pytest.raises(ValueError, match="pass_caps must have 2 entries"):
        cap_array([4], 2)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 3))
def test_water_filling_is_exact_on_accumulation_staircases(seed, n):
    """Staircases are not convex, nor smooth: the minimax plan is still the best one."""
    rng = np.random.default_rng(seed)
    g = 14
    over = rng.uniform(0.0, 0.5, n)
    rate = rng.uniform(0.05, 1.0, n)
    caps = rng.integers(1, 8, n)
    sizes = np.arange(1, g + 1)
    k, q, m = pass_split(sizes[None, :], caps[:, None])

    def t1(x):
        return over[:, None] + rate[:, None] * x

    curves = pass_total(k, m, t1(q), t1(q + 1))
    assert np.all(np.diff(curves, axis=1) >= 0)  # nondecreasing in the size
    total = int(rng.integers(n, n * g // 2 + 1))
    lo, hi = np.ones(n, dtype=np.int64), np.full(n, g, dtype=np.int64)
    plan = water_fill(curves, total, lo, hi)
    rows = np.arange(n)
    best = min(
        float(curves[rows, np.asarray(p) - 1].max())
        for p in itertools.product(range(1, g + 1), repeat=n)
        if sum(p) == total
    )
    assert sum(plan) == total
    assert float(curves[rows, np.asarray(plan) - 1].max()) == pytest.approx(best)
