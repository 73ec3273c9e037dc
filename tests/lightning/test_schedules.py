"""Learning-rate schedules under global batch scaling: scale-invariant iterations."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau, StepLR

from lightning_rex import GlobalBatchScaling
from lightning_rex.lightning.scaling import TrainingScaling
from lightning_rex.lightning.schedules import (
    ScaleInvariantScheduler,
    unwrap_schedulers,
    wrap_schedulers,
)


def _setup(rule: str, make: Any) -> tuple[torch.optim.Optimizer, TrainingScaling, Any]:
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    ts = TrainingScaling(GlobalBatchScaling(8, 64, lr_rule=rule), 16, list(lin.parameters()))
    for _ in range(20):  # |G|^2 = 0, noise only: AdaScale's gain at B is B / B0
        ts.noise.update(2.0, 1.0, (8, 8))
    config = SimpleNamespace(interval="step", frequency=1, scheduler=make(opt))
    assert wrap_schedulers([config], ts) == 1
    return opt, ts, config


def _step(opt: torch.optim.Optimizer, ts: TrainingScaling, config: Any, plan: tuple[int, ...]):
    ts.at_step_start([opt], plan)  # what the callback does before each optimizer step
    opt.step()
    config.scheduler.step()  # what Lightning does after it (interval "step")


def test_adascale_advances_a_step_schedule_by_its_gain() -> None:
    # StepLR decays x0.1 every 10 iterations; at twice the base batch AdaScale's gain is 2,
    # so 5 steps are 10 scale-invariant iterations: the decay comes at step 5, not 10
    opt, ts, config = _setup("adascale", lambda o: StepLR(o, step_size=10, gamma=0.1))
    for _ in range(4):
        _step(opt, ts, config, (16, 16))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 2.0)  # the gain, no decay yet
    _step(opt, ts, config, (16, 16))
    assert ts.iterations == pytest.approx(10.0)
    assert config.scheduler.last_epoch == 10  # the scheduler's own count, read through
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1 * 2.0)
    # back at the base batch the gain is 1: one iteration per step
    for _ in range(10):
        _step(opt, ts, config, (8, 8))
    assert ts.iterations == pytest.approx(20.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.01)
    ts.norms.remove()


def test_a_closed_form_schedule_keeps_the_scaling_factor() -> None:
    # LambdaLR sets lr = base x lambda(t) in closed form: without the wrapper every step
    # overwrote the sqrt rule's factor x sqrt(2) at twice the base batch
    opt, ts, config = _setup("sqrt", lambda o: LambdaLR(o, lambda t: 1.0 / (1 + t)))
    for k in range(1, 6):
        _step(opt, ts, config, (16, 16))
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 2**0.5 / (1 + k))
    assert ts.iterations == 5.0  # one per step under the other rules
    ts.norms.remove()


def test_resume_and_unwrap() -> None:
    opt, ts, config = _setup("adascale", lambda o: StepLR(o, step_size=10, gamma=0.1))
    for _ in range(3):
        _step(opt, ts, config, (16, 16))
    saved, sched = ts.state_dict(), config.scheduler.state_dict()
    assert saved["iterations"] == pytest.approx(6.0)
    again = TrainingScaling(ts.config, 16, list(opt.param_groups[0]["params"]), saved)
    inner = StepLR(opt, step_size=10, gamma=0.1)
    inner.load_state_dict(sched)
    wrapped = ScaleInvariantScheduler(inner, again, 1)
    assert wrapped.done == 6 and wrapped.last_epoch == 6
    # a plateau scheduler follows a metric and an epoch scheduler epochs: left alone
    plateau = SimpleNamespace(interval="step", frequency=1, scheduler=ReduceLROnPlateau(opt))
    epoch = SimpleNamespace(interval="epoch", frequency=1, scheduler=StepLR(opt, 1))
    assert wrap_schedulers([plateau, epoch, config], ts) == 0
    unwrap_schedulers([config])
    assert isinstance(config.scheduler, StepLR)
    with pytest.raises(Exception, match="iterations"):
        TrainingScaling.check_state({**saved, "iterations": -1.0}, ts.config)
    ts.norms.remove()
    again.norms.remove()
