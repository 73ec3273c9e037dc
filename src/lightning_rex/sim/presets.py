"""Named scenarios for the simulator.

Each preset is a function returning a scenario mapping (see
:mod:`lightning_rex.sim.scenario`); heterogeneous fleets are generated from a fixed seed so
a preset is the same on every machine.

GPU speeds in ``a100-v100-t4-8`` are relative training throughputs in the proportions of
NVIDIA's published ResNet-50 mixed-precision training figures (roughly A100 : V100 : T4 =
2.6k : 1.4k : 0.45k images/s per GPU; approximate, for shape only), with memory caps in
proportion to 80 / 32 / 16 GB.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PRESETS"]

_GPU = {
    # rate (samples/s), overhead (s), knee (samples), mem cap (samples)
    "A100": (2600.0, 0.006, 24, 640),
    "V100": (1400.0, 0.007, 16, 256),
    "T4": (450.0, 0.009, 8, 128),
}


def _rank(kind: str, jitter: float = 0.0) -> dict[str, Any]:
    rate, over, knee, cap = _GPU[kind]
    return {"rate": rate * (1.0 + jitter), "overhead_s": over, "knee": knee, "mem_cap": cap}


def _uniform(n: int, rate: float = 2000.0) -> list[dict[str, Any]]:
    return [{"rate": rate, "overhead_s": 0.005, "knee": 16, "mem_cap": 512} for _ in range(n)]


def pair_3x() -> dict[str, Any]:
    """Two ranks, one three times slower: the bench's emulated pair."""
    ranks = [
        {"rate": 3000.0, "overhead_s": 0.003, "knee": 8, "mem_cap": 256},
        {"rate": 1000.0, "overhead_s": 0.003, "knee": 8, "mem_cap": 256},
    ]
    return {
        "global_batch": 128,
        "steps": 1500,
        "window": 30,
        "comm": 0.004,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


def homogeneous_8() -> dict[str, Any]:
    """Eight identical ranks: every rescale is a false one."""
    return {
        "global_batch": 512,
        "steps": 3000,
        "window": 30,
        "comm": 0.008,
        "ranks": _uniform(8),
        "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
    }


def a100_v100_t4_8() -> dict[str, Any]:
    """Three A100, three V100, two T4."""
    ranks = [_rank("A100")] * 3 + [_rank("V100")] * 3 + [_rank("T4")] * 2
    return {
        "global_batch": 512,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


def _mixed(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["A100", "V100", "T4"], size=n, p=[0.4, 0.4, 0.2])
    jit = rng.uniform(-0.05, 0.05, size=n)
    return [_rank(str(k), float(j)) for k, j in zip(kinds, jit)]


def mixed_64() -> dict[str, Any]:
    """64 ranks of three generations with +-5% unit-to-unit spread."""
    return {
        "global_batch": 64 * 64,
        "steps": 3000,
        "window": 30,
        "comm": 0.02,
        "ranks": _mixed(64, 64),
        "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
    }


def mixed_4096() -> dict[str, Any]:
    """4096 ranks of three generations; short, for decision latency at scale."""
    return {
        "global_batch": 4096 * 64,
        "steps": 600,
        "window": 30,
        "comm": 0.05,
        "ranks": _mixed(4096, 4096),
        "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
    }


def slowdown_mid_16() -> dict[str, Any]:
    """16 ranks (A100 and V100); two ranks slow down by 1.6x halfway and stay slow."""
    ranks = [_rank("A100")] * 8 + [_rank("V100")] * 8
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
        "events": [{"ranks": [3, 12], "start": 1500, "end": 3000, "factor": 1.6}],
    }


def slowdown_15pct_16() -> dict[str, Any]:
    """16 identical ranks at CV 0.10; one rank slows by 15% at step 1500 and stays slow."""
    return {
        "global_batch": 1024,
        "steps": 2400,
        "window": 30,
        "comm": 0.01,
        "ranks": _uniform(16),
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
        "events": [{"ranks": [5], "start": 1500, "end": 2400, "factor": 1.15}],
    }


def transient_16() -> dict[str, Any]:
    """16 identical ranks; four 1.6x stragglers of one window or less, some straddling.

    Two of them straddle a window boundary.
    """
    ev = [
        {"ranks": [2], "start": 600, "end": 630, "factor": 1.6},
        {"ranks": [7], "start": 1215, "end": 1245, "factor": 1.6},
        {"ranks": [11], "start": 1800, "end": 1820, "factor": 1.6},
        {"ranks": [4], "start": 2410, "end": 2440, "factor": 1.6},
    ]
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": _uniform(16),
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
        "events": ev,
    }


def drift_16() -> dict[str, Any]:
    """16 ranks (A100 and V100) drifting apart slowly.

    Rank 2 slows by 8% every 300 steps from step 600 (1.85x at the end) while rank 10 speeds
    up by 6% at the same times (six times).
    """
    ranks = [_rank("A100")] * 8 + [_rank("V100")] * 8
    ev = []
    for i, s in enumerate(range(600, 3000, 300)):
        ev.append({"ranks": [2], "start": s, "end": 3000, "factor": 1.08})
        if i < 6:
            ev.append({"ranks": [10], "start": s, "end": 3000, "factor": 1 / 1.06})
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
        "events": ev,
    }


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "pair-3x": pair_3x,
    "homogeneous-8": homogeneous_8,
    "a100-v100-t4-8": a100_v100_t4_8,
    "mixed-64": mixed_64,
    "slowdown-mid-16": slowdown_mid_16,
    "slowdown-15pct-16": slowdown_15pct_16,
    "transient-16": transient_16,
    "drift-16": drift_16,
    "mixed-4096": mixed_4096,
}
"""Preset name -> function returning the scenario mapping."""
