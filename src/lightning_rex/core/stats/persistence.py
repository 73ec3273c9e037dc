"""Transient or persistent: which ranks' imbalance has held over the last windows.

A rank is flagged when (a) the windows pooled are imbalanced for it (Holm, ``alpha``, effect
above ``1 + min_effect``), (b) each window on its own points the same way for it (raw
one-sided p below ``consistency``), and (c) the latest window does not show the straggler
ending or starting inside it (:func:`~lightning_rex.core.stats.endings.ending_p_value` at
``ending_alpha``), nor its effect fading from the first window to the last
(:func:`~lightning_rex.core.stats.endings.effect_drop_z`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from lightning_rex.core.stats.endings import effect_drop_z, ending_p_value
from lightning_rex.core.stats.significance import (
    ImbalanceResult,
    holm,
    imbalance_test,
    variance_inflation,
)

__all__ = [
    "COLD_START_LEVEL",
    "T_TEST_MAX_RANKS",
    "cold_start_flagged",
    "cold_start_ranks",
    "kind_test",
    "persistent_ranks",
    "pointing",
    "triggered",
]

COLD_START_LEVEL = 5.0
"""The family-wise level at cold start, as a multiple of ``alpha``."""


T_TEST_MAX_RANKS = 2
"""A cold start also tests single ranks by :func:`kind_test` up to this many ranks.

