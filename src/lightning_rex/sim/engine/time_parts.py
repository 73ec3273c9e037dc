"""Where a run's time to the target goes: the goodput limit and what each policy adds to it.

A global batch policy's time to the target (:func:`~lightning_rex.sim.engine.goodput.run_goodput`)
is the sum of its steps' times. :func:`time_parts` splits that sum into parts that say what
each second paid for, so that two policies' times can be compared part by part (docs:
batch_scaling.md, "where rex's remaining time goes"):

* ``limit_s``: the noise-free time the goodput-optimal batch, at the oracle's split, would
  take for the progress the run made: ``sum_i dp_i / G*(p_i)``, with ``dp_i`` step ``i``'s
  progress and ``G*(p)`` the best noise-free goodput over a grid of batches at progress ``p``
  (:class:`LimitCurve`). It is nearly the same for every run of a workload (the target);
* the batch choice's *regret*: each step's noise-free time at the oracle's split for the batch
  it ran, less ``dp_i / G*(p_i)``; split into ``start_s`` (at the first batch, before the
  first change, when there was one), ``trials_s`` (batches left for the one before them: a
  rolled-back trial, or a policy's return) and ``kept_s`` (the others);
* ``shape_s``: one-off steps, those longer than :data:`ONE_OFF` times their batch's median
  step (a new micro-batch shape's cost, 0.5 s on the GPU presets), less that median;
* ``steps_s``: the rest: what the measured steps cost over the noise-free ones at the oracle's
  split (the wait for the slowest noisy rank, and the split's own imperfection).

The parts sum to the run's time exactly. The wait for the slowest noisy rank is in every
policy's ``steps_s``, the adaptive oracle's too; a difference of two policies' ``steps_s`` is
their splits' difference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lightning_rex.sim.policies.builtin import oracle_plan, oracle_step_s
from lightning_rex.sim.scenarios.scenario import Scenario
from lightning_rex.sim.scenarios.workload import Workload

__all__ = ["ONE_OFF", "PARTS", "LimitCurve", "time_parts"]

ONE_OFF = 4.0
"""A step longer than this many times its batch's median step is a one-off (a new shape)."""

PARTS = ("limit_s", "start_s", "trials_s", "kept_s", "shape_s", "steps_s")
"""The parts of :func:`time_parts`, in order (module docstring)."""


@dataclass(frozen=True)
class LimitCurve:
    """Noise-free step times of the oracle's split over a grid of global batches.

    Attributes:
        batches: The grid, ascending.
        step_s: The oracle's plan's noise-free synchronous step time at each, seconds.
    """

    batches: np.ndarray
    step_s: np.ndarray

    @classmethod
    def of(cls, s: Scenario, batches: Sequence[int]) -> LimitCurve:
        """The curve of ``s`` over ``batches`` (the oracle's plan for each, timed at step 0).

        Args:
            s: The scenario.
            batches: The global batches.

        Returns:
            The curve.
        """
        grid = np.unique(np.asarray(batches, dtype=np.int64))
        return cls(grid, oracle_step_s(s, [oracle_plan(s, int(b)) for b in grid]))

    def best_rate(self, workload: Workload, progress: float) -> float:
        """The best noise-free goodput over the grid at ``progress`` (progress per second).

        Args:
            workload: The workload.
            progress: The progress so far.

        Returns:
            ``max_B B E(B) / t(B)``.
        """
        return float(np.max(workload.goodput(self.batches, self.step_s, progress)))


def _segments(sizes: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first step, end step, batch)`` of each run of one batch."""
    starts = [0, *(np.flatnonzero(np.diff(sizes)) + 1).tolist(), sizes.size]
    return [(a, c, int(sizes[a])) for a, c in itertools.pairwise(starts)]


def time_parts(
    workload: Workload,
    limit: LimitCurve,
    noise_free_s: Callable[[int], float],
    step_s: Sequence[float] | np.ndarray,
    sizes: Sequence[int] | np.ndarray,
) -> dict[str, float]:
    """A run's time to the target, split into :data:`PARTS` (module docstring).

    Args:
        workload: The workload.
        limit: The grid the best goodput is taken over.
        noise_free_s: The oracle's split's noise-free step time of a global batch.
        step_s: The run's step times, seconds.
        sizes: The global batch of each step.

    Returns:
        Seconds per part; they sum to ``sum(step_s)``.

    Raises:
        ValueError: When ``step_s`` and ``sizes`` differ in length or are empty.
    """
    times = np.asarray(step_s, dtype=np.float64)
    batches = np.asarray(sizes, dtype=np.int64)
    if times.size == 0 or times.shape != batches.shape:
        raise ValueError(
            f"step_s and sizes must be non-empty and of one length, got {times.size} and"
            f" {batches.size}"
        )
    segs = _segments(batches)
    parts = dict.fromkeys(PARTS, 0.0)
    progress = 0.0
    for i, (a, c, b) in enumerate(segs):
        if i == 0 and len(segs) > 1:
            kind = "start_s"
        elif 0 < i < len(segs) - 1 and segs[i + 1][2] == segs[i - 1][2]:
            kind = "trials_s"
        else:
            kind = "kept_s"
        t_b = noise_free_s(b)
        for _ in range(a, c):
            dp = workload.step_progress(float(b), progress)
            best = dp / limit.best_rate(workload, progress)
            parts["limit_s"] += best
            parts[kind] += t_b - best
            progress += dp
        seg = times[a:c]
        median = float(np.median(seg))
        parts["shape_s"] += float((seg[seg > ONE_OFF * median] - median).sum())
    noise_free = sum(parts[k] for k in ("limit_s", "start_s", "trials_s", "kept_s"))
    parts["steps_s"] = float(times.sum()) - noise_free - parts["shape_s"]
    return parts
