"""The window a process is gathering: :class:`Gathering` (its steps, samples and warm-up).

A :class:`~lightning_rex.driver.loop.WindowDriver` holds one. Each measured step adds its
hosted ranks' samples (:meth:`Gathering.add`); a plan changing under the window starts it
afresh; a gather takes and clears it. A fresh fit's start sets its warm-up from the
:class:`~lightning_rex.core.window_spec.WindowSpec` (:meth:`Gathering.begin`); a resume on
the same world size restores it from the checkpoint (:meth:`Gathering.restore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.stats.at_speed import warming_ranks
from lightning_rex.core.window_spec import WindowSpec

__all__ = ["Gathering", "as_seconds"]


@dataclass
class Gathering:
    """One process's window in progress.

    Attributes:
        skip_until: The first step that may be measured (the warm-up, or a new plan's first
            step).
        first_look: The next gather is a fresh fit's first look.
        warm_until: Rank 0: the warm-up goes on until a gathered block is at speed, or this
            step; None once it has ended.
        fit_start: A fresh fit's first step, until its first window is taken.
        samples: One sample per measured step (the hosted ranks' seconds, or what the
            driver's ``resolve`` reads).
        steps: The measured steps.
        plan: The plan the window's steps ran under.
        t0: The clock at the window's first step.
        resumed: The window's wall time began in another run (a resumed partial window).
    """

    skip_until: int = 0
    first_look: bool = False
    warm_until: int | None = None
    fit_start: int | None = None
    samples: list[Any] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    plan: Plan | None = None
    t0: float = 0.0
    resumed: bool = False

    def begin(self, step: int, window: WindowSpec, device_keys: Sequence[str]) -> None:
        """A fresh fit's start: its warm-up, and whether its first gather is a first look.

        Args:
            step: The fit's first step.
            window: The window (its ``warmup`` and ``max_warmup``).
            device_keys: Every rank's device identity: with two kinds of two or more ranks
                each, the first gather looks at the kinds early.
        """
        self.skip_until = max(self.skip_until, step + window.warmup)
        self.fit_start = step
        if window.max_warmup > window.warmup:
            self.warm_until = step + window.max_warmup
        kinds = np.unique(list(device_keys), return_counts=True)[1]
        self.first_look = int((kinds >= 2).sum()) >= 2

    def restore(self, saved: dict[str, Any], rank: int, hosted: int, world_size: int) -> None:
        """Continue a checkpoint's window loop exactly (a resume on the same world size).

        Args:
            saved: The checked loop state (:func:`~lightning_rex.driver.checkpoint.check_state`).
            rank: This process's first hosted rank.
            hosted: The ranks this process hosts.
            world_size: The number of ranks.
        """
        self.skip_until = saved["skip_until"]
        self.steps = list(saved["steps"])
        self.plan = saved["window_plan"]
        rows = np.asarray(saved["partial"], dtype=np.float64).reshape(world_size, -1)
        self.samples = [rows[rank : rank + hosted, j] for j in range(len(self.steps))]
        self.first_look = saved["first_look"]
        self.warm_until, self.fit_start = saved["warm_until"], saved["fit_start"]
        self.resumed = bool(self.steps)

    def add(self, step: int, sample: Any, plan: Plan, since: float) -> None:
        """Take one measured step.

        Args:
            step: The step.
            sample: Its hosted ranks' sample.
            plan: The plan it ran under; another than the window's starts the window afresh.
            since: The clock at the step's start (the window's start, for a first step).
        """
        if self.steps and plan != self.plan:
            self.clear()  # the plan changed under the window
        if not self.steps:
            self.plan, self.t0 = plan, since
            self.resumed = False
        self.samples.append(sample)
        self.steps.append(step)

    def clear(self) -> None:
        """Drop the steps gathered (a gather took them, or a new plan is in force)."""
        self.samples, self.steps = [], []

    def still_warming(self, times: np.ndarray) -> bool:
        """Rank 0 at a gather: whether this block is dropped as part of the warm-up.

        Args:
            times: The block's usable step times, ``(N, K)`` seconds.

        Returns:
            True while some rank's steps are still getting faster
            (:func:`~lightning_rex.core.stats.at_speed.warming_ranks`) and the block ends
            before ``warm_until``; the first block at speed ends the warm-up.
        """
        if self.warm_until is None:
            return False
        if self.steps[-1] + 1 < self.warm_until and warming_ranks(times).any():
            return True
        self.warm_until = None
        return False

    def take_warmup(self) -> int | None:
        """The steps from a fresh fit's start to its first window (then None).

        Returns:
            The warm-up's length for the first window's record, or None after it.
        """
        warmup = None if self.fit_start is None else self.steps[0] - self.fit_start
        self.fit_start = None
        return warmup


def as_seconds(samples: list[Any]) -> np.ndarray:
    """Samples that are seconds already: ``K`` per-step arrays of hosted ranks, stacked.

    Args:
        samples: One array of the hosted ranks' seconds per step.

    Returns:
        A ``(hosted, K)`` float64 array.
    """
    return np.stack([np.asarray(s, dtype=np.float64).reshape(-1) for s in samples], axis=1)
