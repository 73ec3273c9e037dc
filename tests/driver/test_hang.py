"""The hang watchdog's rule, with injected clocks: who is silent, and when."""

from __future__ import annotations

import math

import pytest

from lightning_rex.driver.hang import HangDetector


def test_a_rank_behind_the_others_for_longer_than_the_limit_is_silent() -> None:
    d = HangDetector(3, floor_s=10.0, factor=20.0)
    # steps of 0.1 s: the floor (10 s) is the limit
    assert d.observe([3, 3, 3], [0.1] * 3, now=0.0) is None
    assert d.observe([5, 5, 4], [0.1] * 3, now=1.0) is None  # rank 2 is in its step
    assert d.observe([5, 5, 4], [0.1] * 3, now=10.9) is None  # 9.9 s: not yet
    hang = d.observe([5, 5, 4], [0.1] * 3, now=11.5)
    assert hang is not None and hang.rank == 2 and hang.limit_s == 10.0
    assert hang.stalled_s == pytest.approx(10.5) and hang.progress == (5, 5, 4)
    assert "rank 2 made no progress for 10 s" in hang.message()


def test_ranks_that_all_stand_still_together_are_not_a_hang() -> None:
    # validation, a checkpoint, a long first step: nobody is ahead of anybody
    d = HangDetector(2, floor_s=5.0, factor=20.0)
    for t in range(0, 1000, 7):
        assert d.observe([9, 9], [0.1, 0.1], now=float(t)) is None


def test_the_limit_follows_the_slowest_ranks_typical_step() -> None:
    d = HangDetector(2, floor_s=5.0, factor=20.0)
    assert d.limit([0.1, 2.0]) == 40.0 and d.limit([math.nan, math.nan]) == 5.0
    d.observe([4, 3], [0.5, 2.0], now=0.0)
    assert d.observe([4, 3], [0.5, 2.0], now=39.0) is None  # a slow step, not a hang
    assert d.observe([4, 3], [0.5, 2.0], now=41.0) is not None


def test_progress_that_moves_restarts_the_clock() -> None:
    d = HangDetector(2, floor_s=5.0, factor=1.0)
    for t in range(100):  # rank 1 trails by a point but keeps moving
        assert d.observe([t + 1, t], [0.01, 0.01], now=float(t)) is None


@pytest.mark.parametrize(("floor", "factor"), [(0.0, 2.0), (math.inf, 2.0), (5.0, 0.5)])
def test_bad_settings_are_refused(floor: float, factor: float) -> None:
    with pytest.raises(ValueError):
        HangDetector(2, floor, factor)
