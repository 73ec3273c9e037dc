"""Scenario step times: curve shapes per rank, noise families and the cost of a new shape."""

import numpy as np
import pytest

from lightning_rex.sim import run, scenario_from_dict, simulate
from lightning_rex.sim.engine.times import ScenarioTimes, ShapeCache
from lightning_rex.sim.scenarios.scenario import ScenarioError
from lightning_rex.sim.scenarios.schema import to_dict

CURVE = [[1, 0.010], [8, 0.012], [32, 0.030], [64, 0.058]]
RANKS = [
    {"rate": 1000.0, "overhead_s": 0.002, "knee": 4, "mem_cap": 64},
    {"rate": 1000.0, "overhead_s": 0.002, "tile": 16, "mem_cap": 64, "device": "T"},
    {"curve": CURVE, "mem_cap": 64, "device": "M"},
    {"rate": 1000.0, "mem_cap": 64, "wall": {"start": 0.5, "factor": 3.0}},
]


def _scen(**kw):
    return scenario_from_dict({"global_batch": 96, "steps": 90, "ranks": RANKS, **kw})


def test_every_rank_follows_its_own_curve_shape():
    s = _scen()
    t = s.base_times(np.array([16, 17, 20, 48]))
    assert t[0] == pytest.approx(0.002 + 16 / 1000)
    assert t[1] == pytest.approx(0.002 + 32 / 1000)  # 17 rounds up to the 16-tile's 32
    assert 0.012 < t[2] < 0.030  # PCHIP between the measured points
    assert t[3] == pytest.approx(48 / 1000 * (1 + 2.0 * ((48 / 64 - 0.5) / 0.5) ** 2))
    assert s.devices == (None, "T", "M", None)
    # round trip through the JSON mapping, every shape intact
    again = scenario_from_dict(to_dict(s))
    assert again == s
    assert np.array_equal(again.base_times(np.full(4, 24)), s.base_times(np.full(4, 24)))


