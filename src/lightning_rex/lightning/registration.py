"""Register ``"rex"`` with Lightning, and give Lightning's name checks what ``"ddp"`` gets.

``import lightning_rex`` (or the startup hook, :mod:`_lightning_rex_hook`, when the package is
installed) calls :func:`register_strategies` once ``lightning.pytorch`` is imported. It does
three things, none of which imports the strategy itself (it is imported when a Trainer
first asks for one):

* the names ``rex`` (popen), ``rex_spawn``, ``rex_fork`` and the class path
  ``lightning_rex.rexstrategy`` go into Lightning's ``StrategyRegistry``;
* Lightning's checks that go by the strategy *name* (strategies of the DDP family are
  rejected on MPS when the name holds ``"ddp"``; a fork alias is rejected where processes
  cannot fork) see the DDP name each rex name stands for, so ``strategy="rex"`` gets exactly
  the errors ``strategy="ddp"`` gets (with the rex name in the message);
* Lightning's "invalid strategy name" error gains a hint when the name is close to a rex name
  (``"rexx"``, ``"rex-fork"``).

The two checks are methods of Lightning's private ``_AcceleratorConnector``, wrapped once;
the package pins Lightning to a range in which they exist, and a test runs them.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from typing import Any

from lightning_rex.lightning.names import DDP_NAMES, START_METHODS, description

__all__ = ["name_hint", "register_names", "register_strategies"]

_WRAPPED = "_lightning_rex_checks"


def register_strategies() -> None:
    """Register the names and wrap Lightning's name checks (idempotent; Lightning is loaded).

    Fabric's registry gets ``rex`` and ``rex_fsdp`` too (for a
    :class:`~lightning_rex.lightning.fabric.RexLoop`).
    """
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    register_names(StrategyRegistry)
    if "rex_fsdp" not in StrategyRegistry:
        StrategyRegistry.register(
            "rex_fsdp",
            _rex_fsdp_strategy,
            description="REX uneven micro-batches over FSDP2 (fully_shard)",
        )
    for name, make in (("rex", _fabric_ddp), ("rex_fsdp", _fabric_fsdp)):
        if name not in STRATEGY_REGISTRY:
            STRATEGY_REGISTRY.register(name, make, description=f"lightning-rex {name} for Fabric")
    _wrap_name_checks()


def _rex_fsdp_strategy(**kwargs: Any) -> Any:
    from lightning_rex.lightning.fsdp import RexFSDPStrategy

    return RexFSDPStrategy(**kwargs)


def _fabric_ddp(**kwargs: Any) -> Any:
    from lightning_rex.lightning.fabric import RexFabricDDP

    return RexFabricDDP(**kwargs)


def _fabric_fsdp(**kwargs: Any) -> Any:
    from lightning_rex.lightning.fabric import RexFabricFSDP

    return RexFabricFSDP(**kwargs)


def _rex_strategy(**kwargs: Any) -> Any:
    """Build a RexStrategy: what the registry calls for a rex name (imports it on first use)."""
    from lightning_rex.lightning.strategy import RexStrategy

    return RexStrategy(**kwargs)


def register_names(registry: Any) -> None:
    """Register ``rex``, ``rex_spawn``, ``rex_fork`` and the class path (idempotent).

    Each name builds the strategy when a Trainer asks for it (which imports it then).

    Args:
        registry: Lightning's ``StrategyRegistry``.
    """
    for name, start_method in START_METHODS.items():
        if name not in registry:
            registry.register(
                name,
                _rex_strategy,
                description=description(start_method),
                start_method=start_method,
            )


def name_hint(strategy: object) -> str | None:
    """A hint for a strategy name close to a rex name, or None.

    Args:
        strategy: The ``strategy`` a Trainer was given.

    Returns:
        ``"Did you mean 'rex'? ..."``, or None when the name is not close to one.
    """
    if not isinstance(strategy, str):
        return None
    names = ["rex", "rex_spawn", "rex_fork"]
    name = strategy.lower()
    close = difflib.get_close_matches(name.replace("-", "_"), names, n=1, cutoff=0.6)
    if not close and not name.startswith("rex"):
        return None
    guess = close[0] if close else "rex"
    return (
        f"Did you mean strategy={guess!r}? lightning-rex registers 'rex' (the popen start "
        "method, as 'ddp'), 'rex_spawn' and 'rex_fork' when it is installed or imported "
        "(see its README)."
    )


def _as_rex(err: ValueError, rex: str, ddp: str) -> ValueError:
    text = str(err)
    for quoted in (f"'{ddp}'", f"={ddp}`", f"={ddp})"):
        text = text.replace(quoted, quoted.replace(ddp, rex))
    return ValueError(text)


def _checked_config(check: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(check)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = kwargs["strategy"] if "strategy" in kwargs else (args[0] if args else None)
        rex = strategy.lower() if isinstance(strategy, str) else None
        if rex not in DDP_NAMES:
            try:
                return check(self, *args, **kwargs)
            except ValueError as err:
                hint = name_hint(strategy)
                if hint is None or "invalid strategy name" not in str(err):
                    raise
                raise ValueError(f"{err} {hint}") from None
        assert rex is not None
        ddp = DDP_NAMES[rex]
        if "strategy" in kwargs:
            kwargs["strategy"] = ddp
        else:
            args = (ddp, *args[1:])
        try:
            out = check(self, *args, **kwargs)
        except ValueError as err:
            raise _as_rex(err, rex, ddp) from None
        self._strategy_flag = rex
        return out

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _checked_fallback(check: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(check)
    def wrapper(self: Any) -> Any:
        rex = self._strategy_flag
        if not (isinstance(rex, str) and rex in DDP_NAMES):
            return check(self)
        ddp = DDP_NAMES[rex]
        self._strategy_flag = ddp
        try:
            out = check(self)
        except ValueError as err:
            raise _as_rex(err, rex, ddp) from None
        finally:
            if self._strategy_flag == ddp:
                self._strategy_flag = rex
        return out

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _wrap_name_checks() -> None:
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    for attr, wrap in (
        ("_check_config_and_set_final_flags", _checked_config),
        ("_check_strategy_and_fallback", _checked_fallback),
    ):
        method = getattr(_AcceleratorConnector, attr)
        if not getattr(method, _WRAPPED, False):
            setattr(_AcceleratorConnector, attr, wrap(method))


def register_when_lightning_loads() -> None:
    """Register now if Lightning is imported, else right after it is (``import lightning_rex``)."""
    from _lightning_rex_hook import TARGET, after_import

    after_import(TARGET, register_strategies)
