"""Whether a fit's first steps are at speed: the test that ends an adaptive warm-up.

The first steps of a fit are slow for reasons that are not a rank's speed: lazy
initialisation, the caching allocator growing, cuDNN autotuning, ``torch.compile``. A fixed
warm-up count either wastes steps (the first plan comes late, and every step before it
runs at the even split) or lets a long transient into the first look, where it reads as an
imbalance. :func:`warming_ranks` looks at a gathered block of steps, every rank's, and asks
of each rank whether the block's first half is slower than its second half by more than
noise: a transient still decaying. The window loop
(:class:`~lightning_rex.driver.loop.WindowDriver`) drops such blocks until none is found,
so the warm-up ends when every rank is at speed, one verdict for all ranks from all their
times (rank 0 judges the gathered block).

The test, per rank ``r`` on the block's log times ``x[r, :K]`` (``h = K // 2``)::

    d_r = min(x[r, :h]) - median(x[r, h:])
    s   = the lower quartile, over ranks, of the pooled within-half SD
    warming_r = d_r > max(tolerance, z * allowance * s * sqrt(1 + pi / (2 (K - h))))

Every step of the first half must be slower than the second half's typical step: a
transient still decaying is, a lone spike (one slow step among fast ones) is not. ``z`` is
the one-sided normal quantile at ``alpha / N`` (Bonferroni over the ranks, so a cluster of
thousands does not stop on noise). The noise scale ``s`` is pooled over the ranks (its lower
quartile, so a minority of warming ranks, whose halves vary by the transient, does not
inflate it); ``allowance`` (2) widens it for step times' autocorrelation, which a few
consecutive steps understate (``sqrt((1 + rho) / (1 - rho))`` is 1.7 at lag-1 correlation
0.5). At a noise of 10% and 5-step blocks on 8 ranks a first half must run about 1.7x
slower to be found; a transient that decays within noise, or a plateau that spans the
block, is not found (it moves a block's medians little, or cannot be told from a rank's
speed until it ends).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["AUTOCORRELATION_ALLOWANCE", "warming_ranks"]

AUTOCORRELATION_ALLOWANCE = 2.0
"""The factor on the independent-steps standard error of ``d_r`` (module docstring)."""


def warming_ranks(
    times: np.ndarray,
    *,
    tolerance: float = 0.1,
    alpha: float = 0.01,
    allowance: float = AUTOCORRELATION_ALLOWANCE,
) -> np.ndarray:
    """Which ranks' steps are still getting faster over a block (the module's test).

    Args:
        times: Seconds, shape ``(N, K)``: every rank's steps of one block, in step order,
            finite and positive. With ``K < 4`` no rank is found warming.
        tolerance: The smallest slowdown of the first half over the second, in log time,
            that counts (0.1: about 10%); a smaller one is at speed whatever the noise.
        alpha: The chance, over all ranks together, that a block at speed is found warming
            (in ``(0, 1)``).
        allowance: The factor on the standard error for autocorrelation (>= 1).

    Returns:
        A boolean mask, shape ``(N,)``.

    Raises:
        ValueError: For a ``times`` that is not 2-D, or settings outside those ranges.
    """
    if times.ndim != 2:
        raise ValueError(f"times must be (ranks, steps), got shape {times.shape}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not (tolerance >= 0.0 and allowance >= 1.0):
        raise ValueError(f"need tolerance >= 0 and allowance >= 1, got {tolerance}, {allowance}")
    num_ranks, steps = times.shape
    if steps < 4 or num_ranks == 0:
        return np.zeros(num_ranks, dtype=bool)
    log_times = np.log(times)
    half = steps // 2
    first, second = log_times[:, :half], log_times[:, half:]
    drop = first.min(axis=1) - np.median(second, axis=1)
    within = ((first - first.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) + (
        (second - second.mean(axis=1, keepdims=True)) ** 2
    ).sum(axis=1)
    noise = float(np.quantile(np.sqrt(within / (steps - 2)), 0.25))
    z_quantile = float(stats.norm.isf(alpha / num_ranks))
    spread = np.sqrt(1.0 + np.pi / (2.0 * (steps - half)))
    return np.asarray(drop > max(tolerance, z_quantile * allowance * noise * spread), dtype=bool)
