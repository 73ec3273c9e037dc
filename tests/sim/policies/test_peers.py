from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_rex.core.plans.minimax import repair_plan, resolve_bounds
from lightning_rex.core.plans.plan import even_plan
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.lbb import (
    LBB_SIZES,
    LBBPolicy,
    lbb_fit,
    lbb_imbalance,
    lbb_move,
    lbb_online_model,
    lbb_profile_sizes,
    lbb_solve,
    lbb_step,
    lbb_trimmed_mean,
)
from lightning_rex.sim.policies.omnilearn import OmniLearnPolicy, omnilearn_adjust
from lightning_rex.sim.scenarios.schema import with_shape_change, with_steps


@dataclass(frozen=True)
class EpochInfo(PolicyInfo):
    """PolicyInfo as the engine will extend it."""

    epoch_steps: int = 300


def make_info(b, n, min_size=1, caps=None, epoch_steps=None):
    caps = tuple(caps) if caps is not None else (None,) * n
    lo, hi = resolve_bounds(n, b, min_size, caps)
    start = tuple(int(x) for x in repair_plan(np.array(even_plan(b, n)), b, lo, hi))
    args = (b, n, 30, min_size, caps, start, 0)
    if epoch_steps is None:
        return PolicyInfo(*args)
    return EpochInfo(*args, epoch_steps=epoch_steps)


def arr(*xs):
    return np.array(xs, dtype=float)


def valid(plan, info):
    lo, hi = resolve_bounds(info.world_size, info.global_batch, info.min_size, info.max_sizes)
    return (
        isinstance(plan, tuple)
        and len(plan) == info.world_size
        and all(type(b) is int for b in plan)
        and sum(plan) == info.global_batch
        and bool(np.all(np.asarray(plan) >= lo))
        and bool(np.all(np.asarray(plan) <= hi))
    )


def profile(pol, curves, rng=None, outliers=False):
    """Run the warm-up with times curves[r](b); optional trimmed-away outliers."""
    sizes = np.array(pol.profiling_plan(), dtype=float)
    times = np.array([[curves[r](b) for r, b in enumerate(row)] for row in sizes])
    if outliers:  # in every 9-run group, 3 runs far too slow and 3 far too fast
        for g in range(0, len(times), 9):
            times[g : g + 3] *= 5.0
            times[g + 3 : g + 6] *= 0.2
    return pol.observe_profile(sizes, times)


# ---------------------------------------------------------------- LBB: the raw rules


def test_lbb_imbalance_is_spread_over_mean():
    assert lbb_imbalance(arr(1.0, 1.2, 0.8)) == pytest.approx(0.4)
    assert lbb_imbalance(arr(0.5, 0.5)) == 0.0


def test_lbb_step_quiet_counts_and_moves_only_below_the_window():
    assert lbb_step(0.03, 0) == ("move", 1)  # quiet, but fewer than 30 quiet steps: move
    assert lbb_step(0.03, 28) == ("move", 29)
    assert lbb_step(0.03, 29) == ("quiet", 30)  # the 30th quiet step: no move
    assert lbb_step(0.0, 40) == ("quiet", 41)


def test_lbb_step_fine_band():
    assert lbb_step(0.10, 40) == ("move", 40)
    assert lbb_step(0.15, 40) == ("move", 40)  # upper edge included
    assert lbb_step(0.055, 40) == ("move", 41)  # quiet (<= 6%) and fine (> 5%) at once
    assert lbb_step(0.05, 40) == ("quiet", 41)  # lower edge excluded from the band


def test_lbb_step_severe():
    assert lbb_step(0.2, 31) == ("resolve", 0)  # more than 30 quiet steps: re-solve
    assert lbb_step(0.2, 10) == ("move", 10)  # too few: one sample moves instead
    assert lbb_step(0.2, 30) == ("hold", 30)  # exactly 30: neither branch fires


def test_lbb_move_one_sample_slowest_to_fastest_within_bounds():
    lo, hi = np.array([1, 1, 1]), np.array([20, 20, 20])
    got = lbb_move(np.array([10, 10, 10]), arr(0.3, 0.1, 0.2), lo, hi)
    assert got.tolist() == [9, 11, 10]
    assert lbb_move(np.array([1, 10, 10]), arr(0.3, 0.1, 0.2), lo, hi).tolist() == [1, 10, 10]
    assert lbb_move(np.array([10, 20, 1]), arr(0.3, 0.1, 0.2), lo, hi).tolist() == [10, 20, 1]


