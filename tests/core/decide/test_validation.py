import numpy as np
import pytest

from lightning_rex.core.stats.noninferiority import long_run_variance, non_inferiority


def ar1(rng, k, rho, sd=0.05):
    x = np.empty(k)
    x[0] = rng.standard_normal() * sd
    e = rng.standard_normal(k) * sd * np.sqrt(1 - rho * rho)
    for j in range(1, k):
        x[j] = rho * x[j - 1] + e[j]
    return x


def test_long_run_variance_tracks_ar1_theory():
    """AR(1) 0.5 has long-run variance 3x its variance; on 600 steps the estimate is close,
    and on independent noise it stays near the variance."""
    rng = np.random.default_rng(0)
    ratios = [long_run_variance(x) / x.var() for x in (ar1(rng, 600, 0.5) for _ in range(200))]
    assert 2.3 < np.mean(ratios) < 3.2
    iid = [long_run_variance(x) / x.var() for x in (ar1(rng, 600, 0.0) for _ in range(200))]
    assert 0.95 <= np.mean(iid) < 1.2
    assert long_run_variance(np.ones(10)) == 0.0
    assert long_run_variance(np.ones(1)) == 0.0
    x = ar1(rng, 50, 0.5)
    assert long_run_variance(x, bandwidth=0) == pytest.approx(x.var())


def test_non_inferiority_keeps_faster_and_rejects_slower_plans():
    rng = np.random.default_rng(1)
    base = np.exp(ar1(rng, 120, 0.3, 0.03))
    faster = non_inferiority(0.95 * np.exp(ar1(rng, 60, 0.3, 0.03)), base)
    slower = non_inferiority(1.10 * np.exp(ar1(rng, 60, 0.3, 0.03)), base)
    assert faster.non_inferior and faster.ratio < 1.0 and faster.upper <= faster.bound
    assert not slower.non_inferior and slower.lower > slower.bound
    assert set(slower.to_dict()) == {"ratio", "upper", "lower", "bound", "non_inferior", "se", "df"}
    # a floor on the long-run variance widens the bound
    wide = non_inferiority(0.95 * np.exp(ar1(rng, 60, 0.3, 0.03)), base, min_inflation=50.0)
    assert wide.upper - wide.ratio > faster.upper - faster.ratio


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"margin": -0.1}, "margin"),
        ({"confidence": 1.0}, "confidence"),
    ],
)
def test_non_inferiority_checks_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        non_inferiority(np.ones(5), np.ones(5), **kwargs)


def test_non_inferiority_checks_series():
    with pytest.raises(ValueError, match="two steps"):
        non_inferiority(np.ones(1), np.ones(5))
    with pytest.raises(ValueError, match="positive"):
        non_inferiority(np.zeros(5), np.ones(5))


def test_clipping_never_pulls_a_slower_plan_toward_the_baseline():
    """Low noise, a long baseline: a pooled clipping centre would clip a uniformly 10% slower
    plan down to the baseline's range and report it within the margin."""
    rng = np.random.default_rng(3)
    base = np.exp(rng.normal(0, 0.003, 120))
    for slower in (1.05, 1.10):
        r = non_inferiority(slower * np.exp(rng.normal(0, 0.003, 30)), base, confidence=0.975)
        assert not r.non_inferior and r.ratio == pytest.approx(slower, rel=0.01)
    spike = np.exp(rng.normal(0, 0.01, 30))
    spike[0] *= 6.0  # a new shape's first step
    assert non_inferiority(spike, base).ratio < 1.02
