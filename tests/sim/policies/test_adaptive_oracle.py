"""The adaptive oracle: the goodput-optimal batch at every step, and a change that pays."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.helpers.workload import workload_scenario

from lightning_rex.sim.engine import goodput
from lightning_rex.sim.engine.goodput import run_goodput
from lightning_rex.sim.policies.adaptive_oracle import AdaptiveOraclePolicy
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.builtin import oracle_plan
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict

# the noise scale grows from b0 to 32 b0 over the run: the best batch grows with it
_GROWING = {"trace": [[0, 1 / 1024, 1 / 32], [32 * 400.0, 1 / 1024, 1.0]]}


def _info(s, batch_range) -> PolicyInfo:
    n = s.world_size
    return PolicyInfo(s.global_batch, n, 30, 1, (None,) * n, (8,) * n, 0, batch_range=batch_range)


def test_it_starts_at_the_best_batch_with_that_batch_s_minimax_plan() -> None:
    s = scenario_from_dict(workload_scenario(**_GROWING))
    assert s.workload is not None
    pol = AdaptiveOraclePolicy(s, grid=12)
    pol.reset(_info(s, s.workload.batch_range))
    assert 32 in pol.batches and len(pol.batches) <= 13
    rate = pol.goodput(0.0)
    assert pol.batch == int(pol.batches[np.argmax(rate)])
    assert pol.start_plan == oracle_plan(s, pol.batch)
    # a batch's goodput is its efficiency-weighted samples over its step time, the slowest
    # rank's at the oracle's plan plus the all-reduce
    phi, b = s.workload.noise_scale(0.0), pol.batches
    step = [float(s.compute_times(np.asarray(oracle_plan(s, int(x))), 0).max()) for x in b]
    assert pol.step_s == pytest.approx(np.array(step) + s.comm)
    assert rate == pytest.approx(b * (phi + 32) / (phi + b) / pol.step_s)
    assert pol.observe(None) is None  # type: ignore[arg-type]


def test_its_grid_holds_the_hindsight_scan_s() -> None:
    s = load_scenario("gns-slow-64")
    assert s.workload is not None
    pol = AdaptiveOraclePolicy(s)
    pol.reset(_info(s, s.workload.batch_range))
    lo, hi = s.workload.batch_range
    scan = np.round(np.geomspace(lo, hi, goodput._SCAN)).astype(np.int64)
    assert set(scan.tolist()) <= set(pol.batches.tolist())


@pytest.mark.parametrize("trace", [_GROWING["trace"], [[0, 1 / 1024, 0.25]]])
def test_it_reaches_the_target_no_later_than_the_best_fixed_batch(trace) -> None:
    s = scenario_from_dict(workload_scenario(trace=trace))
    oracle = run_goodput(s, "adaptive-oracle", 0)
    hindsight = run_goodput(s, "hindsight", 0)
    assert oracle.reached and hindsight.reached
    assert oracle.time_to_target_s is not None and hindsight.time_to_target_s is not None
    # the same noise seed: the same draws of step times, up to the plans run
    assert oracle.time_to_target_s <= hindsight.time_to_target_s * 1.01
    sizes = [b for _, b in oracle.batches]
    if len(trace) > 1:  # the batch only grows, as the noise scale does
        assert oracle.batch_changes >= 1 and sizes == sorted(sizes)
    else:  # a flat noise scale: the best batch from the first step, and no change
        assert oracle.batch_changes == 0


def test_a_change_is_made_exactly_when_it_pays() -> None:
    s = scenario_from_dict(workload_scenario(**_GROWING))
    pol = AdaptiveOraclePolicy(s, grid=12)
    pol.reset(_info(s, s.workload.batch_range))  # type: ignore[union-attr]
    w, plan = s.workload, pol.start_plan
    assert w is not None and plan is not None
    step = 0
    while True:  # step on at the start's batch until the rule moves
        before, cur = pol.progress, pol.current
        moved = pol.observe_step(step, np.zeros(4), plan)
        rate = pol.goodput(pol.progress)
        best = int(np.argmax(rate))
        saved = (w.target_progress - pol.progress) * (1 / rate[cur] - 1 / rate[best])
        assert pol.progress == pytest.approx(before + w.step_progress(sum(plan), before))
        if moved is not None:
            assert saved > s.shape_change_s and moved == pol.plans[best]
            break
        assert best == cur or saved <= s.shape_change_s
        step += 1
    assert step > 0  # the start's batch was the best for a while


def test_a_change_must_pay_for_its_shape_change() -> None:
    s = scenario_from_dict(workload_scenario(**_GROWING))
    costly = dataclasses.replace(s, shape_change_s=1e6)
    pol = AdaptiveOraclePolicy(costly)
    pol.reset(_info(costly, costly.workload.batch_range))  # type: ignore[union-attr]
    plan = pol.start_plan
    assert plan is not None
    assert all(pol.observe_step(i, np.zeros(4), plan) is None for i in range(300))
    assert run_goodput(costly, "adaptive-oracle", 0).batch_changes == 0


def test_it_needs_a_workload_and_two_batches() -> None:
    with pytest.raises(ValueError, match="has no workload"):
        AdaptiveOraclePolicy(load_scenario("pair-3x"))
    s = scenario_from_dict(workload_scenario())
    with pytest.raises(ValueError, match="grid must be >= 2"):
        AdaptiveOraclePolicy(s, grid=1)
