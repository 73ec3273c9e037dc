"""StepStretch: what of a step the emulator stretches, and where it sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.tools.test_emulator import _Clock, _fit, _Phases, _TimedModel

from lightning_rex import HeterogeneityEmulator
from lightning_rex.tools import stretch as stretch_module


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _SyncsAfterForward(_TimedModel):
    """Logs with a collective after its forward (as ``sync_dist=True`` does), and notes how
    much the emulator had slept when the collective was entered and when it returned."""

    def __init__(self, clock: _Clock, emu: HeterogeneityEmulator) -> None:
        super().__init__(clock)
        self.emu = emu
        self.at_collective: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        before = self.emu.total_delay_s
        dist.all_reduce(loss.detach().clone())  # through the wrapper: the emulator hears it
        self.at_collective.append(self.emu.total_delay_s - before)
        self.clock.t += 5.0  # a peer keeps this rank waiting inside the collective
        return loss


def test_a_peer_meets_the_slow_rank_late_at_a_collective_after_the_forward(
    group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slowdown 3: the forward's (3 - 1) x 1 ms a sample is slept before the collective, not
    after the backward, and the 5 s inside the collective is neither work nor compute."""
    clock = _Clock()
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [3.0], headroom=1.0)
    model = _SyncsAfterForward(clock, emu)
    torch.set_num_threads(1)
    from tests.helpers.trainer import quiet_trainer
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(48, 16, 32), torch.randint(0, 10, (48,)))
    t = quiet_trainer(devices=1, max_steps=6, callbacks=[emu])
    t.fit(model, DataLoader(ds, batch_size=8))
    assert emu.phases == pytest.approx([3.0 * 0.003 * 8 + 5.0] * 6)
    # the collective's own entry slept the forward's share, before any peer could see it
    assert model.at_collective == pytest.approx([2.0 * 0.001 * 8] * 6)


class _HostWork(_TimedModel):
    """Python in the step outside any module (Lightning's loop, a logging call): 4 ms."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.clock is not None
        self.clock.work(0.004)
        return super().training_step(batch, batch_idx)


def test_the_hosts_python_outside_the_model_is_not_stretched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slower GPU runs its kernels slower, not the host's Python: 3 x the model's 3 ms a
    sample, plus the 4 ms of host work once."""
    clock = _Clock()
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [3.0], headroom=1.0)
    _fit(emu, batch=8, clock=clock, model=_HostWork(clock))
    assert emu.phases == pytest.approx([3.0 * 0.003 * 8 + 0.004] * 6)
