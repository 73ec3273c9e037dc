"""What the callback needs from a strategy that splits the global batch unevenly.

:class:`~lightning_rex.RexStrategy` imports and attaches :class:`~lightning_rex.RexCallback`,
so the callback cannot import the strategy; it asks for this protocol instead of probing
attribute names. A strategy that does not follow it (plain ``ddp``) gets the callback in
monitor-only use.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.data.weighting import LossReduction
from lightning_rex.driver.protocols import PlanTarget

__all__ = ["ReportsHandledExceptions", "UnevenStrategy"]


@runtime_checkable
class UnevenStrategy(Protocol):
    """A strategy whose train sampler serves a plan schedule (``RexStrategy``).

    Attributes:
        adaptive: Whether the callback may change the plan.
        loss_reduction: What a training step's loss is over its micro-batch.
        batch_range: ``(min, max)`` global batches plans may sum to (global batch scaling),
            set by the callback before the train loader is built; None keeps ``B``.
    """

    adaptive: bool
    loss_reduction: LossReduction
    batch_range: tuple[int, int] | None

    @property
    def plan_target(self) -> PlanTarget | None:
        """The window driver's plan target (None before the train loader exists)."""
        ...

    @property
    def bounds(self) -> SizeBounds:
        """The size bounds every plan obeys."""
        ...

    def current_batch_sizes(self) -> Plan | None:
        """The per-rank sizes of the batch being trained (None outside training)."""
        ...

    def pass_cap(self) -> int | None:
        """The largest micro-batch this rank trains in one pass now (None: no cap)."""
        ...

    def passes_for(self, size: int) -> list[int]:
        """The accumulation passes ``size`` samples run as on this rank."""
        ...

    def set_memory_cap(self, cap: int | None) -> None:
        """The pass cap this rank's memory allows, from the next step (measured on CUDA)."""
        ...


class ReportsHandledExceptions:
    """A strategy that says when every ``on_exception`` hook has run (a marker base class).

    It calls :func:`~lightning_rex.lightning.callback.exceptions_handled` from its own
    ``on_exception`` and its ``teardown``. A :class:`~lightning_rex.RexCallback` keeps its
    hang watchdog and signal handlers through an exception's handlers only under such a
    strategy (not a protocol: a strategy that only looks alike would never stop them).
    """