@pytest.mark.parametrize(
    ("rank", "message"),
    [
        ({"curve": CURVE, "rate": 5.0}, "ranks[0].curve replaces ranks[0].rate"),
        ({"curve": [[1, 0.01]]}, "ranks[0].curve: a table curve needs at least 2 points"),
        ({"curve": [[4, 0.01], [2, 0.02]]}, "b values must be strictly increasing"),
        ({"curve": [[1, 0.01], [2, -1]]}, "time must be finite and > 0"),
        ({"rate": 1.0, "wall": {"start": 0.8}}, "ranks[0].wall needs ranks[0].mem_cap"),
        ({"rate": 1.0, "mem_cap": 64, "wall": {"start": 1.0}}, "wall.start must be < 1"),
        ({"rate": 1.0, "mem_cap": 64, "wall": {"factor": 0.5}}, "wall.factor must be >= 1"),
        ({"rate": 1.0, "tile": 0}, "ranks[0].tile must be >= 1"),
        ({"rate": 1.0, "device": ""}, "ranks[0].device must be a non-empty string"),
    ],
)
def test_bad_curve_shapes_name_the_field(rank, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scenario_from_dict({"global_batch": 8, "steps": 10, "ranks": [rank]})


@pytest.mark.parametrize(
    ("noise", "message"),
    [
        ({"ar1": 0.5, "components": [{"share": 1.0, "ar1": 0.5}]}, "components replaces"),
        ({"components": [{"share": 0.5, "ar1": 0.5}]}, "shares must sum to 1"),
        ({"components": [{"share": 1.0, "ar1": 1.0}]}, r"components\[0\].ar1 must be in"),
        ({"components": []}, "a list of 1 to 16 components"),
        ({"spikes": {"prob": 1.5, "factor": 2.0}}, "noise.spikes.prob must be <= 1"),
        ({"spikes": {"prob": 0.1}}, "missing required field noise.spikes.factor"),
    ],
)
def test_bad_noise_names_the_field(noise, message):
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict(
            {"global_batch": 8, "steps": 10, "ranks": [{"rate": 1.0}], "noise": noise}
        )


def test_shape_cache_keeps_the_last_distinct_sizes():
    c = ShapeCache([4, 4], size=2)
    assert list(c.misses(np.array([4, 5]))) == [False, True]
    assert list(c.misses(np.array([4, 6]))) == [False, True]  # rank 1 now holds {5, 6}
    assert list(c.misses(np.array([4, 5]))) == [False, False]
    assert list(c.misses(np.array([4, 4]))) == [False, True]  # 4 was evicted
    assert list(c.misses(np.array([4, 4]))) == [False, False]  # no change, no check


def test_a_new_shape_costs_its_rank_once_and_the_noise_does_not_move():
    s = _scen(shape_change_s=0.5, shape_cache=2)
    free = ScenarioTimes(_scen(), 3, (24, 24, 24, 24))
    paid = ScenarioTimes(s, 3, (24, 24, 24, 24))
    plans = [(24, 24, 24, 24), (30, 24, 18, 24), (30, 24, 18, 24), (24, 24, 24, 24)]
    extra = [paid(i, np.array(p)) - free(i, np.array(p)) for i, p in enumerate(plans)]
    assert np.allclose(extra[0], 0) and np.allclose(extra[2], 0) and np.allclose(extra[3], 0)
    assert np.allclose(extra[1], [0.5, 0, 0.5, 0])
    assert paid.shape_change_s_total == 1.0 and paid.shape_changes == 2


def test_profiling_draws_its_own_noise_and_warms_the_cache():
    s = _scen(noise={"cv": 0.2, "ar1": 0.5}, shape_change_s=0.5)
    a, b = ScenarioTimes(s, 1, (24,) * 4), ScenarioTimes(s, 1, (24,) * 4)
    prof = a.profile(np.array([[8, 8, 8, 8], [16, 16, 16, 16]]))
    assert prof.shape == (2, 4) and a.shape_change_s_total == 8 * 0.5
    plan = np.array([8, 40, 24, 24])
    got, ref = a(0, plan), b(0, plan)
    # rank 0 ran 8 while profiling (warm); rank 1's 40 is new for both; the noise is the same
    assert got[0] == pytest.approx(ref[0] - 0.5)
    assert got[1] == pytest.approx(ref[1]) and got[2:] == pytest.approx(ref[2:])


class _StepLBBLike:
    """A user step policy: profile once, start from its own plan, move a sample each step."""

    name = "step-user"

    def reset(self, info):
        self.calls = 0

    def profiling_plan(self):
        return [(8, 8), (16, 16)]

    def observe_profile(self, sizes, times):
        assert sizes.shape == times.shape == (2, 2)
        return (40, 24)

    def observe(self, window):
        return None

    def observe_step(self, step, times, plan):
        self.calls += 1
        return (plan[0] - 1, plan[1] + 1) if step in (10, 11) else None


def test_a_step_policy_profiles_then_acts_between_steps():
    s = scenario_from_dict(
        {"global_batch": 64, "steps": 60, "ranks": [{"rate": 1000.0}] * 2, "shape_change_s": 0.1}
    )
    p = _StepLBBLike()
    t = simulate(s, p, 0)
    assert p.calls == 59  # after every step but the last
    assert t.changes[:2] == [(11, (39, 25), (40, 24)), (12, (38, 26), (39, 25))]
    # two profiling steps of 8 and 16 samples, each a new shape on both ranks
    assert t.profile_s == pytest.approx(0.008 + 0.016 + 2 * 0.1)
    # profiling sizes 8 and 16, then 40/24, 39/25, 38/26: 5 new shapes per rank
    assert t.shape_change_s_total == pytest.approx(10 * 0.1)
    r = run(s, _StepLBBLike(), 0)
    assert r.plan_changes == 2 and r.profile_s == t.profile_s
    assert r.throughput == pytest.approx(64 * 60 / t.total_time_s)
