"""A fit's guards in-process: one progress point per backward, and a signal that came too late."""

from __future__ import annotations

import types

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy
from tests.lightning.test_watchdog_store import _Store

from lightning_rex.driver.stopping import StopKind, StopRequests
from lightning_rex.lightning.guards import FitGuards
from lightning_rex.lightning.preemption import SignalCatcher
from lightning_rex.lightning.watchdog import HangWatchdog


def test_a_micro_batch_trained_in_several_passes_is_one_point_of_progress() -> None:
    guards = FitGuards(600.0, 20.0, preemption=False)
    guards.watchdog = HangWatchdog(_Store(), 0, 2, "run", floor_s=600.0, factor=20.0)
    guards.advance()  # batch start
    for _ in range(4):  # four accumulation passes, each with its on_before_backward
        guards.backward()
    guards.advance(step_end=True)
    guards.backward()  # the next micro-batch's
    assert guards.watchdog.progress == 4  # start, backward, end, and the next backward


def test_a_signal_after_the_last_exchange_is_said_when_the_fit_ends() -> None:
    trainer = types.SimpleNamespace(
        strategy=DDPStrategy(cluster_environment=LightningEnvironment())
    )
    guards = FitGuards(None, 20.0, preemption=True)
    stops = StopRequests()
    guards._stops = stops
    guards.signals = SignalCatcher(trainer, stops.request)  # not installed: no handler to swap
    guards.signals.received.append(15)
    stops.request(StopKind.STOP)
    with pytest.warns(UserWarning, match="arrived after the fit's last exchange"):
        guards.stop_watching()
    assert guards.signals is None
