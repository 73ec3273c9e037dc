"""Stragglers that end or start inside a window, and deviations that fade."""

import numpy as np
import pytest
from tests.helpers.noise import ar1_lognormal

from lightning_rex.core.stats import endings


def test_ending_p_value_flags_stragglers_that_stop_or_start_not_persistent_ones():
    rng = np.random.default_rng(11)
    stop, persist = 0, 0
    for _ in range(100):
        t = ar1_lognormal(rng, 16, 30, 0.1, 0.5)
        t[4, :15] *= 1.6
        stop += endings.ending_p_value(t, [4])[0] < 0.05
        u = ar1_lognormal(rng, 16, 30, 0.1, 0.5)
        u[4] *= 1.15
        ends = endings.ending_p_value(u, [4])[0]
        persist += ends < 0.05 or endings.ending_p_value(u, [4], slower=False)[0] < 0.05
    assert stop >= 90 and persist <= 5
    assert endings.ending_p_value(np.ones((3, 4)), [0]).tolist() == [1.0]


def test_ending_p_value_is_vectorised_over_ranks():
    rng = np.random.default_rng(12)
    t = ar1_lognormal(rng, 8, 30, 0.1, 0.5)
    t[2, :15] *= 1.6
    both = endings.ending_p_value(t, [2, 5])
    assert both[0] < 0.05 < both[1]


def test_effect_drop_z_flags_a_fading_straggler():
    rng = np.random.default_rng(13)
    a, b = ar1_lognormal(rng, 16, 30, 0.1, 0.5), ar1_lognormal(rng, 16, 30, 0.1, 0.5)
    a[3] *= 1.6
    b[3] *= 1.08
    a[9] *= 1.15
    b[9] *= 1.15
    z = endings.effect_drop_z([a, b])
    assert z[3] > 3 and abs(z[9]) < 2.33
    assert endings.effect_drop_z([a[:2], b[:2]]).tolist() == [0.0, 0.0]


def test_directions_per_rank_give_each_directions_own_test():
    rng = np.random.default_rng(14)
    t = ar1_lognormal(rng, 16, 30, 0.1, 0.5)
    t[1, :15] *= 1.5
    t[6, 15:] *= 1.5
    ranks, slower = [1, 6, 9], [True, False, True]
    mixed = endings.ending_p_value(t, ranks, slower=slower)
    up, down = endings.ending_p_value(t, ranks), endings.ending_p_value(t, ranks, slower=False)
    np.testing.assert_array_equal(mixed, np.where(slower, up, down))
    assert mixed[0] < 0.05 and mixed[1] < 0.05


@pytest.mark.parametrize("seed", range(4))
def test_a_kind_that_slowed_at_once_does_not_hide_its_own_start(seed: int) -> None:
    """Ranks examined together are left out of the reference: 24 of 64 ranks slowing in
    the same step would, as each other's reference, read as autocorrelation (a variance
    factor near 5.5 instead of 3) and mask the start (each rank tested against all the
    others saw 0 of the 24 starts at these seeds)."""
    rng = np.random.default_rng(seed)
    t = ar1_lognormal(rng, 64, 30, 0.1, 0.5)
    t[:24, 15:] *= 1.5
    started = endings.ending_p_value(t, list(range(24)), slower=False)
    assert (started < 0.05).sum() >= 22
