"""Cold-start evidence by rank and by device kind (``kind_test``, ``cold_start_flagged``)."""

import numpy as np

from lightning_rex.core.stats.persistence import cold_start_flagged, kind_test
from lightning_rex.core.stats.significance import imbalance_test


def _times(factors, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    base = np.asarray(factors, dtype=float)[:, None] * 0.05
    return base * np.exp(rng.normal(0, 0.05, (len(factors), steps)))


def test_a_slower_kind_is_found_in_five_steps():
    t = _times([1, 1, 1, 1.5, 1.5, 1.5])
    kinds = np.array([0, 0, 0, 3, 3, 3])
    series = np.stack([np.median(t[kinds == k], axis=0) for k in (0, 3)])
    assert kind_test(series, 0.05, 0.05).tolist() == [True, True]  # both directions
    sig = imbalance_test(t)
    assert cold_start_flagged(t, sig, kinds, 0.01, 0.05) == [0, 1, 2, 3, 4, 5]


def test_kinds_of_the_same_speed_are_not_flagged():
    hits = 0
    for seed in range(50):
        t = _times([1] * 6, seed=seed)
        series = np.stack([np.median(t[:3], axis=0), np.median(t[3:], axis=0)])
        hits += bool(kind_test(series, 0.05, 0.05).any())
    assert hits <= 3  # the level is 5%, and the effect threshold cuts most of it


def test_kinds_of_one_rank_fall_back_to_the_rank_tests():
    t = _times([1, 1.5])
    sig = imbalance_test(t)
    assert not sig.imbalanced  # 5 steps: the rank test cannot reach any level
    # the t test on each rank's log times can: 1.5x against 5% noise
    assert cold_start_flagged(t, sig, np.array([0, 1]), 0.01, 0.05) == [0, 1]
    assert cold_start_flagged(t, sig, np.array([0, 1]), 0.01, 0.05, rank_test=False) == []
    assert not kind_test(t[:, :1], 0.05, 0.05).any()  # one step: nothing to test


# A real first window (two CPU ranks under FSDP, rank 1 emulated 6x slower, ms): the host's
# load moves both ranks together, and rank 1 is about 3x slower in every step
_FSDP_FIRST = [
    [66, 59, 67, 57, 73, 62, 48, 56, 48, 58],
    [190, 179, 239, 203, 211, 177, 147, 162, 147, 167],
]


def test_a_rank_three_times_slower_in_every_step_is_found_at_cold_start():
    t = np.asarray(_FSDP_FIRST) / 1000.0
    sig = imbalance_test(t, alpha=0.05)
    assert sig.p_values[1] > 0.05  # the rank test alone: 10 steps are too few
    assert cold_start_flagged(t, sig, None, 0.01, 0.05) == [0, 1]
    # and with the shared load made stronger
    rng = np.random.default_rng(0)
    for _ in range(20):
        load = np.exp(np.cumsum(rng.normal(0, 0.08, 10)))
        w = np.array([1.0, 3.0])[:, None] * load * np.exp(rng.normal(0, 0.03, (2, 10)))
        assert cold_start_flagged(w, imbalance_test(w), None, 0.01, 0.05) == [0, 1]


def test_ranks_of_the_same_speed_are_rarely_flagged_at_cold_start():
    # identical ranks, autocorrelated noise: the cold start's union of the rank test and the
    # t test stays near its level (5 alpha = 5%) on 2 ranks, and the rank test alone on 3
    # and 16
    from tests.helpers.noise import ar1_lognormal

    rng = np.random.default_rng(11)
    for n in (2, 3, 16):
        hits = 0
        for _ in range(400):
            t = 0.05 * ar1_lognormal(rng, n, 10, 0.3, 0.5)
            hits += bool(cold_start_flagged(t, imbalance_test(t), None, 0.01, 0.05))
        assert hits / 400 <= 0.06, (n, hits)
