"""Register ``"rex"`` with Lightning when Lightning is there, without importing it here.

``import lightning_rex`` must make ``Trainer(strategy="rex")`` work, but the framework-free
parts of the package (``lightning_rex.core``, ``.driver``, ``.sim``) must import without
Lightning or ``torch.distributed``, and importing any of them runs the root package first.
So the root package calls :func:`register_when_lightning_loads`: when ``lightning.pytorch``
is already imported, the strategies are registered at once; otherwise a one-shot import
hook registers them right after ``lightning.pytorch`` finishes importing, whoever imports
it. Nothing here imports Lightning itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["register_strategies", "register_when_lightning_loads"]

_TARGET = "lightning.pytorch"


def register_strategies() -> None:
    """Register ``rex``, ``rex_spawn`` and ``rex_fork`` (idempotent; imports Lightning)."""
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_rex.lightning.strategy import RexStrategy

    RexStrategy.register_strategies(StrategyRegistry)


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


def register_when_lightning_loads() -> None:
    """Register the strategies now if Lightning is imported, else right after it is."""
    if _TARGET in sys.modules:
        register_strategies()
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_TARGET, register_strategies))
