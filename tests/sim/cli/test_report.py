import math

import numpy as np
import pytest
from scipy import stats

from lightning_rex.sim.cli.report import paired_ratio


def test_paired_ratio_is_the_geometric_mean_with_a_t_interval():
    a, b = [1.1, 1.2, 0.9, 1.0], [1.0, 1.0, 1.0, 1.0]
    r, lo, hi = paired_ratio(a, b)
    d = np.log(a)
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert r == pytest.approx(math.exp(d.mean()))
    assert (lo, hi) == pytest.approx((math.exp(d.mean() - half), math.exp(d.mean() + half)))
    assert lo < r < hi


def test_pairing_removes_what_the_seeds_share():
    # seed-to-seed spread is large, the per-seed gap is a steady 2%: a narrow interval
    base = np.array([0.5, 0.9, 0.7, 0.6, 0.8])
    r, lo, hi = paired_ratio(base * 1.02, base)
    assert r == pytest.approx(1.02) and hi - lo < 1e-9


def test_one_seed_has_no_interval_and_bad_input_is_refused():
    assert paired_ratio([2.0], [1.0]) == (2.0, None, None)
    with pytest.raises(ValueError, match="equal, non-zero lengths"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([0.0], [1.0])
