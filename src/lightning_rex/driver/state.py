"""What a resumed run needs from a checkpoint beyond the controller's own state.

* Windows as plain data (a decision may be pending when a checkpoint is saved).
* Measured rates keyed by device identity, so that a run resumed on another world size can
  start from a plan fitted to its devices rather than the even plan.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lightning_rex.core.plan import Plan
from lightning_rex.core.planner import affine_plan
from lightning_rex.core.window import Window

__all__ = [
    "device_rates",
    "info_from_state",
    "info_to_state",
    "plan_from_device_rates",
    "window_from_state",
    "window_to_state",
]


def window_to_state(w: Window) -> dict[str, Any]:
    """A window as JSON-able data.

    Args:
        w: The window.

    Returns:
        ``{"times", "plan", "start", "end"}``.
    """
    return {
        "times": w.times.tolist(),
        "plan": list(w.plan),
        "start": w.step_start,
        "end": w.step_end,
    }


def window_from_state(d: dict[str, Any]) -> Window:
    """The inverse of :func:`window_to_state`.

    Args:
        d: The dictionary.

    Returns:
        The window.
    """
    times = np.asarray(d["times"], dtype=np.float64)
    return Window(times, tuple(int(b) for b in d["plan"]), int(d["start"]), int(d["end"]))


def info_to_state(info: dict[str, Any]) -> dict[str, Any]:
    """A window's extras (a decision not yet exchanged) as JSON-able data.

    Args:
        info: ``window`` plus the window's throughput figures; telemetry is not kept.

    Returns:
        A dictionary for :func:`info_from_state`.
    """
    keys = ("global_samples_per_s", "window_samples", "window_wall_s")
    return {"window": window_to_state(info["window"]), **{k: info.get(k) for k in keys}}


def info_from_state(state: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`info_to_state` (telemetry comes back as None).

    Args:
        state: A dictionary from :func:`info_to_state`.

    Returns:
        The window's extras.
    """
    return {**state, "window": window_from_state(state["window"]), "telemetry": None}


def device_rates(keys: list[str], summary: dict[str, list[float]]) -> dict[str, list[float]]:
    """Fitted rate and overhead per device identity, averaged over the ranks that have it.

    Args:
        keys: Each rank's device identity.
        summary: ``Controller.rank_model_summary()``: per-rank ``rate`` and ``overhead_s``.

    Returns:
        Device identity to ``[rate (samples/s), overhead (s)]``; ranks without a finite
        positive rate are left out.
    """
    out: dict[str, list[list[float]]] = {}
    for key, rate, over in zip(keys, summary.get("rate", []), summary.get("overhead_s", [])):
        if math.isfinite(rate) and rate > 0 and math.isfinite(over):
            out.setdefault(key, []).append([rate, max(over, 0.0)])
    return {
        k: [float(np.mean([v[0] for v in vs])), float(np.mean([v[1] for v in vs]))]
        for k, vs in out.items()
    }


def plan_from_device_rates(
    rates: dict[str, list[float]], device_keys: list[str], global_batch: int, min_size: int
) -> Plan | None:
    """The minimax plan from rates measured per device identity, if every rank's is known.

    Args:
        rates: Device identity to ``[rate (samples/s), overhead (s)]``, from a checkpoint.
        device_keys: This run's device identity per rank.
        global_batch: This run's global batch B.
        min_size: The smallest micro-batch.

    Returns:
        The plan equalising ``overhead + b / rate`` across ranks, or None when a rank's
        device was not measured before (the caller keeps the even plan).
    """
    if not device_keys or any(k not in rates for k in device_keys):
        return None
    n = len(device_keys)
    over = np.array([rates[k][1] for k in device_keys])
    slope = np.array([1.0 / rates[k][0] for k in device_keys])
    lo = np.full(n, min_size, dtype=np.int64)
    hi = np.full(n, global_batch - (n - 1) * min_size, dtype=np.int64)
    return affine_plan(over, slope, global_batch, lo, hi)
