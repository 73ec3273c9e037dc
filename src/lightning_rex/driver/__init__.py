"""The framework-free window loop shared by training and the simulator.

:class:`WindowDriver` turns each rank's step times into windows, hands them to the decider
on rank 0, exchanges its decisions at agreed steps and schedules plans. It talks to the world
through two small protocols, :class:`Collectives` and :class:`PlanTarget`; training supplies
``torch.distributed`` and the uneven batch sampler, the simulator in-process stand-ins.
Nothing here imports Lightning or ``torch.distributed``.
"""

from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.errors import RexRankError
from lightning_rex.driver.exchange import ExchangeMessage
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.observer import BackgroundObserver
from lightning_rex.driver.protocols import (
    Collectives,
    Decider,
    LocalCollectives,
    PlanTarget,
    ScheduleTarget,
)
from lightning_rex.driver.records import DecisionLog, build_record, window_metrics

__all__ = [
    "BackgroundObserver",
    "Collectives",
    "Decider",
    "DecisionLog",
    "ExchangeMessage",
    "LocalCollectives",
    "LoopConfig",
    "PlanTarget",
    "RexRankError",
    "ScheduleTarget",
    "WindowDriver",
    "build_record",
    "window_metrics",
]
