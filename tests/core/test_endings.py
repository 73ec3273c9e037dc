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


@pytest.mark.parametrize(("n", "k", "ties"), [(2, 10, False), (16, 10, False), (64, 12, True)])
def test_each_ranks_test_in_one_pass_is_its_own_call(n, k, ties):
    """The leave-one-out ranks give each rank exactly what its own call gives."""
    rng = np.random.default_rng(n)
    t = ar1_lognormal(rng, n, k, 0.1, 0.5)
    if ties:  # quantized timers: many equal times across ranks
        t = np.round(t, 2)
    t[1, : k // 2] *= 1.5
    ranks = list(range(0, n, max(1, n // 8)))
    slower = [bool(i % 2) for i in range(len(ranks))]
    each = endings.ending_p_value_each(t, ranks, slower)
    own = [endings.ending_p_value(t, [r], slower=s)[0] for r, s in zip(ranks, slower)]
    np.testing.assert_allclose(each, own, rtol=1e-12, atol=0)
