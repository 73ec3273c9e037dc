"""One observation window: every rank's own compute time per step, under one plan.

A :class:`Window` is what a driver (the simulator, the Lightning callback, a user's loop)
hands to :meth:`lightning_rex.core.decide.controller.Controller.observe` once every ``K`` steps:
an ``N x K`` array of seconds, the plan the steps ran under and the step range. Times are
each rank's *own* compute time (excluding waits for peers), so that differences between
ranks carry the imbalance signal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Window"]


@dataclass(frozen=True)
class Window:
    """Step-time samples of ``N`` ranks over ``K`` steps, measured under one plan.

    Args:
        times: Seconds, shape ``(N, K)``: ``times[r, k]`` is rank ``r``'s own compute time
            in the window's ``k``-th step. Converted to a float64 array.
        plan: The per-rank micro-batch sizes the steps ran under; ``len(plan) == N``.
        step_start: The first global step in the window.
        step_end: One past the last global step (exclusive); ``step_end > step_start``.
        wall_s: Wall-clock seconds from the first step's start to the last step's end, or
            None when unknown: with ``times`` it gives the time each step spends outside the
            ranks' measured compute (the all-reduce, the loader, the optimizer).

    Raises:
        ValueError: Naming the field, when the shapes disagree or a time is not a finite
            positive number.
    """

    times: np.ndarray
    plan: tuple[int, ...]
    step_start: int
    step_end: int
    wall_s: float | None = None
    _medians: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        times = np.asarray(self.times, dtype=np.float64)
        if times.ndim != 2:
            raise ValueError(f"times must have shape (N, K), got shape {times.shape}")
        n_ranks, n_steps = times.shape
        if n_ranks < 1 or n_steps < 1:
            raise ValueError(f"times must hold at least one rank and one step, got {times.shape}")
        if not np.all(np.isfinite(times)) or np.any(times <= 0):
            raise ValueError("times must be finite and > 0 seconds")
        plan = tuple(int(b) for b in self.plan)
        if len(plan) != n_ranks:
            raise ValueError(f"plan must have one entry per rank: {n_ranks} ranks, got {len(plan)}")
        if any(b < 1 for b in plan):
            raise ValueError(f"plan sizes must be >= 1, got {list(plan)}")
        if int(self.step_end) <= int(self.step_start):
            raise ValueError(
                f"step_end ({self.step_end}) must be greater than step_start ({self.step_start})"
            )
        if self.wall_s is not None and not (math.isfinite(self.wall_s) and self.wall_s >= 0):
            raise ValueError(f"wall_s must be a finite number >= 0 or None, got {self.wall_s!r}")
        times.setflags(write=False)
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "step_start", int(self.step_start))
        object.__setattr__(self, "step_end", int(self.step_end))
        object.__setattr__(self, "_medians", np.median(times, axis=1))

    @property
    def overhead_s(self) -> float | None:
        """Mean seconds per step outside the slowest rank's compute, or None.

        ``wall_s`` over the window's steps minus the mean of :attr:`step_max` (0 when the
        difference is negative: clocks of another resolution).
        """
        if self.wall_s is None:
            return None
        per_step = self.wall_s / (self.step_end - self.step_start)
        return max(0.0, per_step - float(self.step_max.mean()))

    @property
    def n_ranks(self) -> int:
        """The number of ranks ``N``."""
        return int(self.times.shape[0])

    @property
    def n_steps(self) -> int:
        """The number of samples per rank ``K``."""
        return int(self.times.shape[1])

    @property
    def medians(self) -> np.ndarray:
        """Per-rank median compute time in seconds, shape ``(N,)``."""
        return self._medians

    @property
    def step_max(self) -> np.ndarray:
        """The synchronous compute time of each step (the slowest rank's), shape ``(K,)``."""
        return np.asarray(self.times.max(axis=0))

    @classmethod
    def from_lists(
        cls, times: Sequence[Sequence[float]], plan: Sequence[int], step_start: int = 0
    ) -> Window:
        """Build a window from nested lists, with ``step_end = step_start + K``.

        Args:
            times: Per-rank lists of step times in seconds, all of length ``K``.
            plan: The plan the steps ran under.
            step_start: The first global step.

        Returns:
            The validated window.
        """
        arr = np.asarray(times, dtype=np.float64)
        n_steps = arr.shape[1] if arr.ndim == 2 else 0
        return cls(arr, tuple(plan), step_start, step_start + max(n_steps, 1))
