"""Checking saved state before it is trusted: typed readers that name the offending field.

A checkpoint is data from outside the run: a resumed run must not train on a plan that no
longer sums to the global batch, a position outside the epoch or a controller state of the
wrong shape. Every reader here takes the value and the dotted name of the field it came
from (``"rex_sampler.schedule[1]"``), and raises :class:`StateError` naming that field and
what was expected, so that an error reads like a configuration error, never like a bare
``KeyError`` or ``IndexError`` from deep inside a resumed run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "StateError",
    "field",
    "flag",
    "float_list",
    "int_list",
    "matrix",
    "optional",
    "real",
    "whole",
]


class StateError(ValueError):
    """Saved state that breaks an invariant of the run.

    Args:
        name: The dotted name of the offending field.
        problem: What is wrong with it, including the expected values.

    Attributes:
        field: The dotted name of the offending field.
    """

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"invalid checkpoint state: {name} {problem}")
        self.field = name


def field(d: Any, key: str, where: str) -> Any:
    """Read ``d[key]`` from a mapping, naming ``where.key`` when it is missing.

    Args:
        d: The mapping (anything else is an error).
        key: The key.
        where: The dotted name of ``d``.

    Returns:
        The value.

    Raises:
        StateError: If ``d`` is not a mapping or lacks ``key``.
    """
    if not isinstance(d, Mapping):
        raise StateError(where, f"must be a mapping, got {type(d).__name__}")
    if key not in d:
        raise StateError(f"{where}.{key}", "is missing")
    return d[key]


def whole(v: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer within ``[lo, hi]`` (bools and floats, even integral ones, are rejected).

    Args:
        v: The value.
        name: The field's dotted name.
        lo: The smallest allowed value, or None.
        hi: The largest allowed value, or None.

    Returns:
        The value as a Python int.

    Raises:
        StateError: Naming the field and the allowed range.
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        # a float is never what a run saved, not even 8.0 (nor NaN or inf)
        raise StateError(name, f"must be an integer, got {v!r}")
    out = int(v)
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        span = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise StateError(name, f"must be in {span}, got {out}")
    return out


def real(v: Any, name: str, positive: bool = False) -> float:
    """A finite float (``> 0`` when ``positive``).

    Args:
        v: The value.
        name: The field's dotted name.
        positive: Require ``v > 0``.

    Returns:
        The value as a Python float.

    Raises:
        StateError: Naming the field.
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise StateError(name, f"must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise StateError(name, f"must be > 0, got {v!r}")
    return float(v)


def flag(v: Any, name: str) -> bool:
    """A boolean (nothing else: ``bool(nan)`` would be True).

    Args:
        v: The value.
        name: The field's dotted name.

    Returns:
        The value.

    Raises:
        StateError: Naming the field.
    """
    if not isinstance(v, bool):
        raise StateError(name, f"must be true or false, got {v!r}")
    return v


def optional(v: Any, read: Any, name: str, *args: Any) -> Any:
    """``None`` stays None; anything else goes through ``read(v, name, *args)``.

    Args:
        v: The value.
        read: A reader such as :func:`whole` or :func:`int_list`.
        name: The field's dotted name.
        *args: Further arguments for ``read``.

    Returns:
        None or the read value.
    """
    return None if v is None else read(v, name, *args)


def _sequence(v: Any, name: str, length: int | None) -> Sequence[Any]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise StateError(name, f"must be a list, got {type(v).__name__}")
    if length is not None and len(v) != length:
        raise StateError(name, f"must have {length} entries, got {len(v)}")
    return v


def int_list(v: Any, name: str, length: int | None = None, lo: int | None = None) -> list[int]:
    """A list of integers, optionally of a given length and ``>= lo``.

    Args:
        v: The value.
        name: The field's dotted name.
        length: The required length, or None.
        lo: The smallest allowed entry, or None.

    Returns:
        The list.

    Raises:
        StateError: Naming the field (and the entry).
    """
    seq = _sequence(v, name, length)
    return [whole(x, f"{name}[{i}]", lo) for i, x in enumerate(seq)]


def float_list(v: Any, name: str, length: int | None = None, positive: bool = False) -> list[float]:
    """A list of finite floats, optionally of a given length and all ``> 0``.

    Args:
        v: The value.
        name: The field's dotted name.
        length: The required length, or None.
        positive: Require every entry ``> 0``.

    Returns:
        The list.

    Raises:
        StateError: Naming the field (and the entry).
    """
    seq = _sequence(v, name, length)
    return [real(x, f"{name}[{i}]", positive) for i, x in enumerate(seq)]


def matrix(
    v: Any, name: str, rows: int | None = None, cols: int | None = None, positive: bool = False
) -> list[list[float]]:
    """A rectangular list of lists of finite floats.

    Args:
        v: The value.
        name: The field's dotted name.
        rows: The required number of rows, or None.
        cols: The required row length, or None (then every row has the first row's length).
        positive: Require every entry ``> 0``.

    Returns:
        The rows.

    Raises:
        StateError: Naming the field and the row whose length differs.
    """
    out = [
        float_list(r, f"{name}[{i}]", None, positive)
        for i, r in enumerate(_sequence(v, name, rows))
    ]
    want = cols if cols is not None else (len(out[0]) if out else None)
    for index, row in enumerate(out):
        if want is not None and len(row) != want:
            raise StateError(
                f"{name}[{index}]", f"must have {want} entries like every row, got {len(row)}"
            )
    return out
