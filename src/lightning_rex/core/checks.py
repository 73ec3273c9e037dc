"""Checks shared by the settings objects: a finite real number, a true integer, known keywords."""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["check_keywords", "is_integer", "is_number", "keywords_checked"]

_F = TypeVar("_F", bound=Callable[..., Any])


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


def check_keywords(
    owner: str, given: Iterable[str], valid: Iterable[str], takes: str | None = None
) -> None:
    """Raise for a keyword argument that ``owner`` does not take, naming the closest one.

    Args:
        owner: What was called (``"RexStrategy"``), for the message.
        given: The keyword arguments passed.
        valid: The keyword arguments it takes.
        takes: What it takes, in words, when nothing is close (default: the list).

    Raises:
        TypeError: ``RexStrategy() got an unexpected keyword argument 'micro_batch_size';
            did you mean 'micro_batch_sizes'?``, for the first unknown keyword.
    """
    names = sorted(set(valid))
    for key in given:
        if key in names:
            continue
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        hint = (
            f"; did you mean {close[0]!r}?" if close else f"; it takes {takes or ', '.join(names)}"
        )
        raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}")


def keywords_checked(init: _F) -> _F:
    """Decorate an ``__init__``: an unknown keyword raises naming the closest valid one.

    Python's own error names the argument only; this one adds the closest argument the
    class takes. The signature is kept (LightningCLI and ``inspect`` see the original).

    Args:
        init: An ``__init__`` without ``**kwargs``.

    Returns:
        The checked ``__init__``.
    """
    params = inspect.signature(init).parameters
    valid = [
        name
        for name, p in params.items()
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    owner = init.__qualname__.rsplit(".", 1)[0]

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        check_keywords(type(self).__name__ if owner == "__init__" else owner, kwargs, valid)
        return init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
