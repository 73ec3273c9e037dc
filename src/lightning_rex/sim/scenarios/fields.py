"""Checks of a scenario mapping's fields: allowed keys, numbers in range, named in errors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lightning_rex.sim.scenarios.errors import ScenarioError

__all__ = ["check_keys", "number"]


def check_keys(d: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    """``d`` as a mapping whose keys are all ``allowed``.

    Args:
        d: The value.
        allowed: The keys it may have.
        where: Its name, for errors (``"scenario"`` for the top level).

    Returns:
        ``d``.

    Raises:
        ScenarioError: For a value that is not a mapping, or an unknown key.
    """
    if not isinstance(d, Mapping):
        raise ScenarioError(f"{where} must be a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ScenarioError(
            f"unknown key {where + '.' if where != 'scenario' else ''}{unknown[0]!s} in {where}; "
            f"allowed: {sorted(allowed)}"
        )
    return d


def number(
    d: Mapping[str, Any],
    key: str,
    where: str,
    default: Any = None,
    *,
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
    integer: bool = False,
) -> Any:
    """The number ``d[key]``, checked.

    Args:
        d: The mapping.
        key: The field.
        where: The mapping's dotted name with a trailing dot, for errors.
        default: The value when ``key`` is absent; None: the field is required.
        lo: The smallest value allowed (None for none).
        lo_open: ``lo`` itself is not allowed.
        hi: The largest value allowed (None for none).
        integer: The value must be an integer (returned as ``int``).

    Returns:
        The value, ``int`` or ``float``.

    Raises:
        ScenarioError: Naming the field: missing, not a finite number, not an integer, or
            out of range.
    """
    if key not in d:
        if default is None:
            raise ScenarioError(f"missing required field {where}{key}")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(f"{where}{key} must be a finite number, got {value!r}")
    if integer and int(value) != value:
        raise ScenarioError(f"{where}{key} must be an integer, got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ScenarioError(f"{where}{key} must be {'>' if lo_open else '>='} {lo}, got {value!r}")
    if hi is not None and value > hi:
        bound = f"{int(hi):,}" if integer else f"{hi:g}"
        raise ScenarioError(f"{where}{key} must be <= {bound}, got {value!r}")
    return int(value) if integer else float(value)
