"""The test that ends an adaptive warm-up: is a block's first half still slower?"""

import numpy as np
import pytest
from tests.helpers.noise import ar1_lognormal

from lightning_rex.core.stats.at_speed import warming_ranks


@pytest.mark.parametrize(("ranks", "steps"), [(2, 5), (8, 5), (8, 10), (512, 5)])
def test_blocks_at_speed_are_seldom_found_warming_at_any_scale(ranks: int, steps: int) -> None:
    rng = np.random.default_rng(ranks + steps)
    found = sum(
        bool(warming_ranks(ar1_lognormal(rng, ranks, steps, 0.1, 0.5)).any()) for _ in range(400)
    )
    assert found <= 6  # alpha = 1% over all ranks together; measured 0-0.6%


def test_a_transient_still_decaying_is_found_on_the_ranks_that_have_it() -> None:
    rng = np.random.default_rng(3)
    hits, others = 0.0, 0
    for _ in range(200):
        t = ar1_lognormal(rng, 8, 5, 0.05, 0.3)
        t[:4, 0] *= 3.0  # a kind still compiling: 3x, 2x, then at speed
        t[:4, 1] *= 2.0
        found = warming_ranks(t)
        hits += found[:4].mean()
        others += int(found[4:].any())
    assert hits / 200 >= 0.95 and others == 0


def test_a_spike_a_plateau_and_a_mild_slowdown_are_not_a_warm_up() -> None:
    rng = np.random.default_rng(4)
    spike = ar1_lognormal(rng, 8, 5, 0.05, 0.3)
    spike[3, 1] *= 6.0  # one slow step among fast ones
    plateau = ar1_lognormal(rng, 8, 5, 0.05, 0.3)
    plateau[2] *= 4.0  # slow all through the block: a rank's speed, as far as a block can tell
    mild = np.ones((4, 6))
    mild[1, :3] = 1.08  # under the 10% tolerance
    for t in (spike, plateau, mild):
        assert not warming_ranks(t).any()
    steep = np.ones((4, 6))
    steep[1, :3] = 1.5  # noiseless: the tolerance alone decides
    assert warming_ranks(steep).tolist() == [False, True, False, False]


def test_short_blocks_and_bad_settings() -> None:
    assert warming_ranks(np.full((3, 3), 2.0)).tolist() == [False] * 3
    with pytest.raises(ValueError, match="ranks, steps"):
        warming_ranks(np.ones(5))
    with pytest.raises(ValueError, match="alpha"):
        warming_ranks(np.ones((2, 5)), alpha=1.0)
    with pytest.raises(ValueError, match="allowance"):
        warming_ranks(np.ones((2, 5)), allowance=0.5)
