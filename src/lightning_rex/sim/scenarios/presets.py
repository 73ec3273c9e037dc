"""Named scenarios for the simulator.

Each preset is a function returning a scenario mapping (see
:mod:`lightning_rex.sim.scenarios.scenario`); heterogeneous fleets are generated from a fixed
seed so a preset is the same on every machine.

GPU speeds in ``a100-v100-t4-8`` are relative training throughputs in the proportions of
NVIDIA's published ResNet-50 mixed-precision training figures (roughly A100 : V100 : T4 =
2.6k : 1.4k : 0.45k images/s per GPU; approximate, for shape only), with memory caps in
proportion to 80 / 32 / 16 GB. Ranks carry their GPU's name as ``device``.

Costs: every GPU preset charges ``shape_change_s = 0.5`` s for a micro-batch size a rank has
not run among its last 8 distinct sizes (:data:`SHAPE_CHANGE_S`). Where it comes from: cuDNN's
``benchmark`` mode times every convolution's candidate algorithms once per new input shape,
and ``torch.compile`` (without dynamic shapes) recompiles, which costs from a few hundred
milliseconds to tens of seconds per shape; 0.5 s is our estimate for a ResNet-50-sized
network with cuDNN autotuning, at the low end of that range, not a measurement
(``examples/profile_curve.py --cudnn-benchmark`` measures it on a GPU). ``pair-3x`` models the
CPU bench, where a new shape costs nothing measurable (``profile_curve.py`` on this project's
CPU machine: 0.0 s), so it charges 0. ``simulate --shape-change-s 0`` runs any preset free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_rex.sim.scenarios.fleets import GPUS, gpu_rank, mixed_fleet
from lightning_rex.sim.scenarios.workload_presets import WORKLOAD_PRESETS

__all__ = ["PRESETS", "SHAPE_CHANGE_S"]

SHAPE_CHANGE_S = 0.5
"""Seconds a GPU preset charges a rank for a micro-batch shape it has not run recently."""


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
    ranks = [gpu_rank("A100")] * 3 + [gpu_rank("V100")] * 3 + [gpu_rank("T4")] * 2
    return {
        "global_batch": 512,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


def mixed_64() -> dict[str, Any]:
    """64 ranks of three generations with +-5% unit-to-unit spread."""
    return {
        "global_batch": 64 * 64,
        "steps": 3000,
        "window": 30,
        "comm": 0.02,
        "ranks": mixed_fleet(64, 64),
        "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
    }


def mixed_4096() -> dict[str, Any]:
    """4096 ranks of three generations; short, for decision latency at scale."""
    return {
        "global_batch": 4096 * 64,
        "steps": 600,
        "window": 30,
        "comm": 0.05,
        "ranks": mixed_fleet(4096, 4096),
        "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
    }


def slowdown_mid_16() -> dict[str, Any]:
    """16 ranks (A100 and V100); two ranks slow down by 1.6x halfway and stay slow."""
    ranks = [gpu_rank("A100")] * 8 + [gpu_rank("V100")] * 8
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
    events = [
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
        "events": events,
    }


def drift_16() -> dict[str, Any]:
    """16 ranks (A100 and V100) drifting apart slowly.

    Rank 2 slows by 8% every 300 steps from step 600 (1.85x at the end) while rank 10 speeds
    up by 6% at the same times (six times).
    """
    ranks = [gpu_rank("A100")] * 8 + [gpu_rank("V100")] * 8
    events = []
    for index, start in enumerate(range(600, 3000, 300)):
        events.append({"ranks": [2], "start": start, "end": 3000, "factor": 1.08})
        if index < 6:
            events.append({"ranks": [10], "start": start, "end": 3000, "factor": 1 / 1.06})
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
        "events": events,
    }


def twoscale_noise_8() -> dict[str, Any]:
    """``a100-v100-t4-8``'s ranks under two-scale noise, CV 0.15.

    The log noise is a slow drift carrying 60% of the variance (AR(1) 0.95: thermal and
    clock drift, a co-tenant's phases) on a fast jitter carrying 40% (independent per step).
    A test calibrated for one AR(1) scale meets autocorrelation it did not assume.
    """
    data = a100_v100_t4_8()
    data["noise"] = {
        "dist": "lognormal",
        "cv": 0.15,
        "components": [{"share": 0.6, "ar1": 0.95}, {"share": 0.4, "ar1": 0.0}],
    }
    return data


def spiky_noise_8() -> dict[str, Any]:
    """``a100-v100-t4-8``'s ranks at CV 0.08, plus spikes.

    Every rank, every step, independently takes 3x its time with probability 0.01 (a
    garbage-collection pause, a data-loader stall, a co-tenant's burst).
    """
    data = a100_v100_t4_8()
    data["noise"] = {
        "dist": "lognormal",
        "cv": 0.08,
        "ar1": 0.5,
        "spikes": {"prob": 0.01, "factor": 3.0},
    }
    return data


def tiled_8() -> dict[str, Any]:
    """``a100-v100-t4-8`` on quantisation staircases.

    Time steps up every 8 samples on T4 and V100 and every 16 on A100 (kernels pad the batch
    to tile multiples): a few percent per step at the sizes these ranks run, the pattern of
    published per-batch-size measurements.
    """
    data = a100_v100_t4_8()
    for rank in data["ranks"]:
        rank["tile"] = 16 if rank["device"] == "A100" else 8
    return data


def staircase_8() -> dict[str, Any]:
    """Two A100, three V100, three T4 on tile and wave staircases.

    Each kind pads its batch to its own tile (64 samples on A100, 32 on V100, 16 on T4) and
    runs 30% of its work in waves of 256 / 128 / 64 samples, so the time climbs in small
    steps at every tile and in a larger one at every wave: the shapes of tile and wave
    quantisation, in the proportions of published per-batch-size GPU measurements (not a
    measurement of these GPUs).
    """
    tiles = {"A100": (64, 256), "V100": (32, 128), "T4": (16, 64)}
    ranks = []
    for kind, count in (("A100", 2), ("V100", 3), ("T4", 3)):
        tile, wave = tiles[kind]
        ranks += [{**gpu_rank(kind), "tile": tile, "wave": {"size": wave, "share": 0.3}}] * count
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


def memwall_8() -> dict[str, Any]:
    """Four A100 and four V100 whose time climbs steeply near their memory cap.

    Above 70% of ``mem_cap`` a rank's time is multiplied by up to 2.5x at the cap (allocator
    fragmentation, activation recomputation, cache thrashing). The global batch pushes the
    fast ranks into that region: the affine fit a rank's first windows suggest overshoots.
    """
    ranks = [dict(gpu_rank("A100"), mem_cap=256) for _ in range(4)]
    ranks += [dict(gpu_rank("V100"), mem_cap=160) for _ in range(4)]
    for rank in ranks:
        rank["wall"] = {"start": 0.7, "factor": 2.5}
    return {
        "global_batch": 1024,
        "steps": 3000,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


# ResNet-50 FP32 training, one GPU, synthetic data, MXNet 1.2.0rc1 + cuDNN 7.0.5: seconds per
# step = batch / images-per-second, from the "Training results" table of Apache MXNet's
# "Some Tips for Improving MXNet Performance" (https://mxnet.apache.org/api/faq/perf;
# apache/mxnet docs/static_site/src/pages/api/faq/perf.md at 0c17f67e), K80 on EC2
# p2.2xlarge, M60 on g3.4xlarge, V100 on p3.2xlarge.
_MXNET_RESNET50 = {
    "K80": [
        [1, 0.064061], [2, 0.083752], [4, 0.123993], [8, 0.202943], [16, 0.342686],
        [32, 0.646726],
    ],
    "M60": [
        [1, 0.048662], [2, 0.061256], [4, 0.087777], [8, 0.145666], [16, 0.248293],
        [32, 0.468247],
    ],
    "V100": [
        [1, 0.028952], [2, 0.030764], [4, 0.035245], [8, 0.045764], [16, 0.063689],
        [32, 0.107199], [64, 0.186486], [128, 0.351948],
    ],
}  # fmt: skip


def resnet50_k80_m60_v100_6() -> dict[str, Any]:
    """Two K80, two M60 and two V100 on published, measured ResNet-50 training curves.

    Each rank's curve is the per-batch-size step time of its GPU in the "Training results"
    table of Apache MXNet's performance guide (https://mxnet.apache.org/api/faq/perf: FP32,
    one GPU, synthetic data, batch sizes 1 to 32 on K80 and M60 and 1 to 128 on V100).
    ``mem_cap`` is the largest size measured (32 and 128), so no rank leaves its table. The
    curves are far from affine: a V100 at 8 samples runs 6x the images/s it runs at 1.
    ``comm`` 0.05 s is our estimate for an all-reduce of ResNet-50's 100 MB of FP32
    gradients over 25 Gb/s Ethernet, with overlap.
    """
    ranks = [
        {"curve": _MXNET_RESNET50[gpu], "mem_cap": cap, "device": gpu}
        for gpu, cap in (("K80", 32), ("M60", 32), ("V100", 128))
        for _ in range(2)
    ]
    return {
        "global_batch": 192,
        "steps": 3000,
        "window": 30,
        "comm": 0.05,
        "ranks": ranks,
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


def fsdp_memory_8() -> dict[str, Any]:
    """An FSDP-style transformer on two A100-80GB, two V100-16GB and four T4-16GB: memory binds.

    Each rank holds ``fixed_bytes`` 4 GB whatever its batch (its shard of the parameters,
    gradients and optimizer state of a model fully sharded over the 8 ranks, plus the
    framework's workspace) and 2 GB of activations per 2048-token sequence, so a pass holds
    38 sequences on an A100 and 6 on a V100 or a T4 (:mod:`lightning_rex.sim.scenarios.memory`). The
    even split of the global batch of 128 sequences (16 each) does not fit the 16 GB GPUs:
    even FSDP runs 3 accumulation passes there. Speeds keep the proportions of the ResNet-50
    kinds (:data:`~lightning_rex.sim.scenarios.fleets.GPUS`) at 1/100 of their samples per second (a
    sequence is far more work than an image). Every pass pays 10x their fixed cost plus
    0.15 s of parameter all-gathers that compute does not hide (FSDP gathers the parameters
    again for every pass), and a GPU is under-filled below a few sequences. Shapes for
    illustration, not measurements.
    """
    ranks = []
    for kind, count, memory_bytes in (("A100", 2, 80e9), ("V100", 2, 16e9), ("T4", 4, 16e9)):
        rate, over, knee, _ = GPUS[kind]
        rank = {
            "rate": rate / 100.0,
            "overhead_s": 10.0 * over + _FSDP_GATHER_S,
            "knee": max(1, knee // 8),
            "device": kind,
            "memory_bytes": memory_bytes,
        }
        ranks += [rank] * count
    return {
        "global_batch": 128,
        "steps": 3000,
        "window": 30,
        "comm": 0.05,
        "ranks": ranks,
        "memory": {"fixed_bytes": 4e9, "per_sample_bytes": 2e9},
        "noise": {"dist": "lognormal", "cv": 0.10, "ar1": 0.5},
    }


_FSDP_GATHER_S = 0.15
"""Seconds of a pass's parameter all-gathers not hidden by compute (``fsdp-memory-8``)."""


def _costed(make: Callable[[], dict[str, Any]], seconds: float) -> Callable[[], dict[str, Any]]:
    def preset() -> dict[str, Any]:
        return {**make(), "shape_change_s": seconds}

    preset.__doc__ = make.__doc__
    return preset


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "pair-3x": _costed(pair_3x, 0.0),
    "homogeneous-8": _costed(homogeneous_8, SHAPE_CHANGE_S),
    "a100-v100-t4-8": _costed(a100_v100_t4_8, SHAPE_CHANGE_S),
    "mixed-64": _costed(mixed_64, SHAPE_CHANGE_S),
    "slowdown-mid-16": _costed(slowdown_mid_16, SHAPE_CHANGE_S),
    "slowdown-15pct-16": _costed(slowdown_15pct_16, SHAPE_CHANGE_S),
    "transient-16": _costed(transient_16, SHAPE_CHANGE_S),
    "drift-16": _costed(drift_16, SHAPE_CHANGE_S),
    "mixed-4096": _costed(mixed_4096, SHAPE_CHANGE_S),
    "twoscale-noise-8": _costed(twoscale_noise_8, SHAPE_CHANGE_S),
    "spiky-noise-8": _costed(spiky_noise_8, SHAPE_CHANGE_S),
    "tiled-8": _costed(tiled_8, SHAPE_CHANGE_S),
    "staircase-8": _costed(staircase_8, SHAPE_CHANGE_S),
    "memwall-8": _costed(memwall_8, SHAPE_CHANGE_S),
    "resnet50-k80-m60-v100-6": _costed(resnet50_k80_m60_v100_6, SHAPE_CHANGE_S),
    "fsdp-memory-8": _costed(fsdp_memory_8, SHAPE_CHANGE_S),
}
"""Preset name -> function returning the scenario mapping (with its shape-change cost)."""
PRESETS.update({k: _costed(v, SHAPE_CHANGE_S) for k, v in WORKLOAD_PRESETS.items()})
