"""Accumulation passes: how a rank runs a micro-batch larger than its memory allows.

A rank's *pass cap* ``c`` is the largest micro-batch it runs in one forward/backward pass
(what fits in its memory). A plan may still give it ``b > c`` samples: it then runs them as
``k = ceil(b / c)`` accumulation passes, as even as possible (``b = 20, c = 8``: passes of
7, 7 and 6), and takes its one optimizer step per global step like every other rank. The
user's ``max_micro_batch_size`` stays a hard bound (:class:`~lightning_rex.core.plans.
schedule.SizeBounds`); a pass cap is soft: it prices a size, it does not forbid it.

This module is the one home of that rule. :func:`passes` gives the pass sizes (the Lightning
side splits a rank's batch with it, so both sides agree); :func:`pass_split` is the same rule
for arrays of sizes; :func:`pass_total` turns single-pass times into a step's time (the time
model's predictions and the simulator's engine both use it); :func:`per_pass` turns a
measured step time into a single-pass observation (what the time model learns from).

With ``q = b // k`` and ``m = b mod k``, the passes are ``m`` of ``q + 1`` samples and
``k - m`` of ``q``: the step takes ``m t1(q + 1) + (k - m) t1(q)`` for a single-pass time
``t1``. No cap (None, or 0 in arrays) is one pass of ``b``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["cap_array", "pass_count", "pass_split", "pass_total", "passes", "per_pass"]


def _check(size: int, cap: int | None) -> None:
    if int(size) != size or size < 0:
        raise ValueError(f"size must be an int >= 0, got {size!r}")
    if cap is not None and (int(cap) != cap or cap < 1):
        raise ValueError(f"cap must be None or an int >= 1, got {cap!r}")


def pass_count(size: int, cap: int | None) -> int:
    """How many accumulation passes a rank runs ``size`` samples in.

    Args:
        size: The rank's micro-batch (samples per optimizer step), >= 0.
        cap: The largest micro-batch it runs in one pass, or None for no cap.

    Returns:
        ``ceil(size / cap)`` (at least 1), or 1 without a cap.

    Raises:
        ValueError: Naming the argument, for a negative size or a cap below 1.
    """
    _check(size, cap)
    if cap is None or size <= cap:
        return 1
    return -(-int(size) // int(cap))


def passes(size: int, cap: int | None) -> list[int]:
    """The pass sizes of ``size`` samples under a pass cap, as even as possible.

    Args:
        size: The rank's micro-batch (samples per optimizer step), >= 0.
        cap: The largest micro-batch it runs in one pass, or None for no cap.

    Returns:
        ``pass_count(size, cap)`` sizes summing to ``size``, each at most ``cap``, differing
        by at most one, the larger first (``passes(20, 8) == [7, 7, 6]``); ``[size]`` when
        it fits in one pass.

    Raises:
        ValueError: Naming the argument, for a negative size or a cap below 1.
    """
    k = pass_count(size, cap)
    q, m = divmod(int(size), k)
    return [q + 1] * m + [q] * (k - m)


def cap_array(caps: Sequence[int | None] | None, world_size: int) -> np.ndarray | None:
    """Per-rank pass caps as an int array (0 for no cap), or None when no rank has one.

    Args:
        caps: Per-rank caps (None entries for none), or None.
        world_size: The number of ranks.

    Returns:
        Shape ``(world_size,)`` int64, or None when nothing is capped.

    Raises:
        ValueError: For the wrong number of caps or a cap below 1.
    """
    if caps is None:
        return None
    if len(caps) != world_size:
        raise ValueError(f"pass_caps must have {world_size} entries, got {len(caps)}")
    for cap in caps:
        _check(0, cap)
    out = np.array([0 if c is None else int(c) for c in caps], dtype=np.int64)
    return out if bool((out > 0).any()) else None


def pass_split(
    sizes: npt.ArrayLike, caps: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`passes` for arrays: the count, the smaller pass size and how many are larger.

    Args:
        sizes: Micro-batch sizes (integers >= 0), any shape.
        caps: Pass caps broadcastable with ``sizes`` (0 or less: no cap).

    Returns:
        ``(k, q, m)`` of the broadcast shape: ``k`` passes, ``m`` of ``q + 1`` samples and
        ``k - m`` of ``q``.
    """
    b = np.asarray(sizes, dtype=np.int64)
    c = np.asarray(caps, dtype=np.int64)
    k = np.where((c > 0) & (b > c), -(-b // np.maximum(c, 1)), 1)
    q, m = np.divmod(b, k)
    return k, q, m


def pass_total(
    k: npt.ArrayLike, m: npt.ArrayLike, at_q: npt.ArrayLike, at_q1: npt.ArrayLike
) -> np.ndarray:
    """A step's time from its passes' single-pass times: ``m t1(q + 1) + (k - m) t1(q)``.

    Args:
        k: Pass counts (from :func:`pass_split`).
        m: How many passes have ``q + 1`` samples.
        at_q: Single-pass times at ``q`` samples.
        at_q1: Single-pass times at ``q + 1`` samples (read only where ``m > 0``).

    Returns:
        The step times, of the broadcast shape.
    """
    k_arr, m_arr = np.asarray(k), np.asarray(m)
    single = np.asarray(at_q, dtype=np.float64)
    if not bool((k_arr > 1).any()):
        return single  # every size in one pass: the single-pass times themselves
    extra = np.where(m_arr > 0, np.asarray(at_q1, dtype=np.float64), 0.0)
    return np.asarray((k_arr - m_arr) * single + m_arr * extra, dtype=np.float64)


def per_pass(
    sizes: npt.ArrayLike, times: npt.ArrayLike, caps: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """A measured step as one pass: ``(b / k, T / k)`` for ``b`` samples in ``k`` passes.

    Exact for any single-pass time affine in its size (``k`` passes of ``a + s x`` sum to
    ``k a + s b`` whatever the split), so what the time model learns from an accumulating
    rank is its single-pass curve; elsewhere it is the curve at the mean pass size.

    Args:
        sizes: Micro-batch sizes, any shape.
        times: Their measured step times, same shape.
        caps: Pass caps broadcastable with ``sizes`` (0 or less: no cap).

    Returns:
        ``(pass sizes, pass times)`` as floats, of the broadcast shape.
    """
    k = pass_split(sizes, caps)[0]
    return np.asarray(sizes, dtype=np.float64) / k, np.asarray(times, dtype=np.float64) / k