Two ranks are where the rank test binds hardest: each rank's U counts only its steps against
the other's, so on a 10-step window it cannot reach the cold start's level once any
autocorrelation is estimated, even when one rank is three times slower in every step. With
more ranks it gains power, and the union of both tests no longer holds the cold start's
level: at CV 0.3, AR(1) 0.5 and 10 steps, 600 seeded noise-only windows each, the t test
alone alarms in 2.5% of them at 2 ranks, 6% at 3, 7% at 4 and 10% at 8 (level 5%).
"""


def pointing(sig: ImbalanceResult, consistency: float, min_effect: float) -> np.ndarray:
    """The ranks one window points at on its own, slower or faster.

    Pointing means a raw one-sided p below ``consistency`` and an effect beyond
    ``1 + min_effect``.

    Args:
        sig: The window's test.
        consistency: The raw p-value a window must reach on its own.
        min_effect: The practical effect threshold.

    Returns:
        A boolean mask over ranks.
    """
    thr = 1.0 + min_effect
    slow = (sig.raw_p_values < consistency) & (sig.effect > thr)
    fast = (sig.raw_p_values_fast < consistency) & (sig.effect < 1.0 / thr)
    return np.asarray(slow | fast)


def cold_start_ranks(sig: ImbalanceResult, alpha: float, min_effect: float) -> list[int]:
    """The ranks imbalanced in a run's first window, at a cold start's level.

    The initial plan is a guess with no evidence for it, so there is no status quo for
    persistence to protect; and a rank-against-the-rest test has little power when half the
    ranks are slow (each slow rank sits in the middle of the others: on an even split of 8
    A100s and 8 V100s, Holm p-values of 0.01-0.05 for effects of 1.6x). So one window
    suffices, at the family-wise level ``COLD_START_LEVEL * alpha``. What it proposes must
    still be predicted ``min_gain`` faster and pass validation.

    Args:
        sig: The first window's test.
        alpha: The family-wise level of a steady window.
        min_effect: The practical effect threshold.

    Returns:
        The flagged ranks, sorted.
    """
    level, thr = COLD_START_LEVEL * alpha, 1.0 + min_effect
    hit = (sig.p_values < level) & (sig.effect > thr) | (sig.p_values_fast < level) & (
        sig.effect < 1.0 / thr
    )
    return [int(r) for r in np.flatnonzero(hit)]


def cold_start_flagged(
    times: np.ndarray,
    sig: ImbalanceResult,
    labels: np.ndarray | None,
    alpha: float,
    min_effect: float,
    min_inflation: float = 1.0,
    rank_test: bool = True,
) -> list[int]:
    """The ranks a cold start acts on: imbalanced ranks, or every rank of an imbalanced kind.

    When two device kinds or more have two ranks or more each, the kinds are tested against
    each other too (:func:`kind_test`): a kind's many ranks give far more evidence than one
    rank tested against a rest that holds its own kind, and a first look of a few steps is
    too short for a rank test to reach the cold start's level on any effect. With at most
    :data:`T_TEST_MAX_RANKS` ranks, every rank is also tested as a kind of its own.

    Args:
        times: The window's times, ``(N, K)``.
        sig: The window's per-rank test.
        labels: Each rank's device group (equal labels, one kind), or None.
        alpha: The family-wise level of a steady window.
        min_effect: The practical effect threshold.
        min_inflation: The long-run variance floor from earlier windows.
        rank_test: Whether single ranks count (False: only kinds, for a look too short for
            the rank test's autocorrelation estimate).

    Returns:
        The flagged ranks, sorted.
    """
    flagged: set[int] = set()
    if rank_test:
        flagged.update(cold_start_ranks(sig, alpha, min_effect))
        if 2 <= times.shape[0] <= T_TEST_MAX_RANKS:
            # each rank a kind of its own: with few ranks a rank's U is bounded by its few
            # steps, and once any autocorrelation is estimated the rank test cannot reach
            # the cold start's level (two ranks, 10 steps, one three times slower in every
            # step: p 0.1-0.4); the t test on log times keeps the magnitude it discards
            hit = kind_test(times, COLD_START_LEVEL * alpha, min_effect, min_inflation)
            flagged.update(int(r) for r in np.flatnonzero(hit))
    if labels is not None:
        kinds, counts = np.unique(labels, return_counts=True)
        kinds = kinds[counts >= 2]
        if kinds.size >= 2:
            series = np.stack([np.median(times[labels == k], axis=0) for k in kinds])
            hit = kind_test(series, COLD_START_LEVEL * alpha, min_effect, min_inflation)
            for kind_index in np.flatnonzero(hit):
                flagged.update(int(r) for r in np.flatnonzero(labels == kinds[kind_index]))
    return sorted(flagged)


def kind_test(
    series: np.ndarray, level: float, min_effect: float, min_inflation: float = 1.0
) -> np.ndarray:
    """Device kinds slower or faster than the others, from their per-step median times.

    Each kind's mean log time over the steps is compared with the median of the other
    kinds' means by a Student t test whose variance pools every kind's step-to-step
    spread, inflated for autocorrelation like :func:`~lightning_rex.core.stats.significance.
    imbalance_test` (the median of the others counts as ``pi / 2`` of a mean of that many
    kinds). Holm over both directions of every kind, at ``level``, and an effect beyond
    ``1 + min_effect``. On a few steps a t test keeps the power that a rank test loses to
    its discreteness and its inflation estimate.

    Args:
        series: Per-kind per-step median times, ``(G, K)``, ``G >= 2``.
        level: The family-wise level.
        min_effect: The practical effect threshold.
        min_inflation: A floor under the autocorrelation factor.

    Returns:
        A boolean mask over kinds.
    """
    log_times = np.log(np.asarray(series, dtype=np.float64))
    num_kinds, steps = log_times.shape
    if steps < 2:
        return np.zeros(num_kinds, dtype=bool)
    means = log_times.mean(axis=1)
    others = np.array([np.median(np.delete(means, i)) for i in range(num_kinds)])
    dof = num_kinds * (steps - 1)
    pooled_var = float(((log_times - means[:, None]) ** 2).sum()) / dof
    ranks = stats.rankdata(log_times - means[:, None]).reshape(num_kinds, steps)
    inflation = max(variance_inflation(ranks), float(min_inflation))
    std_err = np.sqrt(
        max(pooled_var, 1e-300) * inflation / steps * (1.0 + np.pi / (2.0 * (num_kinds - 1)))
    )
    t_stat = (means - others) / std_err
    adj = holm(np.concatenate([stats.t.sf(t_stat, dof), stats.t.sf(-t_stat, dof)]))
    thr = np.log1p(min_effect)
    slow = (adj[:num_kinds] < level) & (means - others > thr)
    fast = (adj[num_kinds:] < level) & (others - means > thr)
    return np.asarray(slow | fast)


def persistent_ranks(
    wins: Sequence[np.ndarray],
    *,
    alpha: float,
    min_effect: float,
    consistency: float,
    ending_alpha: float,
    floors: tuple[float, float] = (1.0, 1.0),
) -> list[int]:
    """The ranks persistently slower or faster over some consecutive windows.

    Args:
        wins: The windows' times, each ``(N, K)``, oldest first.
        alpha: Family-wise level of the pooled test.
        min_effect: Practical effect threshold on the median ratio.
        consistency: Raw one-sided p-value every window must reach on its own.
        ending_alpha: Level of the veto for a straggler that ends or starts in the latest
            window.
        floors: Long-run variance factors from earlier windows
            (:class:`~lightning_rex.core.stats.significance.WindowHistory`): for one window, and for
            the windows pooled.

    Returns:
        The flagged ranks, sorted.
    """
    f_one, f_span = floors
    pooled = imbalance_test(
        np.concatenate(list(wins), axis=1),
        alpha=alpha,
        min_effect=min_effect,
        min_inflation=f_span if len(wins) > 1 else f_one,
    )
    each = [
        imbalance_test(w, alpha=alpha, min_effect=min_effect, min_inflation=f_one) for w in wins
    ]
    thr = 1.0 + min_effect
    out: list[int] = []
    for slow in (True, False):
        cand = pooled.slow_ranks if slow else pooled.fast_ranks
        if slow:
            consistent = [
                r
                for r in cand
                if all(e.raw_p_values[r] < consistency and e.effect[r] > thr for e in each)
            ]
        else:
            consistent = [
                r
                for r in cand
                if all(e.raw_p_values_fast[r] < consistency and e.effect[r] < 1 / thr for e in each)
            ]
        if not consistent:
            continue
        # A straggler that stops inside the latest window, or whose effect faded from the
        # first window to the last, is transient; one that starts inside the latest window
        # is a new episode, not the continuation of the earlier ones.
        stops = ending_p_value(wins[-1], consistent, slower=slow) < ending_alpha
        starts = ending_p_value(wins[-1], consistent, slower=not slow) < ending_alpha
        faded = effect_drop_z(list(wins), slower=slow)[consistent] > stats.norm.isf(consistency)
        out += [r for r, v in zip(consistent, stops | starts | faded) if not v]
    return sorted(out)


def triggered(
    recent: Sequence[np.ndarray],
    sig: ImbalanceResult,
    *,
    cold: bool,
    persistence: int,
    alpha: float,
    min_effect: float,
    consistency: float,
    ending_alpha: float,
    floors: tuple[float, float],
    labels: np.ndarray | None = None,
) -> tuple[list[int], str]:
    """The ranks whose imbalance calls for a proposal after a steady window, and why.

    Args:
        recent: The last steady windows' times, oldest first, the latest last.
        sig: The latest window's test.
        cold: Cold start (the initial plan is a guess): one window counts, at the cold
            start level (:func:`cold_start_ranks`).
        persistence: Windows the imbalance must hold otherwise (:func:`persistent_ranks`).
        alpha: The family-wise level.
        min_effect: The practical effect threshold.
        consistency: The raw p-value each window must reach on its own.
        ending_alpha: The level of the veto for a straggler ending or starting inside the
            latest window.
        floors: Long-run variance factors from earlier windows.
        labels: Each rank's device group, or None (a cold start also tests kinds).

    Returns:
        ``(flagged ranks, reason)``: no ranks (a hold) with the reason for holding, or the
        ranks with the reason for proposing.
    """
    held = "imbalanced" if sig.imbalanced else "balanced"
    need = 1 if cold else persistence
    if len(recent) < need:
        return [], held
    transient = "transient imbalance" if sig.imbalanced else "balanced"
    # persistent_ranks flags a rank only if every window, this one included, points at it
    # on its own: when this window points at no rank, skip the pooled tests (same result,
    # and most windows of a balanced run end here cheaply)
    if cold:
        flagged = cold_start_flagged(recent[-1], sig, labels, alpha, min_effect, floors[0])
        why = f"imbalance at cold start on ranks {flagged[:8]}"
        return flagged, why if flagged else "balanced at cold start"
    if not bool(pointing(sig, consistency, min_effect).any()):
        return [], transient
    flagged = persistent_ranks(
        list(recent[-need:]),
        alpha=alpha,
        min_effect=min_effect,
        consistency=consistency,
        ending_alpha=ending_alpha,
        floors=floors,
    )
    return flagged, f"persistent imbalance on ranks {flagged[:8]}" if flagged else transient
