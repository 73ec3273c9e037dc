import numpy as np
import pytest

from lightning_rex.core.window import Window
from lightning_rex.sim.policies import (
    PolicyInfo,
    ProportionalPolicy,
    RexPolicy,
    StaticPolicy,
    fit_plan,
    make_policy,
)
from lightning_rex.sim.scenario import scenario_from_dict

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
    assert pol.controller.persistence == 3 and pol.controller.plan == (40, 40, 40)
    pol.observe(win((40, 40, 40), [1.0, 1.0, 1.0]))
    assert len(pol.decisions) == 1 and pol.rollbacks == 0


def test_make_policy_names():
    s = scenario_from_dict({"global_batch": 8, "steps": 30, "ranks": [{"rate": 1.0}] * 2})
    for n in ("even", "static", "proportional", "rex", "oracle"):
        assert make_policy(n, s).name == n
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("magic", s)
