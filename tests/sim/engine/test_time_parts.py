"""Where a run's time to the target goes: the parts sum to it, and each part is what it says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers.cli import run_command
from tests.helpers.workload import workload_scenario

from lightning_rex.sim.engine.goodput import limit_curve, run_goodput
from lightning_rex.sim.engine.time_parts import PARTS, LimitCurve, time_parts
from lightning_rex.sim.scenarios.schema import scenario_from_dict
from lightning_rex.sim.scenarios.workload import Workload

# phi = 64 throughout: at these step times the best goodput is at 64 (checked below)
_WORKLOAD = Workload(32, 32 * 50.0, ((0.0, 1.0 / 64, 1.0),), (32, 128))
_CURVE = LimitCurve(np.array([32, 64, 128]), np.array([0.010, 0.012, 0.030]))


def _noise_free(b: int) -> float:
    return float(_CURVE.step_s[np.flatnonzero(_CURVE.batches == b)[0]])


def _parts(sizes: list[int], scale: float = 1.0) -> tuple[dict[str, float], np.ndarray]:
    times = np.array([_noise_free(b) for b in sizes]) * scale
    return time_parts(_WORKLOAD, _CURVE, _noise_free, times, sizes), times


def test_the_best_batch_at_the_noise_free_times_is_all_limit() -> None:
    rates = [b * (64 + 32) / (64 + b) / t for b, t in zip((32, 64, 128), _CURVE.step_s)]
    assert int(np.argmax(rates)) == 1
    parts, times = _parts([64] * 40)
    assert parts["limit_s"] == pytest.approx(times.sum())
    assert all(abs(parts[k]) < 1e-12 for k in PARTS if k != "limit_s")


def test_noise_and_one_off_steps_are_their_own_parts() -> None:
    parts, times = _parts([64] * 40, scale=1.1)  # every step 10% slower than noise-free
    assert parts["steps_s"] == pytest.approx(times.sum() / 1.1 * 0.1)
    sizes = [64] * 40
    times = np.array([_noise_free(b) for b in sizes])
    times[0] += 0.5  # a new shape's cost
    parts = time_parts(_WORKLOAD, _CURVE, _noise_free, times, sizes)
    assert parts["shape_s"] == pytest.approx(0.5)
    assert abs(parts["steps_s"]) < 1e-12


def test_the_batch_choice_splits_into_start_trials_and_kept() -> None:
    sizes = [32] * 10 + [64] * 10 + [128] * 5 + [64] * 10 + [128] * 5
    parts, times = _parts(sizes)
    assert sum(parts.values()) == pytest.approx(times.sum())
    # the start at 32, the trial at 128 that went back to 64, and the last 128 kept
    assert parts["start_s"] > 0 and parts["trials_s"] > 0 and parts["kept_s"] > 0
    again, _ = _parts([32] * 10 + [64] * 10 + [128] * 5 + [64] * 10)
    assert again["trials_s"] == pytest.approx(parts["trials_s"])
    assert again["kept_s"] == pytest.approx(0.0, abs=1e-12)  # 64 is the best
    no_change, _ = _parts([128] * 20)
    assert no_change["start_s"] == 0.0 and no_change["kept_s"] > 0


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="one length"):
        time_parts(_WORKLOAD, _CURVE, _noise_free, [0.01, 0.01], [64])
    with pytest.raises(ValueError, match="non-empty"):
        time_parts(_WORKLOAD, _CURVE, _noise_free, [], [])


def test_a_simulated_run_s_parts_sum_to_its_time() -> None:
    s = scenario_from_dict(workload_scenario())
    limit = limit_curve(s)
    parts = {}
    for policy in ("rex", "adaptive-oracle", "fixed"):
        r = run_goodput(s, policy, 0, limit=limit)
        assert r.time_parts is not None and r.time_to_target_s is not None
        assert set(r.time_parts) == set(PARTS)
        assert sum(r.time_parts.values()) == pytest.approx(r.time_to_target_s)
        # the noise-free limit is the same progress at the best goodput: below the run
        assert 0 < r.time_parts["limit_s"] < r.time_to_target_s
        parts[policy] = r.time_parts

    def choice(p: dict[str, float]) -> float:
        return p["start_s"] + p["trials_s"] + p["kept_s"]

    # one target, one limit (up to the last step's overshoot); the oracle's batch choice
    # costs nothing over it, the fixed B0 (far below the best batch) most of its time
    limits = [p["limit_s"] for p in parts.values()]
    assert max(limits) < 1.05 * min(limits)
    assert abs(choice(parts["adaptive-oracle"])) < 0.01 * parts["adaptive-oracle"]["limit_s"]
    assert choice(parts["fixed"]) > choice(parts["rex"]) > 0
    assert parts["fixed"]["start_s"] == 0.0  # no change: all of it is kept
    short = run_goodput(scenario_from_dict(workload_scenario(target_progress=1e9)), "fixed", 0)
    assert not short.reached and short.time_parts is None


def test_the_cli_gives_each_policy_s_mean_parts(tmp_path, capsys) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload_scenario()))
    args = ["simulate", "--scenario", str(path), "--compare", "fixed,adaptive-oracle"]
    rc, out, _ = run_command([*args, "--seeds", "0-1", "--json"], capsys)
    assert rc == 0
    for agg in json.loads(out)["policies"].values():
        parts = agg["time_parts_mean"]
        assert list(parts) == list(PARTS)
        assert sum(parts.values()) == pytest.approx(agg["time_to_target_mean"])
