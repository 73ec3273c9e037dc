"""The window driver's plan target in training: the train sampler the strategy holds.

:class:`TrainSampler` implements :class:`~lightning_rex.driver.protocols.PlanTarget` over
``RexStrategy``'s train loader: whichever sampler the strategy holds at each call (a loader
rebuilt during a fit brings a new sampler serving the same schedule), resizing Lightning's
epoch when a new global batch re-cuts the rest of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule
from lightning_rex.data.loader import RexDataLoader
from lightning_rex.data.sampler import UnevenBatchSampler
from lightning_rex.driver.protocols import Resumed

__all__ = ["TrainSampler"]


class TrainSampler:
    """The driver's plan target: the train sampler the strategy holds at each call.

    A loader rebuilt during a fit (``reload_dataloaders_every_n_epochs``) brings a new
    sampler serving the same schedule; the driver keeps talking to the current one.

    Args:
        loader: Returns the strategy's train loader now.
        resize_epoch: Tells Lightning the epoch's length anew.
    """

    def __init__(
        self, loader: Callable[[], RexDataLoader | None], resize_epoch: Callable[[], None]
    ) -> None:
        self._loader, self._resize = loader, resize_epoch

    def _sampler(self) -> UnevenBatchSampler:
        loader = self._loader()
        assert loader is not None
        return loader.batch_sampler

    @property
    def plan_schedule(self) -> PlanSchedule:
        """The run's plan schedule."""
        return self._sampler().plan_schedule

    @property
    def resumed(self) -> Resumed | None:
        """How the sampler restored a checkpoint's schedule (None: it did not)."""
        sampler = self._sampler()
        if sampler.continues is None:
            return None
        return Resumed(sampler.continues, sampler.recut_reason)

    def first_free_step(self) -> int:
        """The first step none of whose batches this rank has fetched."""
        return self._sampler().first_free_step()

    def schedule_plan(self, plan: Sequence[int], step: int) -> Plan:
        """Put ``plan`` in force from ``step`` in the current sampler.

        Args:
            plan: The per-rank sizes.
            step: The first step that uses them.

        Returns:
            The validated plan.
        """
        sampler = self._sampler()
        before = len(sampler)
        out = sampler.schedule_plan(plan, step)
        if len(sampler) != before:
            # a new global batch re-cut the rest of the epoch (every rank schedules the same
            # plan at the same step, so every rank resizes alike)
            self._resize()
        return out
