"""Workload scenarios: heterogeneous clusters training a job to a target (goodput presets).

Each preset pairs a cluster with a ``workload`` (:mod:`lightning_rex.sim.workload`) whose
gradient noise scale ``phi = grad_var / grad_sqr`` has one of three shapes over the run
(relative to ``b0``, the starting global batch):

* ``flat``: ``phi = 8 b0`` throughout (a job whose best batch does not move);
* ``slow``: ``phi`` grows linearly from ``2 b0`` to ``16 b0`` over the whole target (the
  slow growth measured for image classifiers, McCandlish et al. 2018, fig. 5);
* ``fast``: ``phi`` grows from ``b0`` to ``32 b0`` in the first fifth of the target, then
  stays (a fast rise early in training, as for language models).

``grad_var`` is held at 1 and ``grad_sqr`` falls as ``1 / phi``. The targets are set so that
the fixed ``b0`` needs about 3,000 steps (8 and 64 ranks) or 1,000 steps (4096 ranks).
Clusters: ``-8`` is three A100, three V100 and two T4 (``a100-v100-t4-8``) at ``b0 = 256``;
``-64`` is ``mixed-64``'s fleet at ``b0 = 1024``; ``-4096`` is ``mixed-4096``'s fleet at
``b0 = 65536``. Every preset charges the GPU presets' 0.5 s per new micro-batch shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_rex.sim.fleets import gpu_rank, mixed_fleet

__all__ = ["SHAPES", "WORKLOAD_PRESETS", "workload_trace"]

SHAPES = ("flat", "slow", "fast")
"""The noise-scale shapes of the workload presets."""


def workload_trace(shape: str, b0: int, target: float) -> list[list[float]]:
    """``[progress, grad_sqr, grad_var]`` rows of a shape (module docstring).

    Args:
        shape: One of :data:`SHAPES`.
        b0: The base batch.
        target: The target progress.

    Returns:
        The rows.

    Raises:
        ValueError: For an unknown shape.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {SHAPES}")

    def phi(u: float) -> float:  # in units of b0, at the share u of the target
        if shape == "flat":
            return 8.0
        if shape == "slow":
            return 2.0 + 14.0 * u
        return 1.0 + 31.0 * min(u / 0.2, 1.0)

    # rows every 5% of the target: the trace interpolates grad_sqr linearly, and its
    # inverse (phi) is then close to the shape between rows
    points = [(u * target, phi(u)) for u in np.linspace(0.0, 1.0, 21)]
    return [[float(p), 1.0 / (f * b0), 1.0] for p, f in points]


def _cluster(n: int) -> tuple[list[dict[str, Any]], int, float, int]:
    """Ranks, b0, comm and the fixed-b0 steps of the cluster of ``n`` ranks."""
    if n == 8:
        return (
            [gpu_rank("A100")] * 3 + [gpu_rank("V100")] * 3 + [gpu_rank("T4")] * 2,
            256,
            0.01,
            3000,
        )
    if n == 64:
        return mixed_fleet(64, 64), 1024, 0.02, 3000
    return mixed_fleet(4096, 4096), 65536, 0.05, 1000


def _preset(shape: str, n: int) -> Callable[[], dict[str, Any]]:
    def preset() -> dict[str, Any]:
        ranks, b0, comm, steps = _cluster(n)
        target = float(b0 * steps)
        return {
            "global_batch": b0,
            "steps": 2 * steps if n < 4096 else 4000,
            "window": 30,
            "comm": comm,
            "ranks": ranks,
            "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
            "workload": {
                "b0": b0,
                "target_progress": target,
                "trace": workload_trace(shape, b0, target),
            },
        }

    preset.__doc__ = f"{n} ranks training a job whose noise scale is {shape} (module docstring)."
    return preset


WORKLOAD_PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    **{f"gns-{shape}-{n}": _preset(shape, n) for n in (8, 64) for shape in SHAPES},
    "gns-slow-4096": _preset("slow", 4096),
}
"""Workload preset name -> function returning the scenario mapping (no shape cost yet)."""
