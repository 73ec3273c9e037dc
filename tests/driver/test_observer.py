"""BackgroundObserver: decisions in order, never waited for at an exchange, saved whole."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from lightning_rex.core.controller import Controller, Decision
from lightning_rex.core.window import Window
from lightning_rex.driver.observer import BackgroundObserver


class _Gated(Controller):
    """A controller whose observe waits for a gate, to stand for a slow refit."""

    def __init__(self) -> None:
        super().__init__(64, 2)
        self.gate = threading.Event()
        self.declined = 0

    def observe(self, window: Window) -> Decision:
        self.gate.wait(10)
        return super().observe(window)

    def decline(self) -> None:
        self.declined += 1
        super().decline()


def _window(step: int) -> Window:
    rng = np.random.default_rng(step)
    return Window(0.01 * np.exp(rng.normal(0, 0.05, (2, 10))), (32, 32), step, step + 10)


def test_a_decision_still_computing_is_not_ready_and_order_is_kept() -> None:
    c = _Gated()
    obs = BackgroundObserver(c)
    try:
        infos: list[dict[str, Any]] = [{"i": 0}, {"i": 1}]
        obs.submit(_window(0), infos[0])
        obs.submit(_window(10), infos[1])
        assert obs.pending and obs.take_ready() == []  # returns at once, nothing lost
        c.gate.set()
        saved = obs.drain()  # a checkpoint waits for every queued decision, keeps them
        assert [info for _, info in saved] == infos and obs.pending
        ready = obs.take_ready()
        assert [info for _, info in ready] == infos
        assert [d["step_end"] for d, _ in ready] == [10, 20]
        assert not obs.pending and obs.take_ready() == []
        # restored decisions are ready again
        obs.restore(saved)
        assert [info for _, info in obs.take_ready()] == infos
    finally:
        obs.shutdown()


def test_decline_runs_after_the_queued_windows_and_drain_waits_for_it() -> None:
    c = _Gated()
    obs = BackgroundObserver(c)
    obs.submit(_window(0), {})
    obs.decline()
    assert c.declined == 0  # queued behind the observation still waiting
    threading.Timer(0.2, c.gate.set).start()
    obs.drain()  # a checkpoint reads the controller afterwards: every queued call has run
    assert c.declined == 1 and c.windows_seen == 1
    obs.shutdown()


def test_size_caps_reach_the_controller_in_the_worker_before_it_observes() -> None:
    c = _Gated()
    c.gate.set()
    obs = BackgroundObserver(c)
    obs.submit(_window(0), {}, [40, None])
    obs.drain()
    assert c.max_sizes == [40, None]
    obs.shutdown()


def test_inline_observer_is_ready_at_once() -> None:
    c = Controller(64, 2)
    obs = BackgroundObserver(c, background=False)
    obs.submit(_window(0), {"i": 0})
    ((d, info),) = obs.take_ready()
    assert info == {"i": 0} and d["kind"] in ("hold", "propose")
    obs.decline()  # inline: immediate, no thread
    obs.shutdown()
