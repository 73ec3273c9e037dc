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
        x = [r[0] for r in self.trace]
        g = float(np.interp(progress, x, [r[1] for r in self.trace]))
        s = float(np.interp(progress, x, [r[2] for r in self.trace]))
        return g, s

    def noise_scale(self, progress: float) -> float:
        """``phi = tr(Sigma) / |G|^2`` at ``progress``."""
        g, s = self.stats(progress)
        return s / g

    def efficiency(self, batch: float, progress: float) -> float:
        """Progress per sample at ``batch`` relative to ``b0``: ``(phi + b0) / (phi + B)``."""
        phi = self.noise_scale(progress)
        return (phi + self.b0) / (phi + batch)

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
        p, k = 0.0, 0
        while p < self.target_progress:
            if k >= max_steps:
                return None
            p += self.step_progress(batch, p)
            k += 1
        return k


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
        g2, s = self.workload.stats(progress)
        b = np.asarray(plan, dtype=np.float64)
        total = float(b.sum())
        d = GRADIENT_DIMS
        # rank r's mean gradient: G (along the first axis) plus noise of trace s / b_r
        eps = self._rng.standard_normal((b.size, d)) * np.sqrt(s / d / b)[:, None]
        eps[:, 0] += math.sqrt(max(g2, 0.0))
        w = b / total
        local = float(np.dot(w, np.einsum("ij,ij->i", eps, eps)))
        glob = w @ eps
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
    d = check_keys(d, _WORKLOAD, "workload")
    where = "workload."
    b0 = number(d, "b0", where, lo=1, hi=_MAX_BATCH, integer=True)
    target = number(d, "target_progress", where, lo=0.0, lo_open=True, hi=1e15)
    rows = d.get("trace")
    if not isinstance(rows, list) or not rows or len(rows) > _MAX_TRACE_ROWS:
        raise ScenarioError(
            f"{where}trace must be a list of 1 to {_MAX_TRACE_ROWS:,} rows"
            " [progress, grad_sqr, grad_var]"
        )
    trace: list[tuple[float, float, float]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 3:
            raise ScenarioError(f"{where}trace[{i}] must be [progress, grad_sqr, grad_var]")
        r = dict(zip(("progress", "grad_sqr", "grad_var"), row))
        at = f"{where}trace[{i}]."
        p = number(r, "progress", at, lo=0.0, hi=1e15)
        g = number(r, "grad_sqr", at, lo=0.0, lo_open=True, hi=1e30)
        s = number(r, "grad_var", at, lo=0.0, hi=1e30)
        if trace and p <= trace[-1][0]:
            raise ScenarioError(f"{at}progress must be greater than the row before's")
        trace.append((p, g, s))
    room = sum(global_batch if c is None else c for c in caps)
    if "batch_range" in d:
        br = d["batch_range"]
        if not isinstance(br, list) or len(br) != 2:
            raise ScenarioError(f"{where}batch_range must be [min, max]")
        r = {"min": br[0], "max": br[1]}
        lo = number(
            r, "min", f"{where}batch_range.", lo=n * min_size, hi=global_batch, integer=True
        )
        hi = number(r, "max", f"{where}batch_range.", lo=global_batch, hi=_MAX_BATCH, integer=True)
        if hi <= lo:
            raise ScenarioError(f"{where}batch_range: max ({hi}) must be greater than min ({lo})")
    else:
        lo, hi = global_batch, min(16 * global_batch, room, max_per_rank * n)
        if hi <= lo:
            raise ScenarioError(
                f"{where}batch_range: the memory caps hold no global batch above {global_batch};"
                " give the range"
            )
    if hi > room:
        raise ScenarioError(
            f"{where}batch_range: max {hi} is more than the memory caps hold ({room})"
        )
    if hi > max_per_rank * n:
        raise ScenarioError(
            f"{where}batch_range: max {hi} over {n} ranks is more than {max_per_rank:,} per rank"
        )
    return Workload(b0, target, tuple(trace), (lo, hi))
