"""Pass caps in the time model and the controller: learn one pass, predict and plan steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.model.accumulation import AccumulationCaps
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.passes import pass_split, pass_total, passes
from lightning_rex.core.plans.filling import water_fill
from lightning_rex.core.plans.proposal import best_plan_for
from lightning_rex.core.window import Window

OVER = np.array([0.20, 0.05, 0.10])  # per-pass fixed seconds
SLOPE = np.array([0.010, 0.020, 0.030])  # seconds per sample
CAPS = [12, None, 8]


def _step(plan, caps=CAPS):
    """True step times: every pass of every rank on its affine single-pass curve."""
    return np.array(
        [
            sum(OVER[r] + SLOPE[r] * x for x in passes(b, c))
            for r, (b, c) in enumerate(zip(plan, caps))
        ]
    )


def _true_grid(g: int) -> np.ndarray:
    sizes = np.arange(1, g + 1)
    k, q, m = pass_split(sizes[None, :], np.array([12, 0, 8])[:, None])
    return pass_total(
        k, m, OVER[:, None] + SLOPE[:, None] * q, OVER[:, None] + SLOPE[:, None] * (q + 1)
    )


def _trained(plans=((16, 16, 16), (24, 16, 8), (10, 20, 18), (20, 12, 16), (12, 24, 12))):
    m = RankTimeModel(3, 48, 46, pass_caps=CAPS)
    rng = np.random.default_rng(0)
    for p in plans * 2:
        m.add(p, _step(p) * np.exp(rng.normal(0, 0.003, 3)), 0.003**2)
    return m


def test_the_model_learns_single_passes_from_accumulating_windows():
    m = _trained()
    assert m.passes.windows[0] == [12, 0, 8]
    mean, _ = m.predict_grid(np.arange(1, 41))
    true = _true_grid(40)
    np.testing.assert_allclose(mean[:, 4:], true[:, 4:], rtol=0.04)
    # the staircase: one more sample past a cap costs a whole pass's fixed time
    assert mean[0, 12] - mean[0, 11] == pytest.approx(OVER[0] + SLOPE[0], rel=0.25)
    assert mean[2, 8] - mean[2, 7] == pytest.approx(OVER[2] + SLOPE[2], rel=0.25)
    np.testing.assert_allclose(m.predict((30, 9, 9)), _step((30, 9, 9)), rtol=0.04)


def test_the_planner_prices_the_extra_passes():
    m = _trained()
    lo, hi = np.ones(3, dtype=np.int64), np.full(3, 46, dtype=np.int64)
    plan, predicted = best_plan_for(m, lo, hi, 48)
    true = _true_grid(46)
    best = water_fill(true, 48, lo, hi)
    rows = np.arange(3)
    got, want = true[rows, np.asarray(plan) - 1].max(), true[rows, np.asarray(best) - 1].max()
    assert got <= want * 1.02
    assert predicted == pytest.approx(got, rel=0.04)


def test_without_caps_the_predictions_are_the_single_pass_ones():
    m = _trained()
    capped = m.predict_grid(np.arange(1, 13), kappa=0.5)
    m.passes.set(None)  # the windows stay learnt as run under their caps
    assert m.passes.current is None and m.passes.windows[-1] == [12, 0, 8]
    single = m.predict_grid(np.arange(1, 13), kappa=0.5)
    # sizes within every cap: one pass, the same prediction
    np.testing.assert_allclose(capped[0][:, :8], single[0][:, :8], rtol=1e-12)
    np.testing.assert_allclose(capped[0][[0, 1]], single[0][[0, 1]], rtol=1e-12)


def _negative_overhead_grid(sizes, kappa=0.0, var_points=96):
    """A single-pass curve with a negative intercept, as a poorly separated fit can give."""
    times = -0.5 + 0.1 * np.asarray(sizes, dtype=float)[None, :]
    return times, times - kappa * 0.01


def _negative_overhead(plan):
    return -0.5 + 0.1 * np.asarray(plan, dtype=float)


def test_accumulation_is_never_predicted_faster_than_one_pass():
    caps = AccumulationCaps(1, [10])
    mean, low = caps.step_grid(_negative_overhead_grid, np.arange(1, 31), kappa=1.0)
    single = -0.5 + 0.1 * np.arange(1, 31)
    assert np.all(mean[0] >= single - 1e-12) and np.all(low[0] >= single - 0.01 - 1e-12)
    assert np.all(np.diff(mean[0]) >= 0)  # and so the staircase does not fall
    assert caps.step_times(_negative_overhead, (25,))[0] >= -0.5 + 2.5 - 1e-12


def test_pass_caps_round_trip_and_old_states_load():
    m = _trained()
    d = json.loads(json.dumps(m.state_dict()))
    m2 = RankTimeModel(3, 48, 46)
    m2.load_state_dict(d)
    assert m2.passes.as_list() == [12, None, 8] and m2.passes.windows == m.passes.windows
    g = np.arange(1, 47)
    np.testing.assert_array_equal(m.predict_grid(g)[0], m2.predict_grid(g)[0])
    old = {k: v for k, v in d.items() if k not in ("pass_caps", "window_caps")}
    m3 = RankTimeModel(3, 48, 46)
    m3.load_state_dict(old)
    assert m3.passes.current is None and m3.passes.windows == [None] * m3.n_obs


def test_the_controller_takes_pass_caps_as_soft():
    c = Controller(48, 3, pass_caps=CAPS)
    assert c.pass_caps == [12, None, 8] and c.bounds.rank_caps is None
    rng = np.random.default_rng(1)
    w = Window(0.5 * np.exp(rng.normal(0, 0.01, (3, 30))), (16, 16, 16), 0, 30)
    assert c.observe(w).kind == "hold"  # balanced: nothing to do
    c.set_pass_caps([12, None, 6])
    assert c.model.passes.as_list() == [12, None, 6]
    c.try_plan((30, 10, 8))  # above rank 0's cap: a priced size, not a broken bound
    assert c.phase == "validating"
    with pytest.raises(ValueError, match="pass_caps must have 3 entries"):
        c.set_pass_caps([4])
