"""Type checks shared by the settings objects: a finite real number, a true integer."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["is_integer", "is_number"]


def is_number(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (not a bool, not NaN or infinite).

    Args:
        v: Any value.

    Returns:
        True for a finite real number.
    """
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_integer(v: Any) -> bool:
    """Whether ``v`` is an int (not a bool; a float such as 2.0 is not).

    Args:
        v: Any value.

    Returns:
        True for an integer.
    """
    return isinstance(v, int) and not isinstance(v, bool)