def test_lbb_solve_two_linear_ranks():
    coeffs = np.array([[0.0, 1 / 1000, 0.0, 0.0], [0.0, 1 / 500, 0.0, 0.0]])
    lo, hi = np.array([1, 1]), np.array([299, 299])
    assert lbb_solve(coeffs, 300, lo, hi) == (200, 100)
    p = lbb_solve(coeffs, 100, np.array([1, 1]), np.array([99, 99]))
    assert p in {(67, 33), (66, 34)} and sum(p) == 100
    assert lbb_solve(coeffs, 300, lo, np.array([150, 299])) == (150, 150)  # capped


def test_lbb_solve_three_affine_ranks_by_hand():
    # t = 0.01 + b/1000, b/500, 0.02 + b/1000; equal at T = 0.2 when B = 470.
    coeffs = np.array([[0.01, 1e-3], [0.0, 2e-3], [0.02, 1e-3]])
    lo, hi = np.ones(3, dtype=int), np.full(3, 468)
    assert lbb_solve(coeffs, 470, lo, hi) == (190, 100, 180)


def test_lbb_online_model_keeps_warmup_startup_and_takes_rate_from_the_step():
    coeffs = np.array([[0.01, 1e-3, 0.0, 0.0], [0.0, 2e-3, 0.0, 0.0]])
    model = lbb_online_model(coeffs, np.array([100, 100]), arr(0.21, 0.5))
    start = np.array([0.01 + 1e-5, 2e-5])  # the cubic at b = 0.01
    np.testing.assert_allclose(model[:, 0], start)
    np.testing.assert_allclose(model[:, 1], (arr(0.21, 0.5) - start) / 100)
    bare = lbb_online_model(None, np.array([100, 100]), arr(0.2, 0.5))
    np.testing.assert_allclose(bare, [[0.0, 0.002], [0.0, 0.005]])


# ---------------------------------------------------------------- LBB: the warm-up


def test_profiling_plan_doubles_to_256_nine_times_and_respects_bounds():
    pol = LBBPolicy()
    pol.reset(make_info(300, 2, min_size=4, caps=(None, 100)))
    plan = pol.profiling_plan()
    assert len(plan) == 8 * 9
    assert LBB_SIZES == (2, 4, 8, 16, 32, 64, 128, 256)
    want = [(4, 4), (4, 4), (8, 8), (16, 16), (32, 32), (64, 64), (128, 100), (256, 100)]
    assert plan == [row for row in want for _ in range(9)]
    lo, hi = np.array([1, 1]), np.array([500, 30])
    assert lbb_profile_sizes(lo, hi, (2, 64), 2) == [(2, 2), (2, 2), (64, 30), (64, 30)]


def test_trimmed_mean_drops_three_highest_and_three_lowest_of_nine():
    assert lbb_trimmed_mean(arr(100, 1, 2, 3, 50, 4, 5, -10, 6)) == pytest.approx(4.0)
    assert lbb_trimmed_mean(arr(1, 2, 3)) == pytest.approx(2.0)


def test_cubic_fit_recovers_a_known_cubic_through_outliers():
    c = np.array([0.005, 2e-4, 3e-7, 4e-10])
    pol = LBBPolicy()
    pol.reset(make_info(600, 2))
    for outliers in (False, True):
        profile(pol, [lambda b: np.polynomial.polynomial.polyval(b, c)] * 2, outliers=outliers)
        assert pol.coeffs is not None
        np.testing.assert_allclose(pol.coeffs, np.stack([c, c]), rtol=1e-6, atol=1e-15)


def test_fit_degrades_degree_with_few_distinct_sizes():
    sizes = np.array([[2, 2], [4, 3], [8, 3]], dtype=float)
    times = 0.1 + 0.01 * sizes
    np.testing.assert_allclose(lbb_fit(sizes, times)[1], [0.1, 0.01, 0, 0], atol=1e-12)


def test_observe_profile_returns_the_solved_plan_for_known_curves():
    pol = LBBPolicy()
    pol.reset(make_info(300, 2))
    plan = profile(pol, [lambda b: b / 1000, lambda b: b / 500], outliers=True)
    assert plan == (200, 100)


# ---------------------------------------------------------------- LBB: the policy trace


def lbb_after_equal_warmup(quiet_steps):
    pol = LBBPolicy()
    info = make_info(300, 2)
    pol.reset(info)
    plan = profile(pol, [lambda b: b / 1000] * 2)
    assert plan == (150, 150)
    for s in range(quiet_steps):  # equal times: lv = 0, quiet; moves are no-ops
        assert pol.observe_step(s, arr(0.15, 0.15), plan) is None
    return pol, plan


