"""From a gathered window's rows to the :class:`~lightning_rex.core.window.Window` a decider sees.

A step whose time is not a finite positive number on some rank (a failed read, a timer that
did not run) is dropped with a warning, on every rank's column alike; the window keeps the
steps every rank measured. Its wall-clock time is kept only when it covers every step of the
window, so that :attr:`~lightning_rex.core.window.Window.overhead_s` compares like with like.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.window import Window

__all__ = ["usable_steps", "window_info", "window_of"]


def usable_steps(times: np.ndarray, steps: Sequence[int], dropped: int) -> tuple[np.ndarray, int]:
    """The steps every rank measured, warning once for the samples that are not usable.

    Args:
        times: Seconds, shape ``(N, K)``.
        steps: The window's global steps, ``K`` of them.
        dropped: Samples dropped before this window (for the warning's running count).

    Returns:
        ``(mask of the usable steps, samples dropped here)``.
    """
    usable = np.isfinite(times) & (times > 0)
    bad = int((~usable).sum())
    if bad:
        column, rank = np.argwhere((~usable).T)[0]  # the earliest step first
        warnings.warn(
            f"lightning-rex: {bad} step-time sample(s) were not finite positive seconds and "
            f"were dropped with their steps (first: rank {int(rank)}, step {steps[column]}, "
            f"{times[rank, column]!r}); {dropped + bad} dropped so far",
            RuntimeWarning,
            stacklevel=3,
        )
    return usable.all(axis=0), bad


def window_of(
    times: np.ndarray, plan: Plan, steps: Sequence[int], good: np.ndarray, wall: float
) -> Window:
    """The window of the usable steps, with its wall-clock time when it covers them all.

    Args:
        times: Seconds, shape ``(N, K)``.
        plan: The plan the steps ran under.
        steps: The window's global steps.
        good: The usable steps (:func:`usable_steps`; at least one).
        wall: Wall-clock seconds of the whole window (NaN when unknown).

    Returns:
        The window.
    """
    kept = [s for s, g in zip(steps, good) if g]
    whole = bool(good.all()) and math.isfinite(wall) and wall >= 0
    return Window(times[:, good], plan, kept[0], steps[-1] + 1, wall if whole else None)


def window_info(
    telemetry: Any, samples: int, wall: float, dropped: int, warmup: int | None
) -> dict[str, Any]:
    """What a window's record holds beside the window itself.

    Args:
        telemetry: Every rank's telemetry sample, or None.
        samples: The window's global samples (its steps times the plan's sum).
        wall: Its wall-clock seconds (NaN when it does not cover every step).
        dropped: Samples dropped from it.
        warmup: The warm-up's steps, on the first window after it (else None).

    Returns:
        The record's ``telemetry``, ``window_samples``, ``window_wall_s``,
        ``global_samples_per_s``, ``dropped_samples`` and ``warmup_steps``.
    """
    return {
        "telemetry": telemetry,
        "window_samples": samples,
        "window_wall_s": None if math.isnan(wall) else wall,
        "global_samples_per_s": samples / wall if wall > 0 else None,
        "dropped_samples": dropped,
        "warmup_steps": warmup,
    }
