"""Cold-start evidence by device kind (``kind_test``, ``cold_start_flagged``)."""

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


def test_kinds_of_one_rank_fall_back_to_the_rank_test():
    t = _times([1, 1.5])
    sig = imbalance_test(t)
    assert cold_start_flagged(t, sig, np.array([0, 1]), 0.01, 0.05) == []
    assert not kind_test(t[:, :1], 0.05, 0.05).any()  # one step: nothing to test
