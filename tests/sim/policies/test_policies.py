import dataclasses
import json

import numpy as np
import pytest
from tests.helpers.cli import run_command

from lightning_rex.core.plans.minimax import water_fill
from lightning_rex.core.plans.plan import even_plan
from lightning_rex.core.window import Window
from lightning_rex.driver.prior import load_prior
from lightning_rex.sim.cli.trace import run_traced
from lightning_rex.sim.engine.engine import simulate
from lightning_rex.sim.engine.scoring import run
from lightning_rex.sim.policies.builtin import (
    OraclePolicy,
    PolicyInfo,
    ProportionalPolicy,
    RexPolicy,
    StaticPolicy,
    ThroughputPolicy,
    fit_plan,
    make_policy,
)
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict

INFO = PolicyInfo(120, 3, 30, 1, (None, None, 50), (40, 40, 40), 0)


def win(plan, med):
    t = np.repeat(np.asarray(med, dtype=float)[:, None], 30, axis=1)
    return Window(t, plan, 0, 30)


def test_fit_plan_respects_sum_and_caps():
    p = fit_plan(np.array([10.0, 10.0, 100.0]), INFO)
    assert sum(p) == 120 and p[2] <= 50


def test_proportional_deadband_and_step():
    pol = ProportionalPolicy()
    pol.reset(INFO)
    assert pol.observe(win((40, 40, 40), [1.0, 1.1, 0.9])) is None
    p = pol.observe(win((40, 40, 40), [2.0, 1.0, 1.0]))
    assert p is not None and p[0] < 40 and sum(p) == 120


def test_static_profiles_then_solves_once():
    pol = StaticPolicy()
    pol.reset(INFO)
    p1 = pol.observe(win((40, 40, 40), [0.04, 0.02, 0.02]))
    assert p1 is not None and p1[0] < p1[1]
    p2 = pol.observe(win(p1, 0.001 + np.array(p1) / np.array([1000.0, 2000.0, 2000.0])))
    assert p2 is not None and sum(p2) == 120 and p2[2] <= 50
    assert pol.observe(win(p2, [1.0, 1.0, 1.0])) is None


def test_rex_is_an_adapter_over_the_controller():
    pol = RexPolicy(persistence=3)
    pol.reset(INFO)
    assert pol.controller.settings.persistence == 3 and pol.controller.plan == (40, 40, 40)
    assert pol.decider() is pol.controller  # the loop drives the controller itself
    d = pol.decider().observe(win((40, 40, 40), [1.0, 1.0, 1.0]))
    assert d.kind == "hold" and pol.rollbacks == 0


def test_the_memory_blind_split_follows_the_first_windows_throughput_once():
    pol = ThroughputPolicy()
    pol.reset(INFO)
    plan = pol.observe(win((40, 40, 40), [1.0, 2.0, 4.0]))  # 40, 20 and 10 samples/s
    assert plan == (69, 34, 17) and sum(plan) == 120
    assert pol.observe(win(plan, [1.0, 1.0, 3.0])) is None  # set once


def test_make_policy_names():
    s = scenario_from_dict({"global_batch": 8, "steps": 30, "ranks": [{"rate": 1.0}] * 2})
    for n in ("even", "static", "proportional", "throughput", "rex", "oracle"):
        assert make_policy(n, s).name == n
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("magic", s)


def test_the_oracle_keeps_the_minimax_time_on_non_monotone_measured_curves():
    # measured tables need not be monotone; water_fill plans on their running maxima, and
    # the sizes the oracle tabulates must not cut a size the optimum needs
    rng = np.random.default_rng(1)
    for _ in range(150):
        n, gb = int(rng.integers(2, 4)), int(rng.integers(8, 80))
        ranks = []
        for _ in range(n):
            bs = np.unique(rng.integers(1, 90, size=int(rng.integers(2, 6))))
            if bs.size < 2:
                bs = np.array([1, 90])
            ts = rng.uniform(0.01, 3.0, size=bs.size)
            ranks.append({"curve": [[int(b), float(t)] for b, t in zip(bs, ts)]})
        s = scenario_from_dict({"global_batch": gb, "steps": 10, "ranks": ranks})
        o = OraclePolicy(s)
        o.reset(PolicyInfo(gb, n, 30, 1, (None,) * n, even_plan(gb, n), 0))
        plan = np.asarray(o.plan_at(0))
        sizes = np.arange(1, gb + 1)
        env = np.maximum.accumulate(s.time_table(sizes, 0), axis=1)
        lo, hi = np.ones(n, dtype=np.int64), np.full(n, gb, dtype=np.int64)
        full = np.asarray(water_fill(s.time_table(sizes, 0), gb, lo, hi))
        rows = np.arange(n)
        assert env[rows, plan - 1].max() == pytest.approx(env[rows, full - 1].max())


def test_rex_with_a_prior_from_a_previous_run_starts_from_its_plan(tmp_path, capsys):
    """A log of seed 0 as the prior of seed 1: the first window measures the fitted plan."""
    scen = dataclasses.replace(load_scenario("a100-v100-t4-8"), steps=300)
    _, recs = run_traced(scen, "rex", 0, simulate(scen, OraclePolicy(scen), 0))
    log = tmp_path / "seed0.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    pol = RexPolicy(prior=load_prior(log))
    oracle = simulate(scen, OraclePolicy(scen), 1)
    res, with_prior = run_traced(scen, pol, 1, oracle)
    assert pol.start_plan is not None and pol.start_plan != (64,) * 8
    assert with_prior[0]["plan"] == list(pol.start_plan) and with_prior[0]["policy"] == "rex"
    assert res.efficiency > run(scen, "rex", 1, oracle=oracle).efficiency
    # from the command line; a bad source is exit 2 with one line
    base = ["simulate", "--scenario", "pair-3x", "--steps", "120", "--json"]
    assert run_command([*base, "--prior", str(log)], capsys)[0] == 0  # no device it knows
    rc, _, err = run_command([*base, "--prior", str(tmp_path / "none.jsonl")], capsys)
    assert (
        rc == 2 and err.strip() == f"simulate: prior: no such file {str(tmp_path / 'none.jsonl')!r}"
    )
