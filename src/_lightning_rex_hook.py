"""lightning-rex's startup hook: ``strategy="rex"`` works without ``import lightning_rex``.

The package installs ``lightning_rex.pth`` beside itself in site-packages; Python runs its
one line, :func:`install`, when the interpreter starts. That puts a one-shot finder at the
front of ``sys.meta_path`` and nothing else: no part of lightning-rex, Lightning or torch is
imported. When a program imports ``lightning.pytorch``, the finder runs
:func:`lightning_rex.lightning.registration.register_strategies` right after it has finished
importing: the names ``rex``, ``rex_spawn`` and ``rex_fork`` are registered (the strategy
itself is imported when a Trainer first asks for one), and Lightning's errors for a wrong
strategy name gain a hint. ``import lightning_rex`` does the same, through :func:`after_import`.

Set ``LIGHTNING_REX_NO_HOOK=1`` to turn the startup hook off; ``import lightning_rex`` then
registers the names as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["after_import", "install"]

TARGET = "lightning.pytorch"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run a function once, right after a module has finished importing."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot, and out of the way of the search below
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, then = loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                then()
            except Exception as err:  # never break the user's import of Lightning
                warnings.warn(
                    f"lightning-rex could not register its strategies with Lightning: {err!r}",
                    stacklevel=2,
                )

        loader.exec_module = exec_module
        return spec


def after_import(name: str, then: Callable[[], None]) -> None:
    """Run ``then`` now if ``name`` is imported, else once right after it is (idempotent).

    Args:
        name: A module name.
        then: What to run.
    """
    if name in sys.modules:
        then()
        return
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def _register() -> None:
    from lightning_rex.lightning.registration import register_strategies

    register_strategies()


def install() -> None:
    """The startup hook: register the strategies once Lightning is imported (see above)."""
    if os.environ.get("LIGHTNING_REX_NO_HOOK", "") not in ("", "0"):
        return
    after_import(TARGET, _register)
