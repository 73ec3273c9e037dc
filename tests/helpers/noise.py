"""Seeded step-time noise for the core's statistical tests."""

import numpy as np


def ar1_lognormal(rng, n, k, cv, rho):
    """``(n, k)`` multiplicative noise: lognormal with CV ``cv``, AR(1) ``rho`` along steps."""
    s = np.sqrt(np.log1p(cv * cv))
    x = np.empty((n, k))
    x[:, 0] = rng.standard_normal(n) * s
    e = rng.standard_normal((n, k)) * s * np.sqrt(1 - rho * rho)
    for j in range(1, k):
        x[:, j] = rho * x[:, j - 1] + e[:, j]
    return np.exp(x - s * s / 2)
