"""A prior for a fresh fit's first plan: rates per device, from a previous run or a profile.

``RexCallback(prior=...)`` takes what rex already knows about the devices, so that a fresh
fit starts from a fitted plan instead of the even split (every rank then pays one new shape
at the start instead of another after the first window). :func:`load_prior` reads it:

* a mapping ``{device: [rate (samples/s), overhead (s)]}``, as a checkpoint's
  ``device_rates`` holds it;
* a previous run's decision log (``rex_decisions.jsonl``, or a run directory holding one):
  each device's ``median = overhead + size / rate`` fitted by least squares over every
  window of its ranks in the log's last run (the records name each rank's ``devices``);
* a profile written by ``examples/profile_curve.py`` (a ``.json`` whose ``rank`` holds the
  measured ``curve`` and the ``device``), fitted the same way;
* a list of any of these, merged (a later source wins for a device both name).

The plan is used only when every rank's device is in the prior (see
:func:`~lightning_rex.core.plans.minimax.plan_from_device_rates`), and rank 0's prior is
the one all ranks use. The controller then validates and refines it like any other plan.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_rex.driver.records import DecisionLog

__all__ = ["PriorSource", "fit_rate", "load_prior"]

PriorSource = Mapping[str, Sequence[float]] | str | os.PathLike[str] | Sequence[Any]
"""What ``prior`` accepts: rates, a decision log or run directory, a profile, or a list."""


def fit_rate(sizes: Sequence[float], seconds: Sequence[float]) -> list[float] | None:
    """``[rate, overhead]`` of ``seconds = overhead + size / rate`` by least squares.

    Args:
        sizes: Micro-batch sizes.
        seconds: The times measured at them.

    Returns:
        ``[samples/s, s]``; through the origin when the sizes are all equal or the fitted
        overhead is negative; None when no positive rate fits.
    """
    size_arr = np.asarray(sizes, dtype=np.float64)
    time_arr = np.asarray(seconds, dtype=np.float64)
    valid = np.isfinite(size_arr) & np.isfinite(time_arr) & (size_arr > 0) & (time_arr > 0)
    size_arr, time_arr = size_arr[valid], time_arr[valid]
    if not size_arr.size:
        return None
    if np.unique(size_arr).size >= 2:
        slope, over = np.polyfit(size_arr, time_arr, 1)
        if slope > 0 and over >= 0:
            return [float(1.0 / slope), float(over)]
    slope = float(np.sum(time_arr * size_arr) / np.sum(size_arr * size_arr))  # through the origin
    return [1.0 / slope, 0.0] if slope > 0 else None


def load_prior(source: PriorSource) -> dict[str, list[float]]:
    """Rates per device identity from a prior source (module docstring).

    Args:
        source: A mapping of rates, a decision log, a run directory, a profile, or a list.

    Returns:
        Device identity to ``[rate (samples/s), overhead (s)]``.

    Raises:
        ValueError: Naming ``prior``, for a source that cannot be read or gives no rate.
    """
    out: dict[str, list[float]] = {}
    items = (
        list(source)
        if isinstance(source, Sequence) and not isinstance(source, (str, bytes))
        else [source]
    )
    if not items:
        raise ValueError("prior: an empty list names no source")
    for item in items:
        out.update(_one(item))
    return out


def _one(item: Any) -> dict[str, list[float]]:
    if isinstance(item, Mapping):
        return _mapping(item)
    if not isinstance(item, (str, os.PathLike)):
        raise ValueError(
            f"prior must be rates per device, a decision log, a run directory or a profile;"
            f" got {type(item).__name__}"
        )
    path = Path(item)
    if path.is_dir():
        path = path / "rex_decisions.jsonl"
    if not path.is_file():
        raise ValueError(f"prior: no such file {str(path)!r}")
    if path.suffix == ".jsonl":
        return _from_log(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"prior: cannot read {str(path)!r} as JSON: {error}") from None
    rank = data.get("rank") if isinstance(data, dict) else None
    if not isinstance(rank, dict) or "curve" not in rank or not rank.get("device"):
        raise ValueError(
            f"prior: {str(path)!r} is not a profile from examples/profile_curve.py"
            " (it needs rank.curve and rank.device)"
        )
    try:
        sizes, seconds = zip(*[(float(b), float(s)) for b, s in rank["curve"]])
    except (TypeError, ValueError):
        raise ValueError(f"prior: {str(path)!r} has a malformed rank.curve") from None
    rate = fit_rate(sizes, seconds)
    if rate is None:
        raise ValueError(f"prior: no positive rate fits the curve in {str(path)!r}")
    return {str(rank["device"]): rate}


def _mapping(item: Mapping[Any, Any]) -> dict[str, list[float]]:
    out = {}
    for key, value in item.items():
        try:
            rate, over = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(
                f"prior[{key!r}] must be [rate (samples/s), overhead (s)], got {value!r}"
            ) from None
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(over) and over >= 0):
            raise ValueError(f"prior[{key!r}] needs a rate > 0 and an overhead >= 0, got {value!r}")
        out[str(key)] = [rate, over]
    if not out:
        raise ValueError("prior: the mapping names no device")
    return out


def _from_log(path: Path) -> dict[str, list[float]]:
    records = [r for r in DecisionLog.read(path) if "window" in r]
    if not records:
        raise ValueError(f"prior: {str(path)!r} holds no window records")
    last = records[-1].get("run_id")
    points: dict[str, tuple[list[float], list[float]]] = {}
    for record in records:
        devices, plan, medians = record.get("devices"), record.get("plan"), record.get("median_ms")
        if record.get("run_id") != last or not isinstance(devices, list):
            continue
        if not isinstance(plan, list) or not isinstance(medians, list) or len(plan) != len(devices):
            continue
        for device, size, median in zip(devices, plan, medians):
            if isinstance(size, (int, float)) and isinstance(median, (int, float)):
                sizes, seconds = points.setdefault(str(device), ([], []))
                sizes.append(float(size))
                seconds.append(float(median) / 1000.0)
    rates = {d: fit_rate(*p) for d, p in points.items()}
    out = {d: r for d, r in rates.items() if r is not None}
    if not out:
        raise ValueError(
            f"prior: the last run in {str(path)!r} has no records naming their devices"
            " (logs written before this version do not)"
        )
    return out