def test_policy_resolves_after_more_than_30_quiet_steps():
    pol, plan = lbb_after_equal_warmup(31)
    assert pol.quiet == 31
    new = pol.observe_step(31, arr(0.15, 0.30), plan)  # rank 1 now twice as slow: lv = 2/3
    # line through (0.01, ~1e-5) and (150, t): balanced at b0 / b1 = 2
    assert new == (200, 100)
    assert pol.resolves == 1 and pol.quiet == 0 and pol.last_action == "resolve"


def test_policy_moves_one_sample_instead_when_too_few_quiet_steps():
    pol, plan = lbb_after_equal_warmup(10)
    assert pol.observe_step(10, arr(0.15, 0.30), plan) == (151, 149)
    assert pol.resolves == 0 and pol.last_action == "move"


def test_policy_fine_move_and_quiet_steps():
    pol = LBBPolicy()
    info = make_info(120, 3)
    pol.reset(info)
    plan = (40, 40, 40)
    quiet_t = arr(0.101, 0.099, 0.100)  # lv = 2%: quiet
    for s in range(29):  # fewer than 30 quiet steps: each still moves one sample
        new = pol.observe_step(s, quiet_t, plan)
        assert new is not None and np.abs(np.subtract(new, plan)).sum() == 2
        assert new[0] == plan[0] - 1 and new[1] == plan[1] + 1
        plan = new
    assert pol.observe_step(29, quiet_t, plan) is None  # the 30th quiet step: no move
    assert pol.observe_step(30, quiet_t, plan) is None
    fine = pol.observe_step(31, arr(0.095, 0.100, 0.105), plan)  # lv = 10%
    assert fine == (plan[0] + 1, plan[1], plan[2] - 1)


# ---------------------------------------------------------------- OmniLearn: the raw rule

LO3, HI3 = np.ones(3, dtype=int), np.full(3, 118)


def test_omnilearn_gate_19_percent_keeps_21_percent_changes():
    # t_bar = 1: rank 0 is 21% slow and proposes 40 / 1.21 = 33.06 -> 34; rank 1 (19% fast)
    # and rank 2 keep 40. Sum 114, k = -6, spread +2 each.
    raw = omnilearn_adjust(np.array([40, 40, 40]), arr(1.21, 0.81, 0.98), 120, LO3, HI3)
    assert raw.tolist() == [36, 42, 42] and raw.sum() == 120


def test_omnilearn_proposal_spread_and_ceil_overshoot_by_k_mod_n():
    # rank 1 now 21% fast: 40 / 0.79 = 50.63 -> 51. a = (34, 51, 40), k = 5,
    # ceil(a - 5/3) = a - 1 = (33, 50, 39): sum 122 = B + (5 mod 3).
    raw = omnilearn_adjust(np.array([40, 40, 40]), arr(1.21, 0.79, 1.0), 120, LO3, HI3)
    assert raw.tolist() == [33, 50, 39] and raw.sum() == 122


def test_omnilearn_overshoot_two_ranks_after_clipping():
    # t_bar = 2: proposals 64 (clipped to 63) and 21.33 -> 22; k = 21; spread -10.5, ceil.
    raw = omnilearn_adjust(np.array([32, 32]), arr(1.0, 3.0), 64, np.ones(2), np.full(2, 63))
    assert raw.tolist() == [53, 12] and raw.sum() == 64 + 1


def test_omnilearn_even_start_gives_a_negative_size():
    # t_bar = 3.25: fast ranks propose 104, the slow one 10.4 -> 11; k = 195, spread -48.75.
    raw = omnilearn_adjust(
        np.full(4, 32), arr(1, 1, 1, 10), 128, np.ones(4, dtype=int), np.full(4, 125)
    )
    assert raw.tolist() == [56, 56, 56, -37] and raw.sum() == 128 + 195 % 4


def test_omnilearn_within_deadband_is_identity():
    raw = omnilearn_adjust(np.array([40, 40, 40]), arr(1.1, 0.9, 1.0), 120, LO3, HI3)
    assert raw.tolist() == [40, 40, 40]


def test_repair_plan_is_the_smallest_fix():
    lo, hi = np.ones(4, dtype=int), np.full(4, 125)
    assert repair_plan(np.array([56, 56, 56, -37]), 128, lo, hi).tolist() == [42, 42, 43, 1]
    assert repair_plan(np.array([53, 12]), 64, lo[:2], hi[:2]).tolist() == [52, 12]
    assert repair_plan(np.array([10, 20]), 40, lo[:2], np.array([15, 30])).tolist() == [15, 25]
    with pytest.raises(ValueError):
        repair_plan(np.array([10, 20]), 40, lo[:2], np.array([15, 22]))
    assert repair_plan(np.array([3, 5]), 10, lo[:2], hi[:2]).tolist() == [5, 5]


# ---------------------------------------------------------------- OmniLearn: the policy


