"""Non-inferiority of a new plan: keep it only when the data show it is not materially slower.

After a change, the synchronous step times under the new plan (one window) are compared with
a baseline measured under the old plan. The statistic is the difference of the mean log step
times, ``d = mean(log new) - mean(log base)`` (the log of the ratio of geometric means),
after single-step outliers are clipped (a new shape's first step, stalls: each series at its
own median plus or minus four robust standard deviations), with a standard error from each
series' long-run variance (Newey-West, Bartlett weights, Andrews' plug-in bandwidth),
optionally floored by a factor from the windows before, since one window cannot see slow
autocorrelation. The new plan is **non-inferior** when the one-sided upper confidence bound

    d + t_{confidence, df} * se  <=  log(1 + margin)

holds: the data show, at the configured confidence, that it is not slower by more than the
margin. Otherwise it is rolled back. This is the test of a non-inferiority trial (Wellek,
*Testing Statistical Hypotheses of Equivalence and Noninferiority*, 2nd ed., 2010, ch. 2),
not "roll back when significantly slower", which keeps a truly 5% slower plan most of the
time when the noise is large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

__all__ = ["NonInferiority", "long_run_variance", "non_inferiority"]


def long_run_variance(x: np.ndarray, bandwidth: int | None = None) -> float:
    """Newey-West (Bartlett kernel) long-run variance of a series.

    Args:
        x: The series, shape ``(K,)``.
        bandwidth: The largest lag; when None, Andrews' (1991) plug-in for an AR(1)
            approximation, ``ceil(1.1447 (a K)^(1/3))`` with
            ``a = 4 rho^2 / ((1 - rho)^2 (1 + rho)^2)`` and the lag-1 autocorrelation
            ``rho`` clipped to ``[0, 0.9]``.

    Returns:
        ``gamma_0 + 2 sum_{j<=L} (1 - j / (L + 1)) gamma_j``, at least ``gamma_0`` (the
        variance), 0 for fewer than two samples.
    """
    series = np.asarray(x, dtype=np.float64)
    length = series.size
    if length < 2:
        return 0.0
    centred = series - series.mean()
    gamma0 = float(centred @ centred) / length
    if gamma0 <= 0:
        return 0.0
    if bandwidth is None:
        rho = min(0.9, max(0.0, float(centred[1:] @ centred[:-1]) / length / gamma0))
        a = 4.0 * rho * rho / ((1.0 - rho) ** 2 * (1.0 + rho) ** 2)
        bandwidth = math.ceil(1.1447 * (a * length) ** (1.0 / 3.0))
    lag = max(0, min(int(bandwidth), length - 1))
    variance = gamma0
    for j in range(1, lag + 1):
        variance += 2.0 * (1.0 - j / (lag + 1)) * float(centred[j:] @ centred[:-j]) / length
    return max(variance, gamma0)


def _winsorise(*series: np.ndarray, width: float = 4.0) -> list[np.ndarray]:
    """Clip each series at its own median +- ``width`` robust standard deviations.

    The first step under a new shape carries its one-off cost (allocation, autotuning,
    compilation: 0.5 s on a 0.1 s step in the simulator's GPU presets), and stalls hit single
    steps; either would move a 30-step mean by several percent. Clipping them keeps the
    comparison about the plan's steady speed. Each series is clipped around itself, so the
    clipping can never pull one series toward the other (a pooled centre would clip a
    uniformly slower plan down to the baseline's range when the noise is small).
    """
    out = []
    for values in series:
        center = float(np.median(values))
        spread = 1.4826 * float(np.median(np.abs(values - center)))
        out.append(
            values
            if spread <= 0
            else np.clip(values, center - width * spread, center + width * spread)
        )
    return out


@dataclass(frozen=True)
class NonInferiority:
    """The outcome of :func:`non_inferiority`.

    Attributes:
        ratio: ``exp(d)``, the new plan's geometric-mean step time over the baseline's.
        upper: The upper confidence bound of the ratio.
        lower: The lower confidence bound of the ratio: above ``bound``, the new plan is
            shown to be inferior.
        bound: ``1 + margin``.
        non_inferior: ``upper <= bound``: keep the new plan.
        se: Standard error of ``d``.
        df: Degrees of freedom of the ``t`` quantile.
    """

    ratio: float
    upper: float
    lower: float
    bound: float
    non_inferior: bool
    se: float
    df: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "ratio": self.ratio,
            "upper": self.upper,
            "lower": self.lower,
            "bound": self.bound,
            "non_inferior": self.non_inferior,
            "se": self.se,
            "df": self.df,
        }


def non_inferiority(
    new: np.ndarray,
    base: np.ndarray,
    *,
    margin: float = 0.02,
    confidence: float = 0.95,
    min_inflation: float = 1.0,
) -> NonInferiority:
    """Is the new plan's step time shown to be at most ``1 + margin`` times the baseline's?

    Args:
        new: Per-step synchronous times under the new plan, seconds, shape ``(K,)``.
        base: Per-step synchronous times under the old plan (the baseline), shape ``(M,)``.
        margin: The non-inferiority margin (0.02: not more than 2% slower).
        confidence: One-sided confidence of the upper bound.
        min_inflation: A floor under each series' long-run variance factor (its long-run
            variance over its variance), from earlier windows.

    Returns:
        The :class:`NonInferiority` verdict.

    Raises:
        ValueError: If ``margin < 0``, ``confidence`` is not in (0, 1), or a series has fewer
            than two samples or a non-positive time.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    new_times = np.asarray(new, dtype=np.float64).ravel()
    base_times = np.asarray(base, dtype=np.float64).ravel()
    if new_times.size < 2 or base_times.size < 2:
        raise ValueError("each series needs at least two steps")
    if new_times.min() <= 0 or base_times.min() <= 0:
        raise ValueError("step times must be positive")
    log_new, log_base = _winsorise(np.log(new_times), np.log(base_times))
    log_ratio = float(log_new.mean() - log_base.mean())
    var_new = max(long_run_variance(log_new), float(log_new.var()) * min_inflation) / new_times.size
    var_base = (
        max(long_run_variance(log_base), float(log_base.var()) * min_inflation) / base_times.size
    )
    std_err = math.sqrt(max(var_new + var_base, 1e-300))
    # Welch-Satterthwaite degrees of freedom
    dof = (var_new + var_base) ** 2 / (
        var_new * var_new / max(new_times.size - 1, 1)
        + var_base * var_base / max(base_times.size - 1, 1)
        + 1e-300
    )
    t_quantile = float(stats.t.ppf(confidence, max(dof, 1.0)))
    upper = log_ratio + t_quantile * std_err
    bound = 1.0 + float(margin)
    return NonInferiority(
        ratio=math.exp(log_ratio),
        upper=math.exp(upper),
        lower=math.exp(log_ratio - t_quantile * std_err),
        bound=bound,
        non_inferior=bool(upper <= math.log(bound)),
        se=std_err,
        df=float(dof),
    )
