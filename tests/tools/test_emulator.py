"""HeterogeneityEmulator: factors, validation, and where and how much it delays."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning_rex import HeterogeneityEmulator
from lightning_rex.tools.bench import BenchModel


def test_factor_combines_slowdown_and_active_events() -> None:
    emu = HeterogeneityEmulator(
        [1.0, 2.0],
        events=[
            {"ranks": [1], "start": 10, "end": 20, "factor": 3.0},
            {"ranks": [0, 1], "start": 15, "end": 16, "factor": 2.0},
        ],
    )
    assert emu.factor(1, 9) == 2.0
    assert emu.factor(1, 10) == 6.0
    assert emu.factor(1, 15) == 12.0
    assert emu.factor(0, 15) == 2.0
    assert emu.factor(1, 20) == 2.0  # end is exclusive


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"slowdowns": [1.0, 0.5]}, "slowdowns must all be >= 1.0"),
        (
            {"events": [{"ranks": [1], "start": 5, "end": 5, "factor": 2}]},
            r"events\[0\] needs 0 <= start < end",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "end": 5, "factor": 0}]},
            r"events\[0\].factor must be > 0",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "end": 5, "factor": 2, "when": 1}]},
            r"events\[0\] has unknown keys \['when'\]",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "factor": 2}]},
            r"events\[0\] is missing \['end'\]",
        ),
        (
            {"events": [{"ranks": [], "start": 0, "end": 1, "factor": 2}]},
            r"events\[0\].ranks must be a non-empty list",
        ),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HeterogeneityEmulator(**kwargs)


class _Delays(HeterogeneityEmulator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.per_step: list[tuple[int, float, bool]] = []

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        before = self.total_delay_s
        super().on_before_backward(trainer, pl_module, loss)
        no_grads_yet = all(p.grad is None or not p.grad.any() for p in pl_module.parameters())
        self.per_step.append((trainer.global_step, self.total_delay_s - before, no_grads_yet))


def _fit(emu: HeterogeneityEmulator, batch: int, steps: int = 6) -> None:
    torch.set_num_threads(1)
    n = batch * steps
    ds = TensorDataset(torch.randn(n, 16, 32), torch.randint(0, 10, (n,)))
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[emu],
    )
    t.fit(BenchModel(width=64, depth=2), DataLoader(ds, batch_size=batch))


def test_delay_only_inside_events_and_before_gradients() -> None:
    emu = _Delays([1.0], events=[{"ranks": [0], "start": 2, "end": 4, "factor": 3.0}])
    _fit(emu, batch=8)
    for step, delay, no_grads in emu.per_step:
        assert (delay > 0) == (2 <= step < 4)
        assert no_grads  # the extra time is spent before this step's gradients exist


def test_delay_scales_with_the_steps_own_work() -> None:
    small, large = _Delays([3.0]), _Delays([3.0])
    _fit(small, batch=2, steps=8)
    _fit(large, batch=256, steps=8)
    mean = lambda e: sum(d for _, d, _ in e.per_step[2:]) / len(e.per_step[2:])  # noqa: E731
    assert mean(large) > 3 * mean(small)


def test_slowdowns_must_match_world_size() -> None:
    with pytest.raises(
        ValueError, match="slowdowns must have one entry per rank: the world size is 1"
    ):
        _fit(HeterogeneityEmulator([1.0, 3.0]), batch=4)
