"""Goodput in the simulator: workloads, the gradient model, the batch policies and the CLI."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from tests.helpers.cli import run_command
from tests.helpers.workload import workload_scenario

from lightning_rex.core import build
from lightning_rex.core.scaling.noise_scale import noise_estimates
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.window_spec import WindowSpec
from lightning_rex.sim.cli import simulate as cli
from lightning_rex.sim.engine import goodput
from lightning_rex.sim.engine.goodput import hindsight_batch, run_goodput
from lightning_rex.sim.policies.builtin import oracle_plan
from lightning_rex.sim.scenarios.scenario import ScenarioError
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict, to_dict
from lightning_rex.sim.scenarios.workload import GradientNorms, Workload


def test_workload_schema_round_trip_and_errors() -> None:
    s = scenario_from_dict(workload_scenario(trace=[[0, 1.0, 64.0], [1000, 0.5, 64.0]]))
    w = s.workload
    assert w is not None and w.batch_range == (32, 512)  # 16 x b0, within the caps (768)
    assert scenario_from_dict(to_dict(s)).workload == w
    assert w.stats(-5.0) == (1.0, 64.0) and w.stats(5000.0) == (0.5, 64.0)  # flat past ends
    assert w.stats(500.0) == pytest.approx((0.75, 64.0))
    assert w.efficiency(32, 0.0) == 1.0 and w.efficiency(96, 0.0) == pytest.approx(96 / 160)
    for bad, match in (
        ({"trace": [[10, 1.0, 1.0], [5, 1.0, 1.0]]}, r"trace\[1\]\.progress"),
        ({"trace": [[0, 0.0, 1.0]]}, r"grad_sqr must be > 0"),
        ({"batch_range": [32, 4096]}, "more than the memory caps hold"),
        ({"batch_range": [64, 128]}, r"batch_range\.min must be <= 32"),
        ({"b0": 0}, r"workload\.b0 must be >= 1"),
        ({"speed": 1}, "unknown key workload.speed"),
    ):
        with pytest.raises(ScenarioError, match=match):
            scenario_from_dict(workload_scenario(**bad))


def test_gradient_norms_give_the_estimator_unbiased_noisy_pairs() -> None:
    w = Workload(32, 1e9, ((0.0, 0.01, 4.0),), (32, 512))
    norms, plan = GradientNorms(w, 0), (16, 8, 4, 4)
    est = np.array([noise_estimates(*norms.draw(plan, 0.0), plan) for _ in range(4000)])
    assert est.mean(axis=0) == pytest.approx([0.01, 4.0], rel=0.1)
    # the |G|^2 estimate's noise shrinks with the batch (tr(Sigma) / B)
    big = tuple(8 * b for b in plan)
    wide = np.array([noise_estimates(*norms.draw(big, 0.0), big) for _ in range(4000)])
    assert wide[:, 0].std() < 0.3 * est[:, 0].std()


def test_hindsight_is_the_best_fixed_batch_of_the_scan() -> None:
    s = scenario_from_dict(workload_scenario())
    best, seconds = hindsight_batch(s)
    w = s.workload
    assert w is not None

    def cost(b: int) -> float:
        t = float(s.compute_times(np.asarray(oracle_plan(s, b)), 0).max()) + s.comm
        steps = w.steps_to_target(b, s.steps)
        return np.inf if steps is None else steps * t

    assert seconds == pytest.approx(cost(best))
    assert all(cost(b) >= seconds for b in (32, 64, 128, 256, 512))
    assert 32 < best < 512  # phi = 1024: neither end


def test_rex_scales_the_batch_in_the_simulator_through_the_one_builder(monkeypatch) -> None:
    built: list[Any] = []
    real = build.build_decider

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(build, "build_decider", spy)
    s = scenario_from_dict(workload_scenario())
    rex = run_goodput(s, "rex", 0)
    assert len(built) == 1 and isinstance(built[0], ScalingDecider)
    assert built[0].progress == 1.0  # told how far to the target, as training tells max_steps
    assert rex.reached and rex.batch_changes >= 1 and rex.mean_batch > 32
    fixed = run_goodput(s, "fixed", 0)
    assert fixed.reached and fixed.batch_changes == 0 and fixed.mean_batch == 32
    assert rex.time_to_target_s is not None and fixed.time_to_target_s is not None
    assert rex.time_to_target_s < fixed.time_to_target_s
    again = run_goodput(s, "rex", 0)  # deterministic for a seed (but for the wall clock)
    assert (again.time_to_target_s, again.batches) == (rex.time_to_target_s, rex.batches)


def test_cli_compares_batch_policies_by_time_to_target(tmp_path, capsys) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload_scenario()))
    rc, out, _ = run_command(
        [
            "simulate",
            "--scenario",
            str(path),
            "--compare",
            "fixed,hindsight,pollux",
            "--seeds",
            "0-1",
            "--json",
        ],
        capsys,
    )
    assert rc == 0
    d = json.loads(out)
    assert d["seeds"] == [0, 1] and set(d["policies"]) == {"fixed", "hindsight", "pollux"}
    assert all(p["time_to_target_mean"] > 0 for p in d["policies"].values())
    assert d["hindsight_batch"] == hindsight_batch(scenario_from_dict(workload_scenario()))[0]
    rc, _, err = run_command(["simulate", "--scenario", str(path), "--compare", "even"], capsys)
    assert rc == 2 and "not a global batch policy" in err
    rc, _, err = run_command(["simulate", "--scenario", "pair-3x", "--policy", "pollux"], capsys)
    assert rc == 2 and "needs a workload scenario" in err


def test_workload_presets_load() -> None:
    for name in ("gns-flat-8", "gns-slow-64", "gns-slow-4096"):
        s = load_scenario(name)
        assert s.workload is not None and s.shape_change_s == 0.5
    slow = load_scenario("gns-slow-8").workload
    assert slow is not None  # phi grows from 2 b0 to 16 b0, close to linearly
    assert slow.noise_scale(0.5 * slow.target_progress) == pytest.approx(9 * 256, rel=0.02)
    assert goodput.BATCH_POLICIES == (
        "fixed",
        "hindsight",
        "pollux",
        "pollux-split",
        "pollux-rex",
        "adaptive-oracle",
        "rex",
    )
    # the CLI lists them without importing the goodput module
    assert (*cli.BATCH_POLICIES, "rex") == goodput.BATCH_POLICIES


@pytest.mark.parametrize("name", ["gns-image-8", "gns-lm-8", "gns-image-64", "gns-lm-64"])
def test_long_workload_presets_last_hours_at_b0(name: str) -> None:
    s = load_scenario(name)
    w, short = s.workload, load_scenario(name.replace("image", "slow").replace("lm", "fast"))
    assert w is not None and short.workload is not None
    plan = oracle_plan(s, s.global_batch)  # the fixed B0, at its best split
    step = float(s.compute_times(np.asarray(plan), 0).max()) + s.comm
    hours = w.target_progress / s.global_batch * step / 3600
    assert 1.5 < hours < 4  # hours to the target
    # the same shape of noise scale as its short preset, over a longer run
    for u in (0.0, 0.3, 1.0):
        assert w.noise_scale(u * w.target_progress) == pytest.approx(
            short.workload.noise_scale(u * short.workload.target_progress)
        )
    assert w.target_progress >= 2 * short.workload.target_progress


def test_the_loop_gives_windows_the_wall_clock_with_the_all_reduce() -> None:
    from lightning_rex.driver.config import LoopConfig
    from lightning_rex.sim.engine.engine import run_loop

    seen = []

    class Record:
        def observe(self, window):
            seen.append(window)
            from lightning_rex.core.decision import Decision

            return Decision("hold", None, None, 0.0, None, "", window.step_end)

        def decline(self): ...
        def set_bounds(self, *a): ...
        def state_dict(self):
            return {}

        def load_state_dict(self, d): ...
        def rank_model_summary(self):
            return {}

        def even_split_estimate(self):
            return None

    loop = LoopConfig(WindowSpec(10, 1, warmup=2), background=False)
    run_loop(8, 2, 40, lambda step, plan: np.array([0.02, 0.03]), Record(), loop, comm=0.01)
    assert seen and all(w.overhead_s == pytest.approx(0.01) for w in seen)
