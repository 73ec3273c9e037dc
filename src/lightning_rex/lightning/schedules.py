"""Learning-rate schedules under global batch scaling: AdaScale's scale-invariant iterations.

AdaScale (Johnson et al., *AdaScale SGD*, ICML 2020, alg. 1) runs a schedule written for
the base batch ``B0`` in *scale-invariant iterations*: a step at a larger batch, whose rate
is scaled by the gain ``r_t``, counts as ``r_t`` iterations of the schedule, so that the
schedule's decays fall at the same statistical progress whatever the batch.

:class:`ScaleInvariantScheduler` stands in for a step-interval scheduler of
``trainer.lr_scheduler_configs`` while global batch scaling is on
(:func:`wrap_schedulers`). When Lightning steps it:

* under ``lr_rule="adascale"`` the wrapped scheduler is stepped as many times as whole
  scale-invariant iterations have accrued since (the gains summed,
  :attr:`~lightning_rex.lightning.scaling.TrainingScaling.iterations`): at a gain of 2.5 it
  steps 2 and 3 times alternately; under the other rules, once, as Lightning would;
* the scheduler sees its own rates: the scaling factor is divided out of every param
  group's ``lr`` before it steps and multiplied back after, so a closed-form schedule
  (``LambdaLR``, ``OneCycleLR``, ``CosineAnnealingLR``'s closed form) no longer overwrites
  the factor, and a chainable one (``StepLR``, ``ExponentialLR``) gets the same rates as
  before.

Epoch-interval schedulers and ``ReduceLROnPlateau`` (which follows a metric, not
iterations) are left as they are.
"""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import ReduceLROnPlateau

from lightning_rex.lightning.scaling import TrainingScaling

__all__ = ["ScaleInvariantScheduler", "unwrap_schedulers", "wrap_schedulers"]


class ScaleInvariantScheduler:
    """A step-interval scheduler that advances in scale-invariant iterations.

    Args:
        inner: The scheduler (a ``torch.optim.lr_scheduler.LRScheduler``).
        scaling: This rank's global batch scaling (its factor and iterations).
        frequency: Optimizer steps per Lightning call of :meth:`step` (the config's).

    Attributes:
        done: Steps of ``inner`` taken, in whole scale-invariant iterations / ``frequency``.
    """

    def __init__(self, inner: Any, scaling: TrainingScaling, frequency: int = 1) -> None:
        self.inner = inner
        self.scaling = scaling
        self.frequency = max(1, int(frequency))
        self.done = int(scaling.iterations // self.frequency)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the scheduler once per whole scale-invariant iteration accrued, on its rates.

        Args:
            *args: Passed to the scheduler's ``step``.
            **kwargs: Passed to the scheduler's ``step``.
        """
        due = max(0, int(self.scaling.iterations // self.frequency) - self.done)
        factor = self.scaling.rate.factor
        groups = self.inner.optimizer.param_groups
        for group in groups:
            group["lr"] = group["lr"] / factor
        try:
            for _ in range(due):
                self.inner.step(*args, **kwargs)
        finally:
            for group in groups:
                group["lr"] = group["lr"] * factor
        self.done += due

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (checkpoints hold the scheduler's own)."""
        return dict(self.inner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scheduler's state.

        Args:
            state: From :meth:`state_dict`.
        """
        self.inner.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        # everything else (optimizer, last_epoch, get_last_lr, ...) is the scheduler's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def wrap_schedulers(configs: Any, scaling: TrainingScaling) -> int:
    """Put every step-interval scheduler of ``trainer.lr_scheduler_configs`` under scaling.

    Args:
        configs: The trainer's ``lr_scheduler_configs``.
        scaling: This rank's global batch scaling.

    Returns:
        The number of schedulers wrapped.
    """
    wrapped = 0
    for config in configs:
        scheduler = config.scheduler
        if config.interval != "step" or isinstance(
            scheduler, (ReduceLROnPlateau, ScaleInvariantScheduler)
        ):
            continue
        config.scheduler = ScaleInvariantScheduler(scheduler, scaling, config.frequency)
        wrapped += 1
    return wrapped


def unwrap_schedulers(configs: Any) -> None:
    """Give every config its own scheduler back (at the end of the fit).

    Args:
        configs: The trainer's ``lr_scheduler_configs``.
    """
    for config in configs:
        if isinstance(config.scheduler, ScaleInvariantScheduler):
            config.scheduler = config.scheduler.inner
