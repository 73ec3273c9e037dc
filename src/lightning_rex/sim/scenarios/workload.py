"""A training job's gradient statistics over its course: what goodput needs in the simulator.

A scenario may carry a ``workload`` (see :mod:`lightning_rex.sim.scenarios.scenario`)::

    "workload": {"b0": 128, "target_progress": 2.0e6,
                 "trace": [[progress, grad_sqr, grad_var], ...],
                 "batch_range": [128, 4096]}

``progress`` counts statistical progress in samples at ``b0`` (the x axis of the trace):
``b0`` samples of progress is one step at ``b0``. ``grad_sqr`` is ``|G|^2``, the squared
norm of the true gradient, and ``grad_var`` is ``tr(Sigma)``, the per-sample gradient
variance, at that progress; between rows they are interpolated linearly, and past the ends
held flat. Their ratio is the gradient noise scale ``phi = grad_var / grad_sqr``.

**Progress** (Pollux, Qiao et al., OSDI 2021, eq. 4): a step at global batch ``B`` makes
``B * E(B)`` samples of progress, with the statistical efficiency
``E(B) = (phi + b0) / (phi + B)`` at the progress reached. The run ends when the progress
reaches ``target_progress``; the figure of merit is the simulated time to get there.

**What the scaler sees** (:class:`GradientNorms`): each step's two squared norms that
training measures, ``A = sum_r (b_r / B) |g_r|^2`` of the ranks' mean gradients and ``|g|^2``
of the global mean gradient (:mod:`lightning_rex.core.scaling.noise_scale`). They are drawn
from a Gaussian gradient model: a true gradient ``G`` and each rank's mean of ``b_r`` samples
with isotropic noise of trace ``tr(Sigma) / b_r`` in :data:`GRADIENT_DIMS` dimensions. So the
per-step estimates of ``|G|^2`` and ``tr(Sigma)`` are unbiased and noisy exactly as the real
estimator's are: the noise of ``|g|^2`` shrinks as ``tr(Sigma) / B``.

``batch_range`` (optional) is the range of global batches the batch policies may choose
from, default ``[global_batch, 16 * global_batch]`` clipped to what the ranks' memory caps
hold.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_rex.sim.scenarios.errors import ScenarioError
from lightning_rex.sim.scenarios.fields import check_keys, number

__all__ = ["GRADIENT_DIMS", "GradientNorms", "Workload", "workload_from_dict"]

_WORKLOAD = {"b0", "target_progress", "trace", "batch_range"}
_MAX_TRACE_ROWS = 10_000
_MAX_BATCH = 1 << 24

GRADIENT_DIMS = 16
"""Dimensions of the simulated gradient noise: each rank's squared noise norm is a chi-square
of this many degrees of freedom (relative sd ``sqrt(2 / 16) = 0.35`` per rank and step)."""


@dataclass(frozen=True)
class Workload:
    """A job's gradient statistics and its target (module docstring).

    Attributes:
        b0: The batch progress is counted at.
        target_progress: The progress (samples at ``b0``) at which the run ends.
        trace: ``(progress, grad_sqr, grad_var)`` rows, progress strictly increasing.
        batch_range: ``(min, max)`` global batches the batch policies may choose from.
    """

    b0: int
    target_progress: float
    trace: tuple[tuple[float, float, float], ...]
    batch_range: tuple[int, int]

    def stats(self, progress: float) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` at ``progress`` (linear between rows, flat past the ends).

        Args:
            progress: Samples of progress at ``b0``.

        Returns:
            ``|G|^2`` and ``tr(Sigma)``.
        """
        grad_sqr, grad_var = self._interp(progress)
        return float(grad_sqr), float(grad_var)

    def _interp(self, progress: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(grad_sqr, grad_var)`` at every element of ``progress``: the one interpolation."""
        rows = self._rows
        return (
            np.interp(progress, rows[:, 0], rows[:, 1]),
            np.interp(progress, rows[:, 0], rows[:, 2]),
        )

    def noise_scale(self, progress: float) -> float:
        """``phi = tr(Sigma) / |G|^2`` at ``progress``."""
        grad_sqr, grad_var = self.stats(progress)
        return grad_var / grad_sqr

    @functools.cached_property
    def _rows(self) -> np.ndarray:
        """The trace as an array, shape ``(rows, 3)``."""
        return np.asarray(self.trace, dtype=np.float64)

    def noise_scales(self, progress: np.ndarray) -> np.ndarray:
        """:meth:`noise_scale` at every element of ``progress``.

        Args:
            progress: Samples of progress at ``b0``, any shape.

        Returns:
            ``phi`` of the same shape.
        """
        grad_sqr, grad_var = self._interp(progress)
        return grad_var / grad_sqr

    def efficiency(self, batch: float, progress: float) -> float:
        """Progress per sample at ``batch`` relative to ``b0``: ``(phi + b0) / (phi + B)``."""
        return float(self.efficiency_at(batch, self.noise_scale(progress)))

    def efficiency_at(self, batch: float | np.ndarray, phi: float | np.ndarray) -> np.ndarray:
        """``(phi + b0) / (phi + B)`` (Pollux, eq. 4), elementwise: the one formula of it.

        Args:
            batch: Global batches ``B``.
            phi: Noise scales, one or one per batch.

        Returns:
            The efficiencies, shaped as ``batch`` and ``phi`` broadcast (0-d for scalars).
        """
        return np.asarray((phi + self.b0) / (phi + batch))

    def goodput(self, batches: np.ndarray, step_s: np.ndarray, progress: float) -> np.ndarray:
        """Progress per second of each global batch at ``progress``: ``B E(B) / T(B)``.

        Args:
            batches: Global batches.
            step_s: Each one's step time, seconds.
            progress: The progress reached.

        Returns:
            Shape of ``batches``.
        """
        b = np.asarray(batches, dtype=np.float64)
        return b * self.efficiency_at(b, self.noise_scale(progress)) / step_s

    def step_progress(self, batch: float, progress: float) -> float:
        """Samples of progress one step at ``batch`` makes from ``progress``."""
        return batch * self.efficiency(batch, progress)

    def steps_to_target(self, batch: int, max_steps: int) -> int | None:
        """Steps at a fixed ``batch`` to reach the target, or None beyond ``max_steps``.

        Args:
            batch: The global batch, held throughout.
            max_steps: The most steps counted.

        Returns:
            The number of steps.
        """
        progress, steps = 0.0, 0
        while progress < self.target_progress:
            if steps >= max_steps:
                return None
            progress += self.step_progress(batch, progress)
            steps += 1
        return steps


class GradientNorms:
    """Each step's gradient norms as training measures them, from a Gaussian gradient model.

    Args:
        workload: The statistics.
        seed: Seeds the draws (a stream of its own: the policies' step times are not
            moved by it).
    """

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload = workload
        self._rng = np.random.default_rng([int(seed), 2])

    def draw(self, plan: Sequence[int], progress: float) -> tuple[float, float]:
        """``(sum_r (b_r / B) |g_r|^2, |g|^2)`` for one step under ``plan`` at ``progress``.

        Args:
            plan: Per-rank micro-batch sizes.
            progress: The progress reached.

        Returns:
            The two squared norms of mean gradients.
        """
        grad_sqr, grad_var = self.workload.stats(progress)
        sizes = np.asarray(plan, dtype=np.float64)
        total = float(sizes.sum())
        dims = GRADIENT_DIMS
        # rank r's mean gradient: G (along the first axis) plus noise of trace grad_var / b_r
        eps = (
            self._rng.standard_normal((sizes.size, dims))
            * np.sqrt(grad_var / dims / sizes)[:, None]
        )
        eps[:, 0] += math.sqrt(max(grad_sqr, 0.0))
        weights = sizes / total
        local = float(np.dot(weights, np.einsum("ij,ij->i", eps, eps)))
        glob = weights @ eps
        return local, float(glob @ glob)


def workload_from_dict(
    d: Any,
    global_batch: int,
    n: int,
    min_size: int,
    caps: Sequence[int | None],
    max_per_rank: int,
) -> Workload:
    """Check a scenario's ``workload`` mapping and build the :class:`Workload`.

    Args:
        d: The mapping (module docstring).
        global_batch: The scenario's (first) global batch.
        n: The number of ranks.
        min_size: The smallest micro-batch.
        caps: Per-rank memory caps (None for none).
        max_per_rank: The largest global batch per rank the simulator tabulates.

    Returns:
        The workload.

    Raises:
        ScenarioError: Naming the field.
    """
    data = check_keys(d, _WORKLOAD, "workload")
    where = "workload."
    base_batch = number(data, "b0", where, lo=1, hi=_MAX_BATCH, integer=True)
    target = number(data, "target_progress", where, lo=0.0, lo_open=True, hi=1e15)
    rows = data.get("trace")
    if not isinstance(rows, list) or not rows or len(rows) > _MAX_TRACE_ROWS:
        raise ScenarioError(
            f"{where}trace must be a list of 1 to {_MAX_TRACE_ROWS:,} rows"
            " [progress, grad_sqr, grad_var]"
        )
    trace: list[tuple[float, float, float]] = []
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 3:
            raise ScenarioError(f"{where}trace[{index}] must be [progress, grad_sqr, grad_var]")
        fields = dict(zip(("progress", "grad_sqr", "grad_var"), row))
        row_where = f"{where}trace[{index}]."
        progress = number(fields, "progress", row_where, lo=0.0, hi=1e15)
        grad_sqr = number(fields, "grad_sqr", row_where, lo=0.0, lo_open=True, hi=1e30)
        grad_var = number(fields, "grad_var", row_where, lo=0.0, hi=1e30)
        if trace and progress <= trace[-1][0]:
            raise ScenarioError(f"{row_where}progress must be greater than the row before's")
        trace.append((progress, grad_sqr, grad_var))
    room = sum(global_batch if c is None else c for c in caps)
    if "batch_range" in data:
        bounds = data["batch_range"]
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise ScenarioError(f"{where}batch_range must be [min, max]")
        fields = {"min": bounds[0], "max": bounds[1]}
        low = number(
            fields, "min", f"{where}batch_range.", lo=n * min_size, hi=global_batch, integer=True
        )
        high = number(
            fields, "max", f"{where}batch_range.", lo=global_batch, hi=_MAX_BATCH, integer=True
        )
        if high <= low:
            raise ScenarioError(
                f"{where}batch_range: max ({high}) must be greater than min ({low})"
            )
    else:
        low, high = global_batch, min(16 * global_batch, room, max_per_rank * n)
        if high <= low:
            raise ScenarioError(
                f"{where}batch_range: the memory caps hold no global batch above {global_batch};"
                " give the range"
            )
    if high > room:
        raise ScenarioError(
            f"{where}batch_range: max {high} is more than the memory caps hold ({room})"
        )
    if high > max_per_rank * n:
        raise ScenarioError(
            f"{where}batch_range: max {high} over {n} ranks is more than {max_per_rank:,} per rank"
        )
    return Workload(base_batch, target, tuple(trace), (low, high))
