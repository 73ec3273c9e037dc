"""A package's public names imported on first use (PEP 562 ``__getattr__`` and ``__dir__``).

``lightning_rex`` keeps its Lightning classes out of the import of the framework-free parts,
and ``lightning_rex.core`` keeps SciPy, BoTorch and torch out of the import of its light
modules; both name their lazy attributes in one table and take these two functions for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package whose names import on first use.

    Args:
        package: The package's ``__name__`` (for the error message).
        table: Each lazy name and the module that defines it.
        namespace: The package's ``globals()``: a name, once imported, is cached there.

    Returns:
        ``(__getattr__, __dir__)``.
    """

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_