def test_omnilearn_policy_applies_the_repaired_plan_and_counts_repairs():
    pol = OmniLearnPolicy(epoch_steps=5)
    pol.reset(make_info(128, 4))
    plan = (32, 32, 32, 32)
    for s in range(4):
        assert pol.observe_step(s, arr(1, 1, 1, 10), plan) is None
    new = pol.observe_step(4, arr(1, 1, 1, 10), plan)
    assert pol.last_raw is not None and pol.last_raw.tolist() == [56, 56, 56, -37]
    assert new == (42, 42, 43, 1) and pol.repairs == 1


def test_omnilearn_policy_overshoot_repaired():
    pol = OmniLearnPolicy(epoch_steps=1)
    pol.reset(make_info(64, 2))
    assert pol.observe_step(0, arr(1.0, 3.0), (32, 32)) == (52, 12)
    assert pol.repairs == 1
    assert pol.observe_step(1, arr(1.0, 1.05), (52, 12)) is None  # inside the deadband
    assert pol.repairs == 1


def test_omnilearn_epoch_cadence_from_info_and_default():
    pol = OmniLearnPolicy()
    pol.reset(make_info(64, 2))
    assert pol.epoch_steps == 300  # PolicyInfo without the field
    pol.reset(make_info(64, 2, epoch_steps=10))
    assert pol.epoch_steps == 10
    for s in range(9):
        assert pol.observe_step(s, arr(1.0, 3.0), (32, 32)) is None
    assert pol.observe_step(9, arr(1.0, 3.0), (32, 32)) == (52, 12)


def test_omnilearn_uses_the_epoch_mean():
    pol = OmniLearnPolicy(epoch_steps=4)
    pol.reset(make_info(64, 2))
    steps = [arr(1.0, 3.0), arr(3.0, 1.0)] * 2  # each step imbalanced, the mean is not
    assert all(pol.observe_step(s, t, (32, 32)) is None for s, t in enumerate(steps))
    assert pol.repairs == 0


def test_interface_names_rollbacks_and_no_window_hook():
    for pol, name in ((LBBPolicy(), "lbb"), (OmniLearnPolicy(), "omnilearn")):
        pol.reset(make_info(64, 2))
        assert pol.name == name and pol.rollbacks == 0
        assert pol.observe(None) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- every plan is valid


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 5))
    min_size = draw(st.integers(1, 4))
    b = draw(st.integers(n * min_size + n, 400))
    caps = tuple(draw(st.one_of(st.none(), st.integers(min_size, b))) for _ in range(n))
    try:
        resolve_bounds(n, b, min_size, caps)
    except ValueError:  # caps that cannot hold B
        caps = (None,) * n
    noisy = st.lists(st.floats(1e-3, 1.0, allow_nan=False), min_size=n, max_size=n)
    quiet = st.floats(1e-3, 1.0).map(lambda x: [x] * n)  # balanced: LBB counts it quiet
    steps = draw(st.lists(st.one_of(noisy, quiet), min_size=1, max_size=60))
    return make_info(b, n, min_size, caps, epoch_steps=draw(st.integers(1, 7))), steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 2**31 - 1))
def test_every_returned_plan_is_valid(scenario, seed):
    info, steps = scenario
    rng = np.random.default_rng(seed)
    over, slope = rng.uniform(0, 0.02, info.world_size), rng.uniform(1e-4, 1e-2, info.world_size)
    lbb = LBBPolicy(window=3)
    lbb.reset(info)
    plan = profile(lbb, [lambda b, r=r: over[r] + slope[r] * b for r in range(info.world_size)])
    assert valid(plan, info)
    omni = OmniLearnPolicy()
    omni.reset(info)
    for pol, start in ((lbb, plan), (omni, info.initial_plan)):
        current = start
        for s, t in enumerate(steps):
            new = pol.observe_step(s, np.asarray(t), current)
            if new is not None:
                assert valid(new, info), (pol.name, new)
                current = new


def test_both_peers_run_through_the_engine_and_pay_their_costs():
    from lightning_rex.sim import load_scenario, run

    s = with_shape_change(with_steps(load_scenario("pair-3x"), 600), 0.05)
    lbb = run(s, "lbb", 0)
    # the 8-size warm-up sweep (9 steps each) is paid for before training, and a one-sample
    # move between steps changes shapes
    assert lbb.profile_s > 0 and lbb.plan_changes > 10 and lbb.shape_change_s_total > 0
    assert lbb.final_plan[0] > lbb.final_plan[1]  # the fast rank carries more
    omni = run(s, "omnilearn", 0)  # epochs of 300 steps: it acts once, at step 300
    assert omni.profile_s == 0 and omni.plan_changes == 1 and omni.final_plan[0] > 64
