"""The price of a new shape, floors from rolled-back plans, and the settings behind them."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.decide.controller_state import ControllerState
from lightning_rex.core.decide.pricing import rollback_floors, trial_min_gain
from lightning_rex.core.plans.proposal import recent_sizes, with_floors
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window import Window


def test_recent_sizes_are_each_ranks_last_distinct_sizes():
    plans = [(8, 8), (9, 8), (10, 8), (9, 7)]
    assert recent_sizes(plans, 2) == [{9, 10}, {7, 8}]
    assert recent_sizes(plans, 8) == [{8, 9, 10}, {7, 8}]
    assert recent_sizes([], 3) == []


def test_a_floor_holds_from_its_size_up_and_never_lowers_a_curve():
    sizes = np.arange(1, 11)
    curves = np.tile(sizes * 0.01, (2, 1))
    out = with_floors(curves, sizes, [[0, 4, 0.08], [1, 20, 1.0]])
    np.testing.assert_allclose(out[0, :3], curves[0, :3])  # below the floor's size
    np.testing.assert_allclose(out[0, 3:8], 0.08)  # raised to the floor
    np.testing.assert_allclose(out[0, 8:], curves[0, 8:])  # already above it
    np.testing.assert_allclose(out[1], curves[1])  # past the grid: no effect


def test_the_cost_of_a_new_shape_is_measured_from_a_plans_first_step():
    st = ControllerState(64, (32, 32))
    t = np.full((2, 10), 0.05)
    t[1, 0] += 0.4  # rank 1 changed size and paid for it on the first step
    st.measure_shape_cost(Window(t, (30, 34), 0, 10), previous=(32, 32))
    assert st.shape_cost_s == pytest.approx(0.4)
    t = np.full((2, 10), 0.05)
    t[1, 0] += 0.2
    st.measure_shape_cost(Window(t, (30, 34), 10, 20), previous=(32, 32))
    assert st.shape_cost_s == pytest.approx(0.3)  # a running mean


def _near_balanced(c: Controller, rng: np.random.Generator, n: int) -> list[str]:
    # rank 1 is 25% slower: a plan that fixes it gains about 4 ms of a 42 ms step, 1.2 s
    # over the 300 steps of ten windows
    rates = np.array([1000.0, 800.0])
    kinds = []
    for i in range(n):
        base = 0.002 + np.asarray(c.plan) / rates
        t = base[:, None] * np.exp(rng.normal(0, 0.02, (2, 30)))
        kinds.append(c.observe(Window(t, c.plan, 30 * i, 30 * i + 30)).kind)
    return kinds


def test_a_batch_trial_must_pay_its_shapes_twice_over_the_run_that_remains():
    # 100 s measured, a quarter of the run: 300 s remain; two new shapes' worth (1 s) must
    # be paid back, so the least gain is 1 / 299, below the floor
    assert trial_min_gain(0.02, 0.5, 100.0, 0.25) == 0.02
    # 90% done: 11.1 s remain, the least gain is 1 / 10.1, above the floor
    assert trial_min_gain(0.02, 0.5, 100.0, 0.9) == pytest.approx(1.0 / (100.0 / 9 - 1.0))
    # it only grows towards the end, and past the point where no gain can pay it is inf
    gains = [trial_min_gain(0.02, 0.5, 100.0, d) for d in np.linspace(0.05, 0.99, 50)]
    assert gains == sorted(gains)
    assert trial_min_gain(0.02, 0.5, 100.0, 0.995) == math.inf
    assert trial_min_gain(0.02, 0.5, 100.0, 1.0) == math.inf
    # unknown progress, an unknown shape cost, or nothing measured yet: the floor
    for args in [(0.5, 100.0, None), (0.0, 100.0, 0.99), (0.5, 0.0, 0.99), (0.5, 100.0, 0.0)]:
        assert trial_min_gain(0.03, *args) == 0.03


def test_a_small_gain_that_does_not_pay_for_its_shapes_is_held():
    free = Controller(64, 2, seed=0, shape_change_s=0.0)
    costly = Controller(64, 2, seed=0, shape_change_s=5.0)
    assert "propose" in _near_balanced(free, np.random.default_rng(0), 8)
    assert "propose" not in _near_balanced(costly, np.random.default_rng(0), 8)
    assert costly.plan == (32, 32)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("shape_change_s", -1.0),
        ("shape_change_s", "x"),
        ("payback_windows", 0),
        ("shape_cache", 1.5),
    ],
)
def test_shape_settings_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        DecisionSettings(**{field: value})


def _old_rollback_floors(model, state, window, back):
    """The floors as first written: each moved rank's floor on each of its kin."""
    sd = math.sqrt(float(model.rel_var[-1]))
    level = np.asarray(state.reference or window.medians, dtype=np.float64)
    out = []
    for r, (b, m) in enumerate(zip(window.plan, window.medians)):
        if b == back[r]:
            continue
        jumped = b > back[r] and m / level[r] > b / back[r] * (1 + 2 * sd)
        start = back[r] + 1 if jumped else b
        kin = np.flatnonzero((model.group == model.group[r]) & (np.asarray(back) == back[r]))
        out += [[int(q), int(start), float(m * level[q] / level[r]) * (1 - 2 * sd)] for q in kin]
    return out


@pytest.mark.parametrize("n", [8, 64, 4096])
def test_rollback_floors_are_one_per_rank_and_start_and_bound_the_same_curves(n):
    """Grouped floors bound the curves as the rank-by-rank ones did, in O(N) floors."""
    rng = np.random.default_rng(n)
    group = rng.integers(0, 3, n)  # the index of the rank each pools with: 3 kinds
    model = SimpleNamespace(rel_var=[0.01], group=group)
    back = tuple(int(x) for x in rng.integers(8, 12, n))
    plan = tuple(int(b + rng.integers(-2, 4)) for b in back)
    reference = rng.uniform(0.05, 0.1, n)
    times = (reference * np.asarray(plan) / np.asarray(back))[:, None] * rng.uniform(
        0.9, 1.4, (n, 5)
    )
    window = Window(times, plan, 0, 5)
    state = SimpleNamespace(reference=reference.tolist())
    new = rollback_floors(model, state, window, back)
    assert len({(q, b) for q, b, _ in new}) == len(new)  # one floor per rank and start
    assert len(new) <= n * 6  # starts: at most the 6 sizes a rank can move to or from
    if n <= 64:  # the rank-by-rank floors (quadratic: skipped at 4096)
        sizes = np.arange(1, 20)
        curves = np.tile(0.01 * sizes, (n, 1))
        old = _old_rollback_floors(model, state, window, back)
        np.testing.assert_allclose(
            with_floors(curves, sizes, new), with_floors(curves, sizes, old), rtol=1e-12
        )
