"""Strategy names: registration, the startup hook, Lightning's name checks, and hints."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.accelerators import MPSAccelerator
from lightning.pytorch.strategies import StrategyRegistry
from tests.helpers.env import user_env

import lightning as L
from lightning_rex import GlobalBatchScaling, RexCallback, RexFSDPStrategy, RexStrategy
from lightning_rex.lightning.registration import name_hint


def _error(strategy: str, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as err:
        L.Trainer(strategy=strategy, logger=False, **kwargs)
    return str(err.value)


def test_registration_is_idempotent_and_names_start_methods() -> None:
    RexStrategy.register_strategies(StrategyRegistry)
    RexStrategy.register_strategies(StrategyRegistry)
    for name, method in (("rex", "popen"), ("rex_spawn", "spawn"), ("rex_fork", "fork")):
        t = L.Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
        assert isinstance(t.strategy, RexStrategy)
        assert t.strategy._start_method == method
        assert t._accelerator_connector._strategy_flag == name


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: RexStrategy(micro_batch_size=[48, 16]),
            TypeError,
            r"RexStrategy\(\) got an unexpected keyword argument 'micro_batch_size'; did you "
            r"mean 'micro_batch_sizes'\?",
        ),
        (
            lambda: RexStrategy(sharding_strategy="FULL_SHARD"),
            TypeError,
            r"unexpected keyword argument 'sharding_strategy'; it takes its own arguments, "
            r"DDPStrategy's and DistributedDataParallel's .*strategy='rex_fsdp'",
        ),
        (
            lambda: RexFSDPStrategy(tensor_parallel_size=2),
            TypeError,
            r"RexFSDPStrategy\(\) got an unexpected keyword argument 'tensor_parallel_size'",
        ),
        (
            lambda: RexFSDPStrategy(max_pass_sizes=[0, 4]),
            ValueError,
            r"max_pass_sizes must be None, an integer >= 1, or one entry per rank",
        ),
        (
            lambda: RexCallback(windw=30),
            TypeError,
            r"RexCallback\(\) got an unexpected keyword argument 'windw'; did you mean 'window'\?",
        ),
        (
            lambda: GlobalBatchScaling(64, 512, lr_rules="sqrt"),
            TypeError,
            r"GlobalBatchScaling\(\) got an unexpected keyword argument 'lr_rules'; did you "
            r"mean 'lr_rule'\?",
        ),
        (
            lambda: L.Trainer(strategy="rexx", accelerator="cpu", devices=2),
            ValueError,
            r"invalid strategy name: `strategy='rexx'`.* Did you mean strategy='rex'\?",
        ),
        (
            lambda: L.Trainer(strategy="rex-fork", accelerator="cpu", devices=2),
            ValueError,
            r"invalid strategy name.* Did you mean strategy='rex_fork'\?",
        ),
        (
            lambda: L.Trainer(strategy="REX_SPAWNN", accelerator="cpu", devices=2),
            ValueError,
            r"Did you mean strategy='rex_spawn'\?",
        ),
    ],
    ids=[
        "strategy-kwarg",
        "fsdp-kwarg",
        "rex-fsdp-kwarg",
        "pass-caps",
        "callback-kwarg",
        "scaling-kwarg",
        "rexx",
        "dash",
        "case",
    ],
)
def test_typos_fail_at_construction_naming_the_closest_name(
    make: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make()


def test_names_far_from_rex_get_lightnings_error_alone() -> None:
    assert name_hint("deepspeedd") is None
    assert "Did you mean" not in _error("foo", accelerator="cpu")
    assert name_hint(RexStrategy()) is None


def test_rex_works_without_the_import_through_the_startup_hook() -> None:
    """A fresh interpreter that never imports lightning_rex (the installed .pth registers it)."""
    assert any((Path(p) / "lightning_rex.pth").exists() for p in site.getsitepackages()), (
        "lightning_rex.pth is not installed: reinstall the package (pip install -e .)"
    )
    code = (
        "import sys, lightning as L\n"
        "assert 'lightning_rex.lightning.strategy' not in sys.modules\n"
        "t = L.Trainer(strategy='rex', accelerator='cpu', devices=2, logger=False)\n"
        "print(type(t.strategy).__name__)\n"
    )
    env = {k: v for k, v in user_env().items() if k != "LIGHTNING_REX_NO_HOOK"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "RexStrategy", out.stderr[-2000:]
    off = {**env, "LIGHTNING_REX_NO_HOOK": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=off, timeout=300
    )
    assert out.returncode != 0 and "invalid strategy name: `strategy='rex'`" in out.stderr


def test_one_device_warns_once_that_there_is_nothing_to_balance(tmp_path: Path) -> None:
    from tests.helpers.models import RegModel, make_dataset
    from tests.helpers.trainer import quiet_trainer
    from torch.utils.data import DataLoader

    t = quiet_trainer(devices=1, strategy="rex", max_steps=2, default_root_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="on one device has nothing to balance") as caught:
        t.fit(RegModel(), DataLoader(make_dataset(64), batch_size=16))
    assert len([w for w in caught if "nothing to balance" in str(w.message)]) == 1


# ---------------------------------------------------------------- Lightning's checks by name
@pytest.mark.parametrize(("rex", "ddp"), [("rex", "ddp"), ("rex_spawn", "ddp_spawn")])
def test_on_mps_rex_gets_the_error_ddp_gets(
    rex: str, ddp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: True))
    for accelerator in ("auto", "mps", "gpu"):
        want = _error(ddp, accelerator=accelerator, devices=2)
        assert "not supported on the MPS accelerator" in want
        assert _error(rex, accelerator=accelerator, devices=2) == want.replace(ddp, rex, 1)


def test_where_processes_cannot_fork_rex_fork_gets_the_error_ddp_fork_gets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    want = _error("ddp_fork", accelerator="cpu", devices=2)
    assert "process forking is not supported" in want
    assert _error("rex_fork", accelerator="cpu", devices=2) == want.replace("ddp_fork", "rex_fork")
    # and where it can, both build
    monkeypatch.undo()
    assert isinstance(
        L.Trainer(strategy="rex_fork", accelerator="cpu", devices=2).strategy, RexStrategy
    )


def test_rex_fsdp_and_the_fabric_names_are_registered() -> None:
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_rex.lightning.fabric import RexFabricDDP, RexFabricFSDP

    assert isinstance(StrategyRegistry.get("rex_fsdp"), RexFSDPStrategy)
    assert isinstance(STRATEGY_REGISTRY.get("rex"), RexFabricDDP)
    assert isinstance(STRATEGY_REGISTRY.get("rex_fsdp"), RexFabricFSDP)
    fabric = L.Fabric(accelerator="cpu", devices=1, strategy="rex")
    assert isinstance(fabric.strategy, RexFabricDDP)
