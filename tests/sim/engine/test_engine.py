import numpy as np

from lightning_rex.core.plans.plan import even_plan
from lightning_rex.sim import OraclePolicy, load_scenario, run, scenario_from_dict, simulate
from lightning_rex.sim.scenarios.schema import with_steps

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
    # windows of 30 after a warm-up of 1 (the steps are at speed at once): the 7th is
    # [181, 211); its decision is exchanged decision_lag = 15 steps later, at 225, and the
    # plan is in force from 226; the event started at 150: ceil((226 - 150) / 30) = 3 windows
    t = simulate(SCEN, ChangeAt(6, (20, 44)), 0)
    assert t.changes == [(226, (20, 44), (32, 32))]
    r = run(SCEN, ChangeAt(6, (20, 44)), 0)
    assert r.rescales == 1
    assert r.detection_delay_windows == [3]
    assert r.final_plan == [20, 44]
    # made during the event, and counted as any other change: under the event the oracle's
    # plan is (30, 34), and the even plan in force was 5% off it, so the change is not false
    assert r.false_rescales == 0
    # a change before the event, while even is far from the oracle, is not false either; it
    # applies from step 46, and the run never stays near the oracle: the event at 150 makes
    # (48, 16) slow again, and no later change follows
    early = run(SCEN, ChangeAt(0, (48, 16)), 0)
    assert early.false_rescales == 0 and early.time_to_90pct_windows is None
    # a change away from the oracle's plan with no event active, on a balanced cluster, is
    homog = scenario_from_dict({"global_batch": 32, "steps": 120, "ranks": [{"rate": 1e3}] * 2})
    assert run(homog, ChangeAt(1, (17, 15)), 0).false_rescales == 1


def test_oracle_switches_at_event_boundaries():
    o = OraclePolicy(SCEN)
    simulate(SCEN, o, 0)
    assert o.plan_at(0) != o.plan_at(150)
    assert o.plan_at(0)[0] > o.plan_at(0)[1]


def test_rex_beats_even_on_a_preset():
    s = with_steps(load_scenario("pair-3x"), 600)
    assert run(s, "rex", 0).efficiency > run(s, "even", 0).efficiency + 0.2
    assert np.isfinite(run(s, "rex", 0).decision_ms_p50)


class Plans:
    """A user policy: a fixed plan after each of the given windows."""

    name = "plans"

    def __init__(self, plans):
        self.plans = plans

    def reset(self, info):
        self.seen = 0

    def observe(self, window):
        self.seen += 1
        return self.plans.get(self.seen - 1)


def test_time_to_90pct_is_where_the_run_stays_there():
    # (48, 16) is near the oracle from step 46 until the event at 150 slows rank 0 threefold;
    # the event's plan (30, 34) is in force from 196, so the chunk [180, 210) is still off,
    # and the first chunk from which the run stays within 90% is [210, 240): index 7, not 2
    r = run(SCEN, Plans({0: (48, 16), 5: (30, 34)}), 0)
    assert r.rescales == 2 and r.plan_changes == 2
    assert r.time_to_90pct_windows == 7
    # a run that ends below 90% never got there
    assert run(SCEN, Plans({0: (48, 16)}), 0).time_to_90pct_windows is None


def test_a_change_during_an_event_can_be_false():
    # an "event" of factor 1 changes nothing: the even plan stays the oracle's, and a change
    # away from it while the event is active is counted (it was skipped before)
    d = {"global_batch": 32, "steps": 120, "ranks": [{"rate": 1e3}] * 2}
    flat = scenario_from_dict(
        {**d, "events": [{"ranks": [0], "start": 0, "end": 120, "factor": 1.0}]}
    )
    assert run(flat, Plans({1: (17, 15)}), 0).false_rescales == 1
