import numpy as np

from lightning_rex.core.plan import even_plan
from lightning_rex.sim import OraclePolicy, load_scenario, run, scenario_from_dict, simulate

SCEN = scenario_from_dict(
    {
        "global_batch": 64,
        "steps": 300,
        "window": 30,
        "comm": 0.002,
        "ranks": [{"rate": 3000.0, "overhead_s": 0.002}, {"rate": 1000.0, "overhead_s": 0.002}],
        "noise": {"cv": 0.1, "ar1": 0.5},
        "events": [{"ranks": [0], "start": 150, "end": 300, "factor": 3.0}],
    },
    name="t",
)


class ChangeAt:
    """A user policy: switch to a fixed plan after a given window."""

    name = "change-at"

    def __init__(self, window, plan):
        self.window, self.plan = window, plan

    def reset(self, info):
        self.seen = 0
        assert info.initial_plan == even_plan(info.global_batch, info.world_size)

    def observe(self, window):
        self.seen += 1
        return self.plan if self.seen == self.window + 1 else None


def test_deterministic_for_a_seed_and_seed_dependent():
    a = run(SCEN, "rex", 3)
    b = run(SCEN, "rex", 3)
    c = run(SCEN, "rex", 4)
    assert a.to_dict()["throughput"] == b.to_dict()["throughput"]
    assert a.window_step_s == b.window_step_s
    assert a.throughput != c.throughput


def test_oracle_sets_the_limit_and_even_trails_it():
    o = run(SCEN, "oracle", 0)
    e = run(SCEN, "even", 0)
    assert o.efficiency == 1.0 and o.rescales == 0
    assert e.efficiency < 0.8 and e.rescales == 0
    assert e.limit_throughput == o.throughput


def test_same_noise_for_every_policy():
    p = ChangeAt(100, None)
    t1 = simulate(SCEN, p, 1)
    t2 = simulate(SCEN, run.__globals__["make_policy"]("even", SCEN), 1)
    assert t1.window_step_s == t2.window_step_s


def test_metrics_of_a_user_policy():
    # windows of 30 after a warm-up of 10: the 7th is [190, 220); its decision is exchanged
    # decision_lag = 15 steps later, at 234, and the plan is in force from 235; the event
    # started at 150: ceil((235 - 150) / 30) = 3 windows
    t = simulate(SCEN, ChangeAt(6, (20, 44)), 0)
    assert t.changes == [(235, (20, 44), (32, 32))]
    r = run(SCEN, ChangeAt(6, (20, 44)), 0)
    assert r.rescales == 1
    assert r.detection_delay_windows == [3]
    assert r.final_plan == [20, 44]
    assert r.false_rescales == 0  # an event is active when it applies
    # a change before the event, while even is far from the oracle, is not false either; it
    # applies from step 55, so the chunk [60, 90) is the first one near the oracle
    early = run(SCEN, ChangeAt(0, (48, 16)), 0)
    assert early.false_rescales == 0 and early.time_to_90pct_windows == 2
    # a change away from the oracle's plan with no event active, on a balanced cluster, is
    homog = scenario_from_dict({"global_batch": 32, "steps": 120, "ranks": [{"rate": 1e3}] * 2})
    assert run(homog, ChangeAt(1, (17, 15)), 0).false_rescales == 1


def test_oracle_switches_at_event_boundaries():
    o = OraclePolicy(SCEN)
    simulate(SCEN, o, 0)
    assert o.plan_at(0) != o.plan_at(150)
    assert o.plan_at(0)[0] > o.plan_at(0)[1]


def test_rex_beats_even_on_a_preset():
    s = load_scenario("pair-3x").with_steps(600)
    assert run(s, "rex", 0).efficiency > run(s, "even", 0).efficiency + 0.2
    assert np.isfinite(run(s, "rex", 0).decision_ms_p50)
