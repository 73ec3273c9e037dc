"""ControllerState.mark_changes: which ranks forget their older windows after a change."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_rex.core.decide.controller_state import ControllerState
from lightning_rex.core.plans.plan import Plan

SE = 0.02
"""A window median's relative standard error in these tests."""
MIN_EFFECT = 0.05


class _Model:
    """What mark_changes reads of a rank time model: its noise, predictions and forgetting."""

    def __init__(self, predicted: np.ndarray) -> None:
        self.rel_var = [SE**2]
        self._predicted = predicted
        self.forgotten: list[int] = []

    def predict(self, plan: Plan) -> np.ndarray:
        return self._predicted

    def forget(self, ranks: list[int], keep_last: int) -> None:
        self.forgotten = list(ranks)


def _marked(n_ranks: int, log_moves: dict[int, float], flagged: list[int]) -> list[int]:
    """The ranks that forget when ``log_moves`` ranks moved that far from the reference.

    The model already predicts every rank's recent median, so only the gap to the
    reference (one window's medians, when the plan was accepted) argues for a change.
    """
    recent = np.ones(n_ranks)
    for rank, move in log_moves.items():
        recent[rank] = math.exp(move)
    predicted = recent.copy()
    window = np.repeat(recent[:, None], 4, axis=1)
    st = ControllerState(global_batch=8 * n_ranks, plan=Plan([8] * n_ranks))
    st.reference = [1.0] * n_ranks
    st.recent = [window.tolist()]
    model = _Model(predicted)
    st.mark_changes(flagged, model, MIN_EFFECT)  # type: ignore[arg-type]
    assert st.changed == bool(model.forgotten)
    return model.forgotten


# the reference's margin for one rank: three standard errors of a difference of two medians
ONE_RANK = math.log1p(MIN_EFFECT) + 3.0 * math.sqrt(2) * SE


def test_an_unflagged_rank_that_moved_as_far_forgets_with_the_flagged_one() -> None:
    assert _marked(16, {0: 0.3, 5: 0.3}, flagged=[0]) == [0, 5]


def test_nothing_is_forgotten_when_no_flagged_rank_moved() -> None:
    assert _marked(16, {5: 0.3}, flagged=[0]) == []


@pytest.mark.parametrize(("n_ranks", "forgets"), [(16, True), (4096, False)])
def test_an_unflagged_rank_needs_the_bonferroni_bound_over_the_ranks(
    n_ranks: int, forgets: bool
) -> None:
    # a move past one rank's three-sigma margin: at 16 ranks it clears the Bonferroni bound
    # too (z 3.76), among 4096 ranks (z 4.97) a few ranks would reach it on noise alone
    move = ONE_RANK + 0.04
    marked = _marked(n_ranks, {0: 0.3, 5: move}, flagged=[0])
    assert marked == ([0, 5] if forgets else [0])


def test_a_flagged_rank_keeps_the_one_rank_margin() -> None:
    move = ONE_RANK + 0.01
    assert _marked(4096, {0: move}, flagged=[0]) == [0]
    assert _marked(4096, {0: ONE_RANK - 0.01}, flagged=[0]) == []
