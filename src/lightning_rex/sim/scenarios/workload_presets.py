"""Workload scenarios: heterogeneous clusters training a job to a target (goodput presets).

Each preset pairs a cluster with a ``workload`` (:mod:`lightning_rex.sim.scenarios.workload`) whose
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

The presets above run for one to three simulated minutes, where a policy's first windows
weigh much. Two *long* workloads, at 8 and 64 ranks, run for hours at the fixed ``b0``
(:data:`LONG`), so that what counts is the batch a policy settles on and follows:

* ``gns-image-{8,64}``: an image classifier over many epochs. Its noise scale grows
  ``slow``; each sample costs 16 times the short presets' (larger images and model), the
  all-reduce 4 times; 12,000 steps at ``b0``: about 2 hours at 8 ranks.
* ``gns-lm-{8,64}``: a language model. Its noise scale rises ``fast``; each sample (a long
  sequence) and the all-reduce (a larger model) cost 40 times the short presets'; 6,000
  steps at ``b0``: about 2.7 hours at 8 ranks.

They stay cheap to simulate because their steps are long rather than many: a run decides
every 30 steps, as in the short presets, over a few thousand steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_rex.sim.scenarios.fleets import gpu_rank, mixed_fleet

__all__ = ["LONG", "SHAPES", "WORKLOAD_PRESETS", "workload_trace"]

SHAPES = ("flat", "slow", "fast")
"""The noise-scale shapes of the workload presets."""

LONG: dict[str, tuple[str, float, float, int]] = {
    "image": ("slow", 16.0, 4.0, 12_000),
    "lm": ("fast", 40.0, 40.0, 6_000),
}
"""Long workload -> (noise-scale shape, per-sample cost factor, all-reduce factor, steps at
``b0``) (module docstring)."""


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


def _heavier(rank: dict[str, Any], factor: float) -> dict[str, Any]:
    """``rank`` with every step ``factor`` times longer (its rate down, its overhead up)."""
    return {**rank, "rate": rank["rate"] / factor, "overhead_s": rank["overhead_s"] * factor}


def _preset(
    shape: str, n: int, cost: float = 1.0, sync: float = 1.0, steps: int | None = None
) -> Callable[[], dict[str, Any]]:
    def preset() -> dict[str, Any]:
        ranks, b0, comm, short = _cluster(n)
        ranks = [_heavier(r, cost) for r in ranks] if cost != 1.0 else ranks
        comm *= sync
        b0_steps = short if steps is None else steps
        target = float(b0 * b0_steps)
        return {
            "global_batch": b0,
            "steps": 2 * b0_steps if n < 4096 else 4000,
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
    **{
        f"gns-{kind}-{n}": _preset(shape, n, cost, sync, steps)
        for kind, (shape, cost, sync, steps) in LONG.items()
        for n in (8, 64)
    },
}
"""Workload preset name -> function returning the scenario mapping (no shape cost yet)."""
