"""A small workload scenario (four ranks, two fast and two slow) for the goodput tests."""

from __future__ import annotations

from typing import Any


def workload_scenario(**workload: Any) -> dict[str, Any]:
    """The scenario as a dict, with ``workload``'s keys over the defaults.

    Two fast ranks and two slow; 16 steps of progress per 1,000 samples at ``b0 = 32``.
    """
    ranks = [{"rate": 4000.0, "overhead_s": 0.004, "knee": 4, "mem_cap": 256}] * 2
    ranks += [{"rate": 2000.0, "overhead_s": 0.004, "knee": 4, "mem_cap": 128}] * 2
    wl = {"b0": 32, "target_progress": 32 * 400.0, "trace": [[0, 1 / 1024, 1.0]]}
    return {
        "global_batch": 32,
        "steps": 900,
        "window": 30,
        "comm": 0.01,
        "ranks": ranks,
        "noise": {"cv": 0.05, "ar1": 0.3},
        "workload": {**wl, **workload},
    }
