"""A fresh fit's first plan from a prior: rates per device from a log, a profile or a mapping."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_rex.core.plans.minimax import plan_from_device_rates
from lightning_rex.driver.prior import fit_rate, load_prior
from lightning_rex.sim.cli.trace import run_traced
from lightning_rex.sim.engine.engine import simulate
from lightning_rex.sim.policies.builtin import OraclePolicy, oracle_plan
from lightning_rex.sim.scenarios.schema import load_scenario


def test_an_affine_curve_is_fitted_exactly():
    sizes = [8, 16, 32, 64]
    assert fit_rate(sizes, [0.004 + b / 2000 for b in sizes]) == pytest.approx([2000, 0.004])
    # one size only: through the origin
    assert fit_rate([32, 32], [0.02, 0.02]) == pytest.approx([1600, 0.0])
    assert fit_rate([8], [-1.0]) is None


def test_a_previous_runs_log_gives_each_kinds_rate(tmp_path):
    scen = dataclasses.replace(load_scenario("a100-v100-t4-8"), steps=600)
    _, records = run_traced(scen, "rex", 0, simulate(scen, OraclePolicy(scen), 0))
    log = tmp_path / "run" / "rex_decisions.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    rates = load_prior(tmp_path / "run")  # the run directory
    assert set(rates) == {"sim:A100", "sim:V100", "sim:T4"}
    assert rates["sim:A100"][0] > rates["sim:V100"][0] > rates["sim:T4"][0]
    plan = plan_from_device_rates(rates, records[-1]["devices"], 512, 1, None)
    assert plan is not None and sum(plan) == 512
    # on the scenario's true curves, the prior's plan is within 5% of the best plan's step
    # (the even split is 2.5x slower)
    best, even = oracle_plan(scen, 512), (64,) * 8
    step = scen.base_times(plan).max()
    assert step <= 1.05 * scen.base_times(best).max() < scen.base_times(even).max() / 2


def test_a_profile_and_a_mapping_merge_later_sources_winning(tmp_path):
    profile = tmp_path / "h200.json"
    curve = [[b, 0.003 + b / 5000] for b in (1, 4, 16, 64)]
    profile.write_text(json.dumps({"rank": {"curve": curve, "device": "NVIDIA H200"}}))
    rates = load_prior([{"NVIDIA H200": [1.0, 0.0], "cpu": [500, 0.01]}, profile])
    assert rates["NVIDIA H200"] == pytest.approx([5000, 0.003])
    assert rates["cpu"] == [500.0, 0.01]


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({"a100": [0, 0.01]}, r"prior\['a100'\] needs a rate > 0"),
        ({"a100": "fast"}, r"prior\['a100'\] must be \[rate"),
        ({}, "names no device"),
        ([], "empty list"),
        (3, "prior must be rates per device"),
        ("/nonexistent/rex_decisions.jsonl", "no such file"),
    ],
)
def test_bad_priors_are_refused_naming_prior(source, match):
    with pytest.raises(ValueError, match=match):
        load_prior(source)


def test_a_log_without_devices_or_a_json_that_is_no_profile_is_refused(tmp_path):
    old = tmp_path / "rex_decisions.jsonl"
    old.write_text(json.dumps({"run_id": "a", "window": [0, 10], "plan": [8], "median_ms": [5]}))
    with pytest.raises(ValueError, match="no records naming their devices"):
        load_prior(old)
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"rank": {"curve": [[1, 0.1]]}}))
    with pytest.raises(ValueError, match="not a profile"):
        load_prior(other)
