"""The hang watchdog's rule, with injected values: who is silent, and when."""

from __future__ import annotations

import math
import random

import pytest

from lightning_rex.driver.hang import HangDetector


def test_a_rank_behind_the_others_for_longer_than_the_limit_is_silent() -> None:
    d = HangDetector(3, floor_s=10.0, factor=20.0)
    # steps of 0.1 s: the floor (10 s) is the limit; rank 2 stands at 4 while 0 and 1 wait at 5
    assert d.observe([3, 3, 3], [0.1] * 3, [0.0, 0.0, 0.0]) is None
    assert d.observe([5, 5, 4], [0.1] * 3, [9.9, 9.8, 9.95]) is None  # 9.9 s: not yet
    hang = d.observe([5, 5, 4], [0.1] * 3, [10.5, 10.4, 10.6])
    assert hang is not None and hang.rank == 2 and hang.limit_s == 10.0
    assert hang.stalled_s == pytest.approx(10.5) and hang.progress == (5, 5, 4)
    assert "rank 2 made no progress for 10 s" in hang.message()


def test_ranks_that_all_stand_still_together_are_not_a_hang() -> None:
    # validation, a checkpoint, a long first step: nobody is ahead of anybody
    d = HangDetector(2, floor_s=5.0, factor=20.0)
    for t in range(0, 1000, 7):
        assert d.observe([9, 9], [0.1, 0.1], [float(t), float(t)]) is None


def test_a_pause_every_rank_shares_is_not_counted_against_a_rank_that_follows_late() -> None:
    # the case: 620 s of validation on both ranks, then rank 0 fetches its next batch
    # at once and rank 1 takes 45 s: rank 1 stood still for 665 s, but behind rank 0 for 45 s
    d = HangDetector(2, floor_s=600.0, factor=20.0)
    assert d.observe([61, 60], [0.1, 0.1], [45.0, 665.0]) is None
    assert d.stalls([61, 60], [45.0, 665.0]) == [0.0, 45.0]


def test_a_rank_stalled_behind_the_oldest_rank_ahead_is_timed_by_it() -> None:
    d = HangDetector(4, floor_s=4.0, factor=1.0)
    # rank 3 stands at 7; ranks 0 and 1 have waited at 8 for 5 s and 1 s, rank 2 at 9 for 2 s
    assert d.stalls([8, 8, 9, 7], [5.0, 1.0, 2.0, 30.0]) == [2.0, 1.0, 0.0, 5.0]
    hang = d.observe([8, 8, 9, 7], [0.1] * 4, [5.0, 1.0, 2.0, 30.0])
    assert hang is not None and hang.rank == 3 and hang.stalled_s == 5.0
    # a rank that has just moved is not stalled, however long the others have waited
    assert d.observe([8, 8, 8, 7], [0.1] * 4, [50.0, 50.0, 50.0, 0.5]) is None


def test_the_limit_follows_the_slowest_ranks_typical_step() -> None:
    d = HangDetector(2, floor_s=5.0, factor=20.0)
    assert d.limit([0.1, 2.0]) == 40.0 and d.limit([math.nan, math.nan]) == 5.0
    assert d.observe([4, 3], [0.5, 2.0], [39.0, 39.0]) is None  # a slow step, not a hang
    assert d.observe([4, 3], [0.5, 2.0], [41.0, 41.0]) is not None


def test_progress_that_moves_is_never_a_hang() -> None:
    d = HangDetector(2, floor_s=5.0, factor=1.0)
    for t in range(100):  # rank 1 trails by a point but keeps moving
        assert d.observe([t + 1, t], [0.01, 0.01], [0.01, 0.02]) is None


def _simulate(pause_s: float, lag_s: float, limit: float, poll: float, seed: int) -> bool:
    """Two ranks publishing (progress, age) every ``poll`` at random phases, judged every
    ``poll``: steps of 0.1 s, then a pause on both, then ``lag_s`` more on rank 1. Whether a
    hang was found."""
    rng = random.Random(seed)
    d = HangDetector(2, floor_s=limit, factor=1.0)
    step = 0.1

    def progress(rank: int, t: float) -> tuple[int, float]:
        """Rank ``rank``'s count and the time it last moved, at time ``t``."""
        if t < 10.0:  # steps: 3 points each, the slow rank a little later
            k = int(t / step * 3)
            return k, k * step / 3
        resume = 10.0 + pause_s + (lag_s if rank == 1 else 0.0)
        base = int(10.0 / step * 3)
        return (base, 10.0) if t < resume else (base + 1, resume)

    phases = [rng.uniform(0, poll), rng.uniform(0, poll)]
    t = rng.uniform(0, poll)
    while t < 10.0 + pause_s + lag_s + 2 * poll:
        seen, ages = [], []
        for r in (0, 1):  # each rank's latest publication before t
            published = t - ((t - phases[r]) % poll)
            count, moved = progress(r, published)
            seen.append(count)
            ages.append(published - moved)
        if d.observe(seen, [step, step], ages) is not None:
            return True
        t += poll
    return False


@pytest.mark.parametrize("seed", range(20))
def test_an_8s_pause_then_a_1s_lag_is_never_a_hang_at_a_4s_limit(seed: int) -> None:
    # the scaled case, at random publication phases: the old rule (time since the
    # last change) found a hang in most of them
    assert not _simulate(pause_s=8.0, lag_s=1.0, limit=4.0, poll=0.4, seed=seed)


@pytest.mark.parametrize("seed", range(5))
def test_a_lag_past_the_limit_is_found(seed: int) -> None:
    assert _simulate(pause_s=8.0, lag_s=6.0, limit=4.0, poll=0.4, seed=seed)


@pytest.mark.parametrize(("floor", "factor"), [(0.0, 2.0), (math.inf, 2.0), (5.0, 0.5)])
def test_bad_settings_are_refused(floor: float, factor: float) -> None:
    with pytest.raises(ValueError):
        HangDetector(2, floor, factor)
