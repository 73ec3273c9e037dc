"""Figures over a seed set: per-policy aggregates and paired ratios with 95% intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

__all__ = ["aggregate", "mean_interval", "memory_summary", "paired_ratio"]


def paired_ratio(
    a: Sequence[float], b: Sequence[float]
) -> tuple[float, float | None, float | None]:
    """The ratio of ``a`` to ``b`` paired by seed: geometric mean and a 95% t-interval.

    The per-seed log ratios ``log(a_s / b_s)`` are averaged, and the interval is Student's
    t on their mean (the seeds are independent, the pairs share their noise), mapped back
    with ``exp``.

    Args:
        a: One policy's figure per seed (> 0).
        b: The other's, on the same seeds (> 0).

    Returns:
        ``(ratio, low, high)``; the interval is None for a single seed.

    Raises:
        ValueError: If the lengths differ or a figure is not positive.
    """
    first, second = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if first.shape != second.shape or first.size == 0:
        raise ValueError(
            f"paired figures need equal, non-zero lengths, got {first.size} and {second.size}"
        )
    if not (np.all(first > 0) and np.all(second > 0)):
        raise ValueError("paired ratios need positive figures")
    logs = np.log(first / second)
    mean_log = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean_log), None, None
    half = float(stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / math.sqrt(logs.size))
    return math.exp(mean_log), math.exp(mean_log - half), math.exp(mean_log + half)


def mean_interval(x: Sequence[float]) -> tuple[float, float | None]:
    """The arithmetic mean of per-seed figures and the half-width of its 95% t-interval.

    Args:
        x: One figure per seed.

    Returns:
        ``(mean, half-width)``; the half-width is None for a single seed.
    """
    values = np.asarray(x, dtype=np.float64)
    if values.size < 2:
        return float(values.mean()), None
    return float(values.mean()), float(
        stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    )


def aggregate(rs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """One policy's figures over a seed set.

    Args:
        rs: The policy's :meth:`SimResult.to_dict` per seed.
        steps: The run length (for false rescales per 10,000 steps).

    Returns:
        Mean and minimum efficiency (whole run and steady state), mean throughput, the
        largest time to 90%, mean rescales, plan changes, rollbacks and shape-change seconds,
        false rescales per 10,000 steps, the share of events acted on within 3 windows, and
        the median p50 and largest p99 decision latency.
    """
    eff = np.array([r["efficiency"] for r in rs])
    t90 = [r["time_to_90pct_windows"] for r in rs]
    delays = [d for r in rs for d in r["detection_delay_windows"]]
    within3 = [d is not None and d <= 3 for d in delays]
    return {
        "eff_mean": float(eff.mean()),
        "eff_min": float(eff.min()),
        "steady_eff_mean": float(np.mean([r["steady_efficiency"] for r in rs])),
        "steady_eff_min": float(np.min([r["steady_efficiency"] for r in rs])),
        "throughput_mean": float(np.mean([r["throughput"] for r in rs])),
        "t90_max": None if any(t is None for t in t90) else int(max(t90)),
        "rescales_mean": float(np.mean([r["rescales"] for r in rs])),
        "plan_changes_mean": float(np.mean([r["plan_changes"] for r in rs])),
        "shape_change_s_mean": float(np.mean([r["shape_change_s_total"] for r in rs])),
        "rollbacks_mean": float(np.mean([r["rollbacks"] for r in rs])),
        "false_per_10k_steps": float(
            sum(r["false_rescales"] for r in rs) * 1e4 / (steps * len(rs))
        ),
        "events_acted_within_3": float(np.mean(within3)) if within3 else None,
        "decision_ms_p50": float(np.median([r["decision_ms_p50"] for r in rs])),
        "decision_ms_p99": float(np.max([r["decision_ms_p99"] for r in rs])),
    }


def memory_summary(
    per: dict[str, list[dict[str, Any]]], pass_caps: list[int | None] | None
) -> dict[str, Any] | None:
    """Rex's throughput over every other policy's, paired by seed, on a scenario with memory.

    Args:
        per: Each policy's per-seed results (``rex`` among them).
        pass_caps: The scenario's pass caps, or None.

    Returns:
        ``{"pass_caps", "rex_over": {policy: [ratio, low, high]}}`` (the interval None for
        one seed), or None without pass caps or without rex.
    """
    if pass_caps is None or "rex" not in per:
        return None
    rex = [r["throughput"] for r in per["rex"]]
    over = {
        n: list(paired_ratio(rex, [r["throughput"] for r in rs]))
        for n, rs in per.items()
        if n != "rex"
    }
    return {"pass_caps": list(pass_caps), "rex_over": over}
