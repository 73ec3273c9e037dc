"""Simulated GPU kinds and fleets built from them (shared by the presets).

The speeds are relative training throughputs in the proportions of NVIDIA's published
ResNet-50 mixed-precision training figures (see :mod:`lightning_rex.sim.scenarios.presets`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GPUS", "gpu_rank", "mixed_fleet"]

GPUS: dict[str, tuple[float, float, int, int]] = {
    # rate (samples/s), overhead (s), knee (samples), mem cap (samples)
    "A100": (2600.0, 0.006, 24, 640),
    "V100": (1400.0, 0.007, 16, 256),
    "T4": (450.0, 0.009, 8, 128),
}
"""GPU kind -> (rate in samples/s, overhead in s, knee in samples, memory cap in samples)."""


def gpu_rank(kind: str, jitter: float = 0.0) -> dict[str, Any]:
    """One rank of a GPU kind, as a scenario's rank mapping.

    Args:
        kind: A key of :data:`GPUS`.
        jitter: Relative spread of its rate (unit-to-unit variation).

    Returns:
        The mapping, labelled with its kind as ``device``.
    """
    rate, over, knee, cap = GPUS[kind]
    return {
        "rate": rate * (1.0 + jitter),
        "overhead_s": over,
        "knee": knee,
        "mem_cap": cap,
        "device": kind,
    }


def mixed_fleet(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` ranks drawn 40/40/20% from A100/V100/T4, with +-5% spread, from ``seed``.

    Args:
        n: The number of ranks.
        seed: Fixes the draw.

    Returns:
        The rank mappings.
    """
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["A100", "V100", "T4"], size=n, p=[0.4, 0.4, 0.2])
    jit = rng.uniform(-0.05, 0.05, size=n)
    return [gpu_rank(str(k), float(j)) for k, j in zip(kinds, jit)]
