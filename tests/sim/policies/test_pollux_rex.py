"""Pollux's batch choice with rex's plan controller: the agent picks, the controller splits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.decision import Decision
from lightning_rex.core.window import Window
from lightning_rex.sim.engine import goodput
from lightning_rex.sim.engine.goodput import run_goodput
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.pollux import PolluxPolicy
from lightning_rex.sim.policies.pollux_rex import PolluxRexPolicy, _PolluxRexDecider
from lightning_rex.sim.scenarios.schema import load_scenario


def test_it_needs_a_batch_range() -> None:
    with pytest.raises(ValueError, match="batch range"):
        PolluxRexPolicy().reset(PolicyInfo(32, 4, 30, 1, (None,) * 4, (8,) * 4, 0))


def test_the_agent_s_batch_is_split_by_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch the agent picks runs on the plan the controller predicts best for it."""
    s = load_scenario("gns-slow-8")
    picks: list[int] = []
    predicted: dict[int, list[tuple[int, ...]]] = {}
    moves: list[tuple[int, tuple[int, ...]]] = []
    new_batch_guess: list[bool] = []
    choose = PolluxPolicy.choose
    predict = Controller.predict_step_time
    move = Controller.set_global_batch

    def spy_choose(self: PolluxPolicy) -> int | None:
        best = choose(self)
        if best is not None:
            picks.append(best)
        return best

    def spy_predict(self: Controller, batch: int) -> tuple[tuple[int, ...], float]:
        plan, seconds = predict(self, batch)
        predicted.setdefault(batch, []).append(tuple(plan))
        return plan, seconds

    def spy_move(self: Controller, batch: int, plan: tuple[int, ...], guess: bool = False) -> None:
        moves.append((batch, tuple(plan)))
        if batch != self.global_batch:
            new_batch_guess.append(guess)
        move(self, batch, plan, guess)

    monkeypatch.setattr(PolluxPolicy, "choose", spy_choose)
    monkeypatch.setattr(Controller, "predict_step_time", spy_predict)
    monkeypatch.setattr(Controller, "set_global_batch", spy_move)
    res = run_goodput(s, "pollux-rex", 0)
    assert res.reached and res.batch_changes >= 1
    moved = [b for _, b in res.batches[1:]]
    # each batch the run moved to is one the agent picked, on a plan the controller predicted
    assert set(moved) <= set(picks)
    assert moves and all(plan in predicted[batch] for batch, plan in moves)
    assert set(moved) <= {batch for batch, _ in moves}
    # a new batch's plan goes to the controller as a guess, as rex's trials do
    assert new_batch_guess and all(new_batch_guess)
    # and the split is uneven on this mixed cluster (the even split is Pollux's own)
    final = moves[-1][1]
    assert max(final) - min(final) > 1


def test_a_move_the_loop_does_not_apply_is_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Monitor-only: every move is declined; the controller goes back, the agent retries."""
    s = replace(load_scenario("gns-slow-8"), steps=1200)
    loop = goodput.default_loop
    monkeypatch.setattr(
        goodput, "default_loop", lambda sc, pol: replace(loop(sc, pol), apply_plans=False)
    )
    seen: list[tuple[int, str]] = []
    observe = _PolluxRexDecider.observe

    def spy(self: _PolluxRexDecider, window: Window) -> Decision:
        d = observe(self, window)
        seen.append((self.controller.global_batch, d.reason))
        return d

    monkeypatch.setattr(_PolluxRexDecider, "observe", spy)
    res = run_goodput(s, "pollux-rex", 0)
    assert res.batches == [[0, 256]]  # nothing applied
    assert sum("Pollux's goodput-optimal" in why for _, why in seen) >= 2  # chosen again
    assert seen[-1][0] == 256  # the controller is back at the batch in force
    assert not any("not yet in force" in why for _, why in seen[-5:])


def test_the_learnt_split_is_the_gain_over_pollux_s_even_split() -> None:
    s = load_scenario("gns-slow-8")
    peer, pollux = run_goodput(s, "pollux-rex", 0), run_goodput(s, "pollux", 0)
    assert peer.reached and pollux.reached
    assert pollux.time_to_target_s is not None and peer.time_to_target_s is not None
    # the same agent; the controller's split reaches the target in well under Pollux's time
    assert peer.time_to_target_s < 0.6 * pollux.time_to_target_s
    assert np.isfinite(peer.decision_ms_p99)
