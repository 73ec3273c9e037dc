"""BackgroundObserver: outcomes in order, never waited for at an exchange, errors kept."""

from __future__ import annotations

import threading

import numpy as np

from lightning_rex.core.decide.controller import Controller, Decision
from lightning_rex.core.window import Window
from lightning_rex.driver.observer import BackgroundObserver


class _Gated(Controller):
    """A controller whose observe waits for a gate, to stand for a slow refit."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(64, 2)
        self.gate = threading.Event()
        self.declined = 0
        self.fail_at = fail_at

    def observe(self, window: Window) -> Decision:
        self.gate.wait(10)
        if self.fail_at is not None and window.step_start == self.fail_at:
            raise RuntimeError("model exploded")
        return super().observe(window)

    def decline(self) -> None:
        self.declined += 1
        super().decline()


def _window(step: int) -> Window:
    rng = np.random.default_rng(step)
    return Window(0.01 * np.exp(rng.normal(0, 0.05, (2, 10))), (32, 32), step, step + 10)


def test_an_outcome_still_computing_is_not_ready_and_order_is_kept() -> None:
    c = _Gated()
    obs = BackgroundObserver(c)
    try:
        obs.submit(_window(0), {"i": 0})
        obs.submit(_window(10), {"i": 1})
        assert obs.pending and obs.take_ready() == []  # returns at once, nothing lost
        c.gate.set()
        saved = obs.drain()  # a checkpoint waits for every queued outcome, keeps them
        assert [e.info for e in saved] == [{"i": 0}, {"i": 1}] and obs.pending
        ready = obs.take_ready()
        assert [e.outcome.step_end for e in ready] == [10, 20]  # type: ignore[union-attr]
        assert not obs.pending and obs.take_ready() == []
        obs.restore(saved)  # restored outcomes are ready again
        assert [e.info for e in obs.take_ready()] == [{"i": 0}, {"i": 1}]
    finally:
        obs.shutdown()


def test_an_error_in_the_thread_becomes_the_outcome_in_order() -> None:
    c = _Gated(fail_at=10)
    c.gate.set()
    for background in (True, False):
        obs = BackgroundObserver(c, background=background)
        obs.submit(_window(0), {})
        obs.submit(_window(10), {})
        outcomes = [e.outcome for e in obs.drain()]
        assert isinstance(outcomes[0], Decision)
        assert isinstance(outcomes[1], RuntimeError) and "model exploded" in str(outcomes[1])
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


def test_pass_caps_reach_the_controller_in_the_worker_before_it_observes() -> None:
    c = _Gated()
    c.gate.set()
    obs = BackgroundObserver(c, min_size=1)
    obs.submit(_window(0), {}, [40, None])
    obs.drain()
    # soft: the controller prices accumulation above 40 on rank 0, it does not bound it
    assert c.pass_caps == [40, None] and c.bounds.rank_caps is None
    assert c.model.passes.windows[-1] == [40, 0]  # the window was learnt as run under them
    obs.submit(_window(1), {}, None)  # no rank reports a cap any more: the caps are dropped
    obs.drain()
    assert c.pass_caps is None
    obs.shutdown()


def test_inline_observer_is_ready_at_once() -> None:
    obs = BackgroundObserver(Controller(64, 2), background=False)
    obs.submit(_window(0), {"i": 0})
    (e,) = obs.take_ready()
    assert e.info == {"i": 0} and isinstance(e.outcome, Decision)
    obs.decline()  # inline: immediate, no thread
    obs.shutdown()


def test_a_poll_after_an_entrys_exchange_waits_for_it_and_one_before_does_not() -> None:
    c = _Gated()
    obs = BackgroundObserver(c)
    try:
        obs.submit(_window(0), {}, due=15)
        assert obs.take_ready(step=15) == []  # its own exchange: not waited for
        threading.Timer(0.2, c.gate.set).start()
        (e,) = obs.take_ready(step=20)  # the next poll waits
        assert isinstance(e.outcome, Decision) and e.info["exchange_wait_s"] > 0
    finally:
        obs.shutdown()


class _NoEstimate(Controller):
    def even_split_estimate(self) -> tuple[float, float, float] | None:
        raise ArithmeticError("no estimate")


def test_the_even_split_estimate_is_recorded_and_its_failure_stops_nothing() -> None:
    import pytest

    obs = BackgroundObserver(Controller(64, 2), background=False, estimate=True)
    obs.submit(_window(0), {})
    (e,) = obs.take_ready()
    mean, lo, hi = e.info["even_step_s"]
    assert lo <= mean <= hi and mean == pytest.approx(0.01, rel=0.2)
    obs = BackgroundObserver(_NoEstimate(64, 2), background=False, estimate=True)
    with pytest.warns(RuntimeWarning, match="the even split's estimate failed"):
        obs.submit(_window(0), {})
        obs.submit(_window(10), {})  # warned once
    assert all(
        isinstance(x.outcome, Decision) and x.info["even_step_s"] is None for x in obs.take_ready()
    )
