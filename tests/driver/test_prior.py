"""A fresh fit's first plan from a prior: rates per device from a log, a profile or a mapping."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from lightning_rex.core.plans.minimax import plan_from_device_rates
from lightning_rex.driver import records
from lightning_rex.driver.prior import MAX_PROFILE_BYTES, fit_rate, load_prior, missing_devices
from lightning_rex.driver.records import DecisionLog
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


# ------------------------------------------------------------------ what is refused, and why
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("12", r"'12'"),  # a string is a Sequence: once read as [1.0, 2.0]
        (b"12", r"b'12'"),
        ({"1": 0, "2": 0}, r"\{'1': 0, '2': 0\}"),  # a mapping: once its keys
        ([True, False], r"\[True, False\]"),
        ([1000.0, True], r"\[1000.0, True\]"),
        (["1000", 0.0], r"\['1000', 0.0\]"),
    ],
)
def test_a_rate_that_is_not_two_real_numbers_is_refused_naming_the_key_and_value(value, shown):
    with pytest.raises(ValueError, match=r"prior\['devA'\] must be \[rate .* got " + shown):
        load_prior({"devA": value})


@pytest.mark.parametrize("value", [[math.inf, 0.0], [1000.0, math.nan], [1000.0, -0.1]])
def test_a_given_rate_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match=r"prior\['devA'\] needs a rate > 0 .* finite"):
        load_prior({"devA": value})


@pytest.mark.parametrize("item", [True, False, None, 1.5])
def test_a_list_item_that_is_no_source_is_refused_naming_its_type_and_value(item):
    with pytest.raises(
        ValueError, match=f"prior must be rates .* got {type(item).__name__} {item}$"
    ):
        load_prior([{"cpu": [1.0, 0.0]}, item])


def test_a_device_identity_must_be_a_string():
    with pytest.raises(ValueError, match="prior: a device identity must be a non-empty string"):
        load_prior({True: [1000.0, 0.0]})


@pytest.mark.parametrize("name", ["", "   ", Path("   ")])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(name, tmp_path, monkeypatch):
    _log(tmp_path / "rex_decisions.jsonl", [(8, 5.0), (16, 9.0)])  # what "" once read
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="prior: an empty path names no file"):
        load_prior(name)


def _log(path: Path, windows: list[tuple[object, object]], device: str = "devA") -> Path:
    lines = [
        {"run_id": "r", "window": [10 * i, 10 * i + 10], "plan": [size], "median_ms": [median]}
        | {"devices": [device]}
        for i, (size, median) in enumerate(windows)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("windows", "match"),
    [
        # medians so small that 1 / slope overflows: an infinite rate
        ([(8, 1e-308), (16, 2e-308)], r"device 'devA' needs a rate > 0 .* got \[inf, 0.0\]"),
        ([(8, 1e-308), (8, 1e-308)], r"device 'devA' needs a rate > 0 .* got \[inf, 0.0\]"),
        ([(8, 1e-321), (16, 1e-321)], r"device 'devA': no rate fits its times"),
    ],
)
def test_a_fitted_rate_out_of_range_is_refused_naming_device_and_file(tmp_path, windows, match):
    log = _log(tmp_path / "rex_decisions.jsonl", windows)
    with pytest.raises(ValueError, match=rf"^prior: '{re.escape(str(log))}'.*{match}"):
        load_prior(log)


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        ((8, math.nan), "median_ms of device 'devA' is nan"),
        ((8, -5.0), "median_ms of device 'devA' is -5.0"),
        ((8, 0), "median_ms of device 'devA' is 0"),
        ((8, None), "median_ms of device 'devA' is None"),
        ((8, True), "median_ms of device 'devA' is True"),
        ((8, math.inf), "median_ms of device 'devA' is inf"),
        ((8, 1e308), "median_ms of device 'devA' is 1e\\+308"),  # once a rate of 1e-289/s
        ((-8, 5.0), "plan of device 'devA' is -8"),
        ((0, 5.0), "plan of device 'devA' is 0"),
        ((math.inf, 5.0), "plan of device 'devA' is inf"),
    ],
)
def test_a_bad_size_or_median_in_the_log_is_named_with_its_line(tmp_path, bad, shown):
    log = _log(tmp_path / "rex_decisions.jsonl", [(16, 9.0), bad, (32, 17.0)])
    with pytest.raises(
        ValueError, match=rf"^prior: '{re.escape(str(log))}' line 2 \(window \[10, 20\]\): {shown};"
    ):
        load_prior(log)


def test_only_the_last_runs_records_must_be_valid(tmp_path):
    log = tmp_path / "rex_decisions.jsonl"
    old = {"run_id": "old", "window": [0, 10], "plan": [8], "median_ms": [math.nan]}
    new = [
        {"run_id": "new", "window": [0, 10], "plan": [s], "median_ms": [m]}
        for s, m in [(8, 5.0), (16, 9.0)]
    ]
    log.write_text("".join(json.dumps(r | {"devices": ["devA"]}) + "\n" for r in [old, *new]))
    assert load_prior(log)["devA"] == pytest.approx([2000.0, 0.001])
    mismatched = {"run_id": "new", "window": [20, 30], "plan": [8, 8], "median_ms": [5.0]}
    with log.open("a") as handle:
        handle.write(json.dumps(mismatched | {"devices": ["devA"]}) + "\n")
    with pytest.raises(ValueError, match=r"line 4 .*must be lists of one length"):
        load_prior(log)


def _profile(path: Path, curve: list[list[object]], device: object = "devA") -> Path:
    path.write_text(json.dumps({"rank": {"curve": curve, "device": device}}))
    return path


def test_a_profile_whose_time_falls_with_the_size_is_refused(tmp_path):
    profile = _profile(tmp_path / "p.json", [[b, 0.1 - b / 1000] for b in (8, 16, 32)])
    with pytest.raises(
        ValueError, match=rf"prior: in '{re.escape(str(profile))}' the time of device 'devA' does"
    ):
        load_prior(profile)
    # the through-origin fit stays where it is legitimate: one size, or a negative overhead
    one = _profile(tmp_path / "one.json", [[32, 0.02], [32, 0.02]])
    assert load_prior(one)["devA"] == pytest.approx([1600.0, 0.0])
    below = _profile(tmp_path / "below.json", [[b, b / 1000 - 0.001] for b in (8, 16, 32)])
    assert load_prior(below)["devA"][1] == 0.0 and load_prior(below)["devA"][0] > 0


@pytest.mark.parametrize(
    "point",
    [
        [math.nan, 0.1],
        [8, math.nan],
        [-8, 0.1],
        [0, 0.1],
        [8, -0.1],
        [8, 0],
        [8, 1e308],
        [True, 0.1],
        [8],
    ],
)
def test_a_bad_point_in_a_profile_is_named(tmp_path, point):
    profile = _profile(tmp_path / "p.json", [[16, 0.02], point, [32, 0.03]])
    with pytest.raises(
        ValueError, match=rf"prior: '{re.escape(str(profile))}' rank.curve\[1\] of device 'devA'"
    ):
        load_prior(profile)


def test_a_profile_must_name_its_device_with_a_string(tmp_path):
    with pytest.raises(ValueError, match="not a profile"):
        load_prior(_profile(tmp_path / "p.json", [[16, 0.02]], device=True))


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    profile = tmp_path / "big.json"
    with profile.open("wb") as handle:
        handle.truncate(MAX_PROFILE_BYTES + 1)  # sparse: nothing written
    size = f"{MAX_PROFILE_BYTES + 1:,}"
    with pytest.raises(
        ValueError, match=rf"prior: '{re.escape(str(profile))}' is {size} bytes; a profile is"
    ):
        load_prior(profile)
    log = _log(tmp_path / "rex_decisions.jsonl", [(8, 5.0), (16, 9.0)])
    monkeypatch.setattr(records, "MAX_LOG_BYTES", 100)
    with pytest.raises(
        ValueError, match=rf"prior: '{re.escape(str(log))}' is .* bytes; a decision log is read"
    ):
        load_prior(log)


def test_a_log_is_streamed_not_read_whole(tmp_path, monkeypatch):
    log = _log(tmp_path / "rex_decisions.jsonl", [(8, 5.0), (16, 9.0)])
    monkeypatch.setattr(DecisionLog, "read", None)  # the prior never loads every record
    assert load_prior(log)["devA"] == pytest.approx([2000.0, 0.001])


def test_missing_devices_names_each_once_in_rank_order():
    prior = {"fast": [1.0, 0.0]}
    assert missing_devices(prior, ["b", "fast", "a", "b"]) == ["b", "a"]
    assert missing_devices(prior, ["fast"]) == []
