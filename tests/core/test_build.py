"""One builder for deciders: the simulator's rex policy and RexCallback both call it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import GlobalBatchScaling, RexStrategy
from lightning_rex.core import build
from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.sim import RexPolicy, scenario_from_dict, simulate
from lightning_rex.sim.engine.engine import default_loop


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Every decider the builder returns, with the settings it was built from."""
    calls: list[tuple[Any, Any]] = []
    real = build.build_decider

    def spied(settings: DecisionSettings, *args: Any, **kwargs: Any) -> Any:
        decider = real(settings, *args, **kwargs)
        calls.append((settings, decider))
        return decider

    monkeypatch.setattr(build, "build_decider", spied)
    return calls


def test_the_simulators_rex_policy_builds_its_decider_with_the_builder(spy: list) -> None:
    scenario = scenario_from_dict(
        {"global_batch": 64, "steps": 90, "ranks": [{"rate": 2e3}, {"rate": 1e3}]}
    )
    policy = RexPolicy(persistence=3)
    simulate(scenario, policy, seed=4)
    assert len(spy) == 1
    settings, decider = spy[0]
    assert decider is policy.controller  # the decider the run drove
    assert (settings.persistence, settings.seed, settings.window.steps) == (3, 4, scenario.window)


def test_rex_callback_builds_its_decider_with_the_builder(spy: list, tmp_path: Path) -> None:
    cb = with_step_times(lambda r, s, b: 0.001 * b, window=10, warmup=0, background=False)
    t = quiet_trainer(
        devices=1, strategy=RexStrategy(), max_steps=12, callbacks=[cb], default_root_dir=tmp_path
    )
    t.fit(RegModel(), DataLoader(make_dataset(64 * 12), batch_size=16))
    assert len(spy) == 1
    settings, decider = spy[0]
    assert settings is cb.settings
    assert cb.driver is not None and decider is cb.driver.decider
    # one window object: the driver gathers by the very window the controller joins
    assert isinstance(decider, Controller)
    assert decider.settings.window is cb.driver.config.window is cb.settings.window


def test_the_simulator_hands_rex_the_loops_own_window() -> None:
    scenario = scenario_from_dict(
        {"global_batch": 64, "steps": 60, "ranks": [{"rate": 2e3}, {"rate": 1e3}]}
    )
    policy = RexPolicy()
    loop = default_loop(scenario, policy, warmup=3)
    simulate(scenario, policy, seed=0, loop=loop)
    assert isinstance(policy.controller, Controller)
    assert policy.controller.settings.window is loop.window


def test_the_builder_wraps_the_controller_when_global_batch_scaling_is_on() -> None:
    plain = build.build_decider(DecisionSettings(), (16, 16), 32, SizeBounds())
    assert isinstance(plain, Controller)
    assert plain.settings.window.looks_per_window == 3  # training's default looks
    cfg = GlobalBatchScaling(16, 128)
    scaled = build.build_decider(DecisionSettings(global_batch=cfg), (24, 24), 32, SizeBounds())
    # resumed at a batch the scaler had moved to: the controller is there, the base stays
    assert isinstance(scaled, ScalingDecider)
    assert scaled.controller.global_batch == 48 and scaled.scaler.base_batch == 32


def test_a_saved_decider_of_the_other_kind_starts_afresh() -> None:
    state = Controller(32, 2).state_dict()
    on = DecisionSettings(global_batch=GlobalBatchScaling(16, 128))
    with pytest.warns(UserWarning, match="scaling is on in this run and was off"):
        assert build.check_decider_state(on, state, 32, 2) is None
    assert build.check_decider_state(DecisionSettings(), state, 32, 2) is state
