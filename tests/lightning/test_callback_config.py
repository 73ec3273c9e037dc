"""RexCallback configuration: errors, LightningCLI flags and YAML, --help, telemetry off-GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from tests.helpers.models import CliModel, make_dataset
from tests.helpers.trainer import quiet_trainer

import lightning as L
from lightning_rex import RexCallback, RexStrategy
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.window_spec import WindowSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, r"alpha must be in \(0, 1\), got 0.0"),
        ({"alpha": 1.0}, r"alpha must be in \(0, 1\), got 1.0"),
        ({"window": 4}, "window must be an integer >= 5 steps, got 4"),
        ({"persistence": 0}, "persistence must be an integer >= 1 window, got 0"),
        ({"min_effect": -0.1}, "min_effect must be >= 0"),
        ({"max_growth": 1.0}, "max_growth must be > 1"),
        ({"window": 10, "decision_lag": 10}, r"decision_lag must be in \[1, segment=10\)"),
        ({"window": 30, "looks": 7}, r"looks=7 cuts window=30 into segments of 4"),
        ({"window": 30, "looks": 0}, r"looks must be an integer >= 1"),
        ({"warmup": -1}, "warmup must be an integer >= 0 steps, got -1"),
        ({"window": float("nan")}, "window must be an integer"),
        ({"warmup": float("nan")}, "warmup must be an integer"),
        ({"seed": "x"}, "seed"),
        ({"background": "no"}, "background must be True or False"),
        ({"pool_by_device": "yes"}, "pool_by_device must be True or False"),
        ({"prior": "/nonexistent/run"}, "prior: no such file"),
        ({"prior": {"cpu": [-5, 0]}}, r"prior\['cpu'\] needs a rate > 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RexCallback(**kwargs)


def test_the_loop_and_the_settings_share_one_window() -> None:
    cb = RexCallback(window=40, looks=2, warmup=3, max_warmup=50)
    assert cb.loop.window is cb.settings.window
    assert cb.loop.window == WindowSpec(40, 2, 3, 50)
    options = cb.options()
    assert options.loop.window is options.settings.window
    with pytest.raises(ValueError, match="share one WindowSpec"):
        replace(options, loop=replace(options.loop, window=WindowSpec(40, 2, 3, 50)))


def test_defaults() -> None:
    cb = RexCallback()
    settings = cb.settings
    assert (settings.alpha, cb.window, settings.persistence, settings.min_effect) == (
        0.01,
        30,
        2,
        0.05,
    )


def test_rex_attaches_a_default_callback_and_adaptive_false_does_not() -> None:
    def fit(strategy: RexStrategy, callbacks: list[L.Callback]) -> L.Trainer:
        t = quiet_trainer(
            accelerator="cpu",
            devices=1,
            strategy=strategy,
            max_steps=2,
            callbacks=callbacks,
        )
        t.fit(CliModel(), torch.utils.data.DataLoader(make_dataset(64), batch_size=16))
        return t

    t = fit(RexStrategy(), [])
    assert sum(isinstance(c, RexCallback) for c in t.callbacks) == 1
    mine = RexCallback(window=12)
    t = fit(RexStrategy(), [mine])
    assert [c for c in t.callbacks if isinstance(c, RexCallback)] == [mine]
    t = fit(RexStrategy(adaptive=False), [])
    assert not any(isinstance(c, RexCallback) for c in t.callbacks)
    t = fit(RexStrategy(adaptive=False), [RexCallback()])
    assert not next(c for c in t.callbacks if isinstance(c, RexCallback)).adaptive


def test_cli_flags_and_append() -> None:
    # the command line: a bare strategy class path, the callback appended with a flag
    cli = LightningCLI(
        CliModel,
        run=False,
        save_config_callback=None,
        args=[
            "--trainer.strategy=lightning_rex.RexStrategy",
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
            "--trainer.callbacks+=lightning_rex.RexCallback",
            "--trainer.callbacks.alpha=0.02",
            "--trainer.callbacks.window=40",
        ],
    )
    cb = next(c for c in cli.trainer.callbacks if isinstance(c, RexCallback))
    assert (cb.settings.alpha, cb.window) == (0.02, 40)
    assert isinstance(cli.trainer.strategy, RexStrategy)


def test_cli_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 2\n  strategy:\n"
        "    class_path: lightning_rex.RexStrategy\n    init_args:\n      adaptive: true\n"
        "  callbacks:\n    - class_path: lightning_rex.RexCallback\n      init_args:\n"
        "        alpha: 0.05\n        persistence: 3\n        max_growth: 1.5\n"
    )
    cli = LightningCLI(CliModel, run=False, save_config_callback=None, args=[f"--config={cfg}"])
    cb = next(c for c in cli.trainer.callbacks if isinstance(c, RexCallback))
    assert (cb.settings.alpha, cb.settings.persistence, cb.options().max_growth) == (0.05, 3, 1.5)


def test_cli_yaml_prior_from_a_profile(tmp_path: Path) -> None:
    profile = tmp_path / "cpu.json"
    curve = [[b, 0.001 + b / 4000] for b in (1, 4, 16)]
    profile.write_text(json.dumps({"rank": {"curve": curve, "device": "cpu"}}))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "trainer:\n  accelerator: cpu\n  callbacks:\n    - class_path: lightning_rex.RexCallback\n"
        f"      init_args:\n        prior: {profile}\n"
    )
    cli = LightningCLI(CliModel, run=False, save_config_callback=None, args=[f"--config={cfg}"])
    cb = next(c for c in cli.trainer.callbacks if isinstance(c, RexCallback))
    assert cb.options().prior == {"cpu": pytest.approx([4000.0, 0.001])}


def test_cli_bad_value_is_a_clear_error() -> None:
    # jsonargparse wraps our error in its own; the argument and the rule must reach the user
    with pytest.raises(ValueError, match="window must be an integer >= 5 steps, got 3"):
        LightningCLI(
            CliModel,
            run=False,
            save_config_callback=None,
            args=[
                "--trainer.callbacks+=lightning_rex.RexCallback",
                "--trainer.callbacks.window=3",
            ],
        )


def test_callback_help_documents_every_argument() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "cli" / "train.py"),
            "fit",
            "--trainer.callbacks.help",
            "lightning_rex.RexCallback",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for arg in (
        "alpha",
        "window",
        "persistence",
        "min_effect",
        "max_growth",
        "decision_lag",
        "background",
        "warmup",
        "seed",
        "log_dir",
    ):
        assert f"--trainer.callbacks.{arg}" in out
    assert "Family-wise significance level" in out  # the docstring text reaches --help


def test_pool_by_device_passes_the_gathered_device_keys_to_the_controller():
    from lightning_rex.core.build import build_decider

    cb = RexCallback()
    keys = ["NVIDIA A100", "NVIDIA A100", "Tesla T4", "cpu"]
    c = build_decider(cb.settings, (16, 16, 16, 16), 64, SizeBounds(1, None), keys)
    assert list(c.model.group) == [0, 0, 2, 3]
    # keys that do not cover the plan: no pooling
    c = build_decider(cb.settings, (16, 16, 16, 16), 64, SizeBounds(1, None), keys[:3])
    assert list(c.model.group) == [0, 1, 2, 3]
    off = RexCallback(pool_by_device=False)
    c = build_decider(off.settings, (16, 16, 16, 16), 64, SizeBounds(1, None), keys)
    assert list(c.model.group) == [0, 1, 2, 3]


def test_cli_yaml_global_batch_scaling(tmp_path: Path) -> None:
    from lightning_rex import GlobalBatchScaling

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 2\n  strategy: rex\n"
        "  callbacks:\n    - class_path: lightning_rex.RexCallback\n      init_args:\n"
        "        global_batch:\n          min_global_batch: 64\n          max_global_batch: 2048\n"
        "          lr_rule: adascale\n"
    )
    cli = LightningCLI(CliModel, run=False, save_config_callback=None, args=[f"--config={cfg}"])
    cb = next(c for c in cli.trainer.callbacks if isinstance(c, RexCallback))
    assert cb.global_batch == GlobalBatchScaling(64, 2048, lr_rule="adascale")


def test_global_batch_scaling_checks_its_range_at_setup() -> None:
    from tests.helpers.models import RegModel

    from lightning_rex import GlobalBatchScaling

    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=RexStrategy(max_micro_batch_size=8), logger=False
    )
    cb = RexCallback(global_batch=GlobalBatchScaling(16, 64))
    with pytest.raises(ValueError, match=r"GlobalBatchScaling\.max_global_batch=64"):
        cb.setup(trainer, RegModel(), "fit")
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    with pytest.raises(ValueError, match="needs strategy='rex'"):
        cb.setup(ddp, RegModel(), "fit")
    one = L.Trainer(accelerator="cpu", devices=1, strategy=RexStrategy(), logger=False)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        cb.setup(one, RegModel(), "fit")
    with pytest.raises(ValueError, match="GlobalBatchScaling or None"):
        RexCallback(global_batch=(16, 64))  # type: ignore[arg-type]
