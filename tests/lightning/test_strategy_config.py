"""Configuration of RexStrategy: clear errors, registration and LightningCLI, in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from tests.helpers.models import CliModel, RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler

import lightning as L
import lightning_rex
from lightning_rex import RexStrategy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cli"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"micro_batch_sizes": [48, 16], "batch_fractions": [0.5, 0.5]},
            "either micro_batch_sizes or batch_fractions",
        ),
        ({"batch_fractions": [0.5, 0.6]}, r"batch_fractions must sum to 1 \(within 1e-6\)"),
        ({"batch_fractions": [1.2, -0.2]}, "batch_fractions must be finite and >= 0"),
        (
            {"micro_batch_sizes": [63, 1], "min_micro_batch_size": 2},
            "micro_batch_sizes must be >= min_micro_batch_size=2 on every rank; ranks",
        ),
        (
            {"micro_batch_sizes": [48, 16], "max_micro_batch_size": 40},
            r"micro_batch_sizes exceeds max_micro_batch_size on ranks \[0\]: sizes \[48\]",
        ),
        (
            {"min_micro_batch_size": 4, "max_micro_batch_size": 3},
            "max_micro_batch_size must be None or an int >= min_micro_batch_size=4, got 3",
        ),
        ({"min_micro_batch_size": 0}, "min_micro_batch_size must be an int >= 1"),
        ({"loss_reduction": "avg"}, r"loss_reduction must be one of \('mean', 'sum'\)"),
        ({"model_averaging_period": 4}, "model_averaging_period is not supported"),
        ({"micro_batch_sizes": [True, 63]}, "micro_batch_sizes must be a non-empty list"),
        ({"micro_batch_sizes": ["a", "b"]}, "micro_batch_sizes must be a non-empty list"),
        ({"min_micro_batch_size": "a"}, "min_micro_batch_size must be an int"),
        ({"min_micro_batch_size": float("nan")}, "min_micro_batch_size must be an int"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RexStrategy(**kwargs)


@pytest.mark.parametrize("arg", ["micro_batch_sizes", "batch_fractions"])
def test_wrong_length_fails_when_the_trainer_is_built(arg: str) -> None:
    value = [20, 20, 24] if arg == "micro_batch_sizes" else [0.2, 0.3, 0.5]
    with pytest.raises(
        ValueError, match=f"{arg} must have one entry per rank: the world size is 2"
    ):
        L.Trainer(accelerator="cpu", devices=2, strategy=RexStrategy(**{arg: value}))


def test_fractions_are_rounded_by_largest_remainder() -> None:
    t = L.Trainer(
        accelerator="cpu", devices=2, strategy=RexStrategy(batch_fractions=[0.7, 0.3]), logger=False
    )
    t.strategy.set_world_ranks()
    assert t.strategy.initial_plan(64) == (45, 19)
    assert lightning_rex.round_fractions([0.5, 0.5], 5) == (3, 2)  # tie to the lowest rank


# ---------------------------------------------------------------- errors raised during fit (1 rank)
def _fit_one_rank(
    loader: Any,
    strategy: RexStrategy | None = None,
    model: L.LightningModule | None = None,
    **trainer_kwargs: Any,
) -> None:
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy or RexStrategy(),
        max_steps=2,
        **trainer_kwargs,
    )
    t.fit(model or RegModel(), loader)


def test_sum_not_global_batch() -> None:
    with pytest.raises(ValueError, match=r"micro_batch_sizes must sum to the global batch B=32"):
        _fit_one_rank(
            DataLoader(make_dataset(64), batch_size=32), RexStrategy(micro_batch_sizes=[30])
        )


def test_no_batch_size() -> None:
    with pytest.raises(ValueError, match="the train DataLoader needs a batch_size"):
        _fit_one_rank(DataLoader(make_dataset(64), batch_size=None))


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        ds = make_dataset(64)
        yield from (ds[i] for i in range(64))


def test_iterable_dataset() -> None:
    with pytest.raises(ValueError, match="does not support an IterableDataset"):
        _fit_one_rank(DataLoader(_Stream(), batch_size=8))


def test_custom_sampler() -> None:
    ds = make_dataset(64)
    sampler = WeightedRandomSampler([1.0] * 64, 64)
    with pytest.raises(ValueError, match=r"got a custom sampler WeightedRandomSampler\. Remove"):
        _fit_one_rank(DataLoader(ds, batch_size=8, sampler=sampler))


def test_use_distributed_sampler_false() -> None:
    with pytest.raises(ValueError, match="use_distributed_sampler=True"):
        _fit_one_rank(DataLoader(make_dataset(64), batch_size=8), use_distributed_sampler=False)


def test_several_train_loaders() -> None:
    loaders = [
        DataLoader(make_dataset(64), batch_size=8),
        DataLoader(make_dataset(64), batch_size=8),
    ]
    with pytest.raises(ValueError, match="exactly one train dataloader"):
        _fit_one_rank(loaders)


def test_val_loader_is_left_as_under_ddp() -> None:
    class WithVal(RegModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.val_sizes.append(len(batch[0]))

    model = WithVal()
    model.val_sizes = []
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        strategy=RexStrategy(),
        max_steps=2,
        num_sanity_val_steps=0,
        val_check_interval=2,
    )
    t.fit(
        model,
        DataLoader(make_dataset(64), batch_size=16),
        DataLoader(make_dataset(20), batch_size=8),
    )
    assert type(t.val_dataloaders) is DataLoader
    assert model.val_sizes == [8, 8, 4]
    assert t.strategy.plan == (16,)


# ---------------------------------------------------------------- LightningCLI
def _cli(args: list[str]) -> LightningCLI:
    return LightningCLI(CliModel, run=False, args=args, save_config_callback=None)


def test_cli_short_name_after_import() -> None:
    cli = _cli(["--trainer.strategy=rex", "--trainer.accelerator=cpu", "--trainer.devices=2"])
    assert isinstance(cli.trainer.strategy, RexStrategy)


def test_cli_class_path_and_init_args() -> None:
    cli = _cli(
        [
            "--trainer.strategy=lightning_rex.RexStrategy",
            "--trainer.strategy.micro_batch_sizes=[48,16]",
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
        ]
    )
    assert isinstance(cli.trainer.strategy, RexStrategy)
    assert cli.trainer.strategy.micro_batch_sizes == (48, 16)


def test_cli_yaml_config_and_a_working_fit(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 1\n  max_steps: 3\n  logger: false\n"
        "  enable_checkpointing: false\n  enable_progress_bar: false\n"
        "  strategy:\n    class_path: lightning_rex.RexStrategy\n    init_args:\n"
        "      micro_batch_sizes: [16]\n      loss_reduction: mean\n"
    )
    cli = _cli([f"--config={cfg}"])
    assert cli.trainer.strategy.micro_batch_sizes == (16,)
    cli.trainer.fit(cli.model)
    assert cli.trainer.global_step == 3 and cli.trainer.strategy.plan == (16,)


def _example_cli(config: str) -> LightningCLI:
    import importlib.util

    spec = importlib.util.spec_from_file_location("rex_example_train", EXAMPLES / "train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return LightningCLI(
        mod.ToyModel,
        mod.ToyData,
        run=False,
        args=[f"--config={EXAMPLES / config}"],
        save_config_callback=None,
    )


def test_example_config_parses() -> None:
    cli = _example_cli("static_plan.yaml")
    assert cli.trainer.strategy.micro_batch_sizes == (48, 16)
    assert any(isinstance(c, lightning_rex.HeterogeneityEmulator) for c in cli.trainer.callbacks)
    assert torch.is_tensor(next(iter(cli.datamodule.train_dataloader()))[0])


def test_adaptive_example_config_parses() -> None:
    cli = _example_cli("adaptive.yaml")
    assert isinstance(cli.trainer.strategy, lightning_rex.RexStrategy)
    assert cli.trainer.strategy.adaptive
    rex = [c for c in cli.trainer.callbacks if isinstance(c, lightning_rex.RexCallback)]
    assert len(rex) == 1 and rex[0].settings.alpha == 0.01 and rex[0].window == 30
