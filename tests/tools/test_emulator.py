"""HeterogeneityEmulator: factors, validation, and where and how much it delays."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning_rex import HeterogeneityEmulator
from lightning_rex.tools import emulator as emulator_module
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


class _Clock:
    """Stands in for the emulator's ``time`` module: time passes only when the test says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class _TimedModel(BenchModel):
    """On the fake clock, its forward takes 1 ms per sample and its backward twice that."""

    def __init__(self, clock: _Clock | None) -> None:
        super().__init__(width=64, depth=2)
        self.clock = clock

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.clock is not None:
            clock, n = self.clock, len(batch[0])
            clock.t += 0.001 * n

            def backward_starts(grad: torch.Tensor) -> None:
                clock.t += 0.002 * n  # before any parameter's gradient is ready

            loss.register_hook(backward_starts)
        return loss


def _fit(
    emu: HeterogeneityEmulator, batch: int, steps: int = 6, clock: _Clock | None = None
) -> None:
    torch.set_num_threads(1)
    n = batch * steps
    ds = TensorDataset(torch.randn(n, 16, 32), torch.randint(0, 10, (n,)))
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[emu],
    )
    t.fit(_TimedModel(clock), DataLoader(ds, batch_size=batch))


def test_delay_only_inside_events_and_before_gradients() -> None:
    emu = _Delays([1.0], events=[{"ranks": [0], "start": 2, "end": 4, "factor": 3.0}])
    _fit(emu, batch=8)
    for step, delay, no_grads in emu.per_step:
        assert (delay > 0) == (2 <= step < 4)
        assert no_grads  # the extra time is spent before this step's gradients exist


@pytest.mark.parametrize("batch", [2, 256])
def test_delay_is_the_extra_compute_of_a_slower_device(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slowdown 3: (3 - 1) x (forward + measured backward) = 2 x 3 ms per sample, every step."""
    clock = _Clock()
    monkeypatch.setattr(emulator_module, "time", clock)
    emu = _Delays([3.0])
    _fit(emu, batch=batch, clock=clock)
    assert [d for _, d, _ in emu.per_step] == pytest.approx([0.006 * batch] * 6)
    assert emu.total_delay_s == pytest.approx(6 * 0.006 * batch)


def test_the_backward_ratio_follows_the_measured_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prior ratio of 0.5 moves towards the measured 2.0, so later delays grow towards 6 ms."""
    clock = _Clock()
    monkeypatch.setattr(emulator_module, "time", clock)
    emu = _Delays([3.0], backward_ratio=0.5)
    _fit(emu, batch=10, clock=clock)
    delays = [d for _, d, _ in emu.per_step]
    assert delays[0] == pytest.approx(2 * 0.010 * 1.5)
    assert all(a < b < 2 * 0.010 * 3.0 for a, b in itertools.pairwise(delays))


def test_slowdowns_must_match_world_size() -> None:
    with pytest.raises(
        ValueError, match="slowdowns must have one entry per rank: the world size is 1"
    ):
        _fit(HeterogeneityEmulator([1.0, 3.0]), batch=4)
