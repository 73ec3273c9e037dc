"""Whether a rank's deviation from the pack ends (or starts) inside a window.

:func:`ending_p_value` tests, for some ranks, whether their excess over the pack changes
inside a window (a straggler that stopped or started); :func:`effect_drop_z` asks whether a
deviation faded from one window to another. The persistence rule
(:mod:`lightning_rex.core.stats.persistence`) vetoes transients with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from lightning_rex.core.stats.significance import variance_inflation

__all__ = ["effect_drop_z", "ending_p_value"]


def ending_p_value(
    times: np.ndarray, ranks: Sequence[int], *, slower: bool | Sequence[bool] = True
) -> np.ndarray:
    """Evidence that some ranks' deviation from the pack *ends* inside the window.

    Each rank's excess over the pack, ``log t[rank, k] - median_s log t[s, k]`` per step, is
    split at a third, a half and two thirds of the window; at each split a one-sided U test
    (ESS corrected like :func:`imbalance_test`) asks whether the part before is slower (or
    faster, ``slower=False``) than the part after. A straggler that stopped inside the window
    gives a small p-value; a persistent imbalance does not. The autocorrelation is estimated
    from the ranks *not* examined, since a change point inside a rank's own series would
    masquerade as strong autocorrelation and hide itself (and ranks examined together, a
    device kind that slowed at once, would hide each other). Vectorised over ``ranks``.

    Args:
        times: The window, shape ``(N, K)``.
        ranks: The ranks to examine.
        slower: Direction of the deviation being checked: one for all, or one per examined
            rank.

    Returns:
        Per examined rank, the Bonferroni-adjusted smallest p-value over the splits (all 1.0
        when ``K < 6``).
    """
    idx = np.asarray(list(ranks), dtype=np.int64)
    log_times = np.log(np.asarray(times, dtype=np.float64))
    steps = log_times.shape[1]
    if steps < 6 or idx.size == 0:
        return np.ones(idx.size)
    sign = np.where(np.broadcast_to(np.asarray(slower, dtype=bool), idx.shape), 1.0, -1.0)
    excess_ranks = stats.rankdata(
        sign[:, None] * (log_times[idx] - np.median(log_times, axis=0)), axis=1
    )
    ref = np.delete(log_times, idx, axis=0)
    if ref.shape[0] < 2:
        ref = log_times
    inflation = variance_inflation(stats.rankdata(ref.ravel()).reshape(ref.shape))
    splits = sorted({steps // 3, steps // 2, (2 * steps) // 3})
    best = np.ones(idx.size)
    for split in splits:
        n_before, n_after = split, steps - split
        u_stat = excess_ranks[:, :split].sum(axis=1) - n_before * (n_before + 1) / 2.0
        std = np.sqrt(n_before * n_after * (steps + 1) / 12.0 * inflation)
        best = np.minimum(best, stats.norm.sf((u_stat - n_before * n_after / 2.0 - 0.5) / std))
    return np.asarray(np.minimum(1.0, best * len(splits)))


def effect_drop_z(windows: Sequence[np.ndarray], *, slower: bool = True) -> np.ndarray:
    """How far each rank's deviation dropped from the first to the last of some windows.

    Per window, every rank's median excess over the pack (``log t - median over ranks``) is
    taken; each rank's drop from the first window to the last is standardised by the spread
    of the drop over all ranks (median and median absolute deviation), its null distribution.
    A persistent change keeps its size (``z`` near 0); a straggler that hit the first window
    hard and the last one only by chance shows a large ``z``.

    Args:
        windows: Two or more windows' times, each ``(N, K)``, oldest first.
        slower: Direction of the deviation (False for ranks that are faster).

    Returns:
        The standardised drop per rank, shape ``(N,)``; zeros with fewer than 3 ranks or 2
        windows.
    """
    num_ranks = windows[0].shape[0]
    if len(windows) < 2 or num_ranks < 3:
        return np.zeros(num_ranks)
    meds = []
    for window in (windows[0], windows[-1]):
        log_window = np.log(np.asarray(window, dtype=np.float64))
        meds.append(np.median(log_window - np.median(log_window, axis=0, keepdims=True), axis=1))
    drop = meds[0] - meds[1]
    if not slower:
        drop = -drop
    center = float(np.median(drop))
    spread = 1.4826 * float(np.median(np.abs(drop - center)))
    return np.asarray((drop - center) / max(spread, 1e-12))
