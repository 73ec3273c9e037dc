"""A prior for a fresh fit's first plan: rates per device, from a previous run or a profile.

``RexCallback(prior=...)`` takes what rex already knows about the devices, so that a fresh
fit starts from a fitted plan instead of the even split (every rank then pays one new shape
at the start instead of another after the first window). :func:`load_prior` reads it:

* a mapping ``{device: [rate (samples/s), overhead (s)]}``, as a checkpoint's
  ``device_rates`` holds it, each value a list or tuple of two real numbers (no string,
  mapping or bool);
* a previous run's decision log (``rex_decisions.jsonl``, or a run directory holding one):
  each device's ``median = overhead + size / rate`` fitted by least squares over every
  window of its ranks in the log's last run (the records name each rank's ``devices``),
  streamed line by line up to :data:`~lightning_rex.driver.records.MAX_LOG_BYTES`;
* a profile written by ``examples/profile_curve.py`` (a ``.json`` whose ``rank`` holds the
  measured ``curve`` and the ``device``), up to :data:`MAX_PROFILE_BYTES`, fitted the same
  way, and refused if its time falls as the size grows (a log's may: a device that slowed
  mid-run got a smaller size, and :func:`fit_rate` fits it through the origin);
* a list of any of these, merged (a later source wins for a device both name).

Every size and time read must be a finite number > 0 (a time at most :data:`MAX_STEP_S`),
every rate finite and > 0 and every overhead finite and >= 0; anything else is a
``ValueError`` starting with ``prior`` that names the file (and line), device and value.
The plan is used only when every rank's device is in the prior (see
:func:`~lightning_rex.core.plans.minimax.plan_from_device_rates`); otherwise rank 0 warns at
a fresh fit's start, naming the devices missing (:func:`missing_devices`). Rank 0's prior is
the one all ranks use. The controller then validates and refines it like any other plan.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_rex.driver import records
from lightning_rex.driver.records import skipped_lines_message, stream_records

__all__ = [
    "MAX_PROFILE_BYTES",
    "MAX_STEP_S",
    "PriorSource",
    "fit_rate",
    "load_prior",
    "missing_devices",
    "warn_uncovered",
]

PriorSource = Mapping[str, Sequence[float]] | str | os.PathLike[str] | Sequence[Any]
"""What ``prior`` accepts: rates, a decision log or run directory, a profile, or a list."""

MAX_PROFILE_BYTES = 16 << 20
"""The largest profile (``.json``) read as a prior (16 MiB; a profile is a few KB)."""
MAX_STEP_S = 86_400.0
"""The longest time a prior reads (a day): a longer median or profile time is corrupt."""


def fit_rate(
    sizes: Sequence[float], seconds: Sequence[float], counts: Sequence[float] | None = None
) -> list[float] | None:
    """``[rate, overhead]`` of ``seconds = overhead + size / rate`` by least squares.

    Args:
        sizes: Micro-batch sizes.
        seconds: The times measured at them.
        counts: How many measurements each time is the mean of (the fit's weights); one
            each when None.

    Returns:
        ``[samples/s, s]``; through the origin when the sizes are all equal or the fitted
        line has a negative overhead or no positive slope (in a log, a device that slowed
        mid-run got a smaller size; a profile's falling curve is refused before this); None
        when no positive rate fits. Extreme times may give an infinite rate: callers check.
    """
    size_arr = np.asarray(sizes, dtype=np.float64)
    time_arr = np.asarray(seconds, dtype=np.float64)
    weight = np.ones_like(size_arr) if counts is None else np.asarray(counts, dtype=np.float64)
    valid = np.isfinite(size_arr) & np.isfinite(time_arr) & (size_arr > 0) & (time_arr > 0)
    valid &= np.isfinite(weight) & (weight > 0)
    size_arr, time_arr, weight = size_arr[valid], time_arr[valid], weight[valid]
    if not size_arr.size:
        return None
    line = _line(size_arr, time_arr, weight)
    if line is not None and line[0] > 0 and line[1] >= 0:
        return [1.0 / line[0], line[1]]
    with np.errstate(all="ignore"):
        slope = float(np.sum(weight * time_arr * size_arr) / np.sum(weight * size_arr**2))
    return [1.0 / slope, 0.0] if slope > 0 else None  # through the origin


def _line(sizes: np.ndarray, seconds: np.ndarray, weight: np.ndarray) -> tuple[float, float] | None:
    """The least-squares ``(slope, overhead)``; None for fewer than two sizes or no fit."""
    if np.unique(sizes).size < 2:
        return None
    try:
        with np.errstate(all="ignore"):
            slope, over = np.polyfit(sizes, seconds, 1, w=np.sqrt(weight))
    except (np.linalg.LinAlgError, ValueError):  # inf or NaN from overflowing values
        return None
    return float(slope), float(over)


def missing_devices(prior: Mapping[str, Any], device_keys: Sequence[str]) -> list[str]:
    """The device identities of a run that a prior has no rates for.

    Args:
        prior: Rates per device identity (:func:`load_prior`).
        device_keys: Each rank's device identity.

    Returns:
        The missing identities, each once, in rank order (empty: the prior covers the run).
    """
    return list(dict.fromkeys(str(k) for k in device_keys if k not in prior))


def warn_uncovered(prior: Mapping[str, Any], device_keys: Sequence[str]) -> None:
    """Warn that a prior misses some rank's device, naming them (rank 0, a fresh start).

    Args:
        prior: Rates per device identity (:func:`load_prior`).
        device_keys: Each rank's device identity.
    """
    missing = missing_devices(prior, device_keys)
    if missing:
        warnings.warn(
            f"prior: no rates for device(s) {missing} of this run (the prior has"
            f" {sorted(prior)}), so the fit starts from the schedule's plan (the even split"
            " unless one was given), not one fitted from the prior",
            UserWarning,
            stacklevel=4,  # the line that called WindowDriver.start
        )


def load_prior(source: PriorSource) -> dict[str, list[float]]:
    """Rates per device identity from a prior source (module docstring).

    Args:
        source: A mapping of rates, a decision log, a run directory, a profile, or a list.

    Returns:
        Device identity to ``[rate (samples/s), overhead (s)]``.

    Raises:
        ValueError: Starting with ``prior`` and naming the file, device and value, for a
            source that cannot be read, holds a malformed value or gives no valid rate.
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


def _real(value: Any) -> bool:
    """Whether ``value`` is a real number: not a bool, a string or a container."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _positive(value: Any, most: float = math.inf) -> bool:
    return _real(value) and math.isfinite(value) and 0 < value <= most


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _checked(rate: float, over: float, at: str) -> list[float]:
    """``[rate, over]`` if the rate is finite and > 0 and the overhead finite and >= 0."""
    if not (math.isfinite(rate) and rate > 0 and math.isfinite(over) and over >= 0):
        raise ValueError(
            f"{at} needs a rate > 0 and an overhead >= 0, both finite; got [{rate!r}, {over!r}]"
        )
    return [rate, over]


def _one(item: Any) -> dict[str, list[float]]:
    if isinstance(item, Mapping):
        return _mapping(item)
    name = os.fspath(item) if isinstance(item, (str, os.PathLike)) else None
    if not isinstance(name, str):
        raise ValueError(
            "prior must be rates per device, a decision log, a run directory or a profile;"
            f" got {type(item).__name__} {_show(item)}"
        )
    if not name.strip():  # Path("") is ".": no silent default
        raise ValueError("prior: an empty path names no file")
    path = Path(name)
    if path.is_dir():
        path = path / "rex_decisions.jsonl"
    if not path.is_file():
        raise ValueError(f"prior: no such file {str(path)!r}")
    log = path.suffix == ".jsonl"
    limit, what = (records.MAX_LOG_BYTES, "decision log") if log else (MAX_PROFILE_BYTES, "profile")
    size = os.stat(path).st_size
    if size > limit:
        raise ValueError(
            f"prior: {str(path)!r} is {size:,} bytes; a {what} is read up to {limit:,}"
        )
    return _from_log(path) if log else _from_profile(path)


def _mapping(item: Mapping[Any, Any]) -> dict[str, list[float]]:
    out = {}
    for key, value in item.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"prior: a device identity must be a non-empty string, got {key!r}")
        if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_real, value))):
            raise ValueError(
                f"prior[{key!r}] must be [rate (samples/s), overhead (s)], two real numbers,"
                f" got {_show(value)}"
            )
        out[key] = _checked(float(value[0]), float(value[1]), f"prior[{key!r}]")
    if not out:
        raise ValueError("prior: the mapping names no device")
    return out


def _from_profile(path: Path) -> dict[str, list[float]]:
    file = str(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as error:
        raise ValueError(f"prior: cannot read {file!r} as JSON: {error}") from None
    rank = data.get("rank") if isinstance(data, dict) else None
    device = rank.get("device") if isinstance(rank, dict) else None
    if not isinstance(rank, dict) or "curve" not in rank or not isinstance(device, str):
        raise ValueError(
            f"prior: {file!r} is not a profile from examples/profile_curve.py"
            " (it needs rank.curve and rank.device, a device name)"
        )
    curve = rank["curve"]
    if not isinstance(curve, list) or not curve:
        raise ValueError(f"prior: {file!r} has a malformed rank.curve: {_show(curve)}")
    for i, point in enumerate(curve):
        pair = isinstance(point, list) and len(point) == 2
        if not (pair and _positive(point[0]) and _positive(point[1], MAX_STEP_S)):
            raise ValueError(
                f"prior: {file!r} rank.curve[{i}] of device {device!r} is {_show(point)}; a"
                f" point is [size, seconds], finite numbers > 0 (seconds at most {MAX_STEP_S:g})"
            )
    sizes, seconds = np.array(curve, dtype=np.float64).T
    line = _line(sizes, seconds, np.ones_like(sizes))
    if line is not None and not line[0] > 0:
        raise ValueError(
            f"prior: in {file!r} the time of device {device!r} does not grow with the size"
            f" (fitted slope {line[0]:.3g} s/sample): no rate fits its curve"
        )
    return {device: _fitted(device, sizes, seconds, None, file)}


def _fitted(device: str, sizes: Any, seconds: Any, counts: Any, file: str) -> list[float]:
    rate = fit_rate(sizes, seconds, counts)
    at = f"prior: {file!r}: device {device!r}"
    if rate is None:  # times so small that the fit underflows
        raise ValueError(f"{at}: no rate fits its times, {min(seconds):.3g} s and up")
    return _checked(rate[0], rate[1], at)


def _problem(device: Any, size: Any, median: Any) -> str | None:
    if not _positive(size):
        return f"plan of device {str(device)!r} is {_show(size)}; a size must be finite and > 0"
    if not _positive(median, 1000.0 * MAX_STEP_S):
        return (
            f"median_ms of device {str(device)!r} is {_show(median)}; a median must be finite,"
            f" > 0 and at most {1000.0 * MAX_STEP_S:g} ms"
        )
    return None


def _from_log(path: Path) -> dict[str, list[float]]:
    """Fit each device of the log's last run, streaming the log (module docstring)."""
    file, bad, last = str(path), list[int](), None
    # per run: each device's {size: [windows, sum of seconds]}, and the run's first bad value
    points: dict[str, dict[str, dict[float, list[float]]]] = {}
    problems: dict[str, str] = {}
    for number, record in stream_records(path, bad):
        if "window" not in record:
            continue
        last = repr(record.get("run_id"))
        run = points.setdefault(last, {})
        devices, plan, medians = record.get("devices"), record.get("plan"), record.get("median_ms")
        if not isinstance(devices, list) or last in problems:
            continue  # a log written before records named their devices; or one bad already
        at = f"prior: {file!r} line {number} (window {_show(record['window'])})"
        if not (isinstance(plan, list) and isinstance(medians, list)) or not (
            len(plan) == len(medians) == len(devices)
        ):
            problems[last] = f"{at}: plan, median_ms and devices must be lists of one length"
            continue
        for device, size, median in zip(devices, plan, medians):
            problem = _problem(device, size, median)
            if problem is not None:
                problems[last] = f"{at}: {problem}"
                break
            cell = run.setdefault(str(device), {}).setdefault(float(size), [0.0, 0.0])
            cell[0] += 1.0
            cell[1] += float(median) / 1000.0
    if bad:
        warnings.warn(skipped_lines_message(path, bad), stacklevel=4)
    if last is None:
        raise ValueError(f"prior: {file!r} holds no window records")
    if last in problems:
        raise ValueError(problems[last])
    if not points[last]:
        raise ValueError(
            f"prior: the last run in {file!r} has no records naming their devices"
            " (logs written before this version do not)"
        )
    out = {}
    for device, cells in points[last].items():
        counts, totals = zip(*cells.values())
        means = [t / n for n, t in zip(counts, totals)]
        out[device] = _fitted(device, list(cells), means, counts, file)
    return out
