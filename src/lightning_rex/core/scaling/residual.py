"""The goodput model's residual: how far measured step times sit from the rank model's.

Every window measured at some global batch is one :class:`GoodputObservation`: its mean log
step time, that mean's variance (from its own steps), the plan it ran and the rank model's
log prediction of that plan. Their residual ``log t_measured(B) - log t_predicted(B)`` is
modelled over ``log B`` by a BoTorch ``SingleTaskGP`` on the rank model's spline kernel
(:class:`~lightning_rex.core.model.kernels.SplineKernel`), each window's noise fixed
(:func:`residual_gp`); :class:`~lightning_rex.core.scaling.batch_scaling.BatchScaler` reads
its posterior (:func:`residual_posterior`) and its upper confidence bound.

**The residual is of the rank model as it is now.** The rank model keeps learning: a new
batch's first windows run a split planned from sizes it had never seen, and measure far
above its prediction then (0.5 in log where the steady gap is 0.1). Kept as made, those
predictions would penalise that batch for the rest of the run, long after the model has
learnt its sizes. So every observation keeps its plan, and the predictions are remade with
the current model before each proposal (:func:`refresh_predictions`).

**The prior mean is zero** because the predictions include the wait for the slowest noisy
rank (:mod:`~lightning_rex.core.scaling.straggler`): without it even a right rank model
sat below every measured time by a steady gap (0.1-0.13 in log in the simulator's gns
presets), and every batch not yet tried looked faster than the one in force by that gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.saved import StateError, real, whole
from lightning_rex.core.scaling.config import GlobalBatchScaling

if TYPE_CHECKING:  # torch loads when the scaler models goodput, not on import
    import torch

__all__ = [
    "GoodputObservation",
    "check_observation",
    "log_batch_input",
    "refresh_predictions",
    "residual_gp",
    "residual_posterior",
]


@dataclass
class GoodputObservation:
    """One window at a global batch.

    Attributes:
        batch: The global batch it ran at.
        log_t: Its mean log step time.
        var: That mean's variance.
        pred: The rank model's log step time of the plan it ran (remade by
            :func:`refresh_predictions`).
        plan: The plan it ran, or None (a state saved before plans were kept): its
            prediction then stays as made.
    """

    batch: int
    log_t: float
    var: float
    pred: float
    plan: tuple[int, ...] | None = None


def check_observation(entry: Any, where: str, low: int, high: int) -> GoodputObservation:
    """One saved observation, checked: ``[batch, log_t, var, pred]`` or ``[..., plan]``.

    Args:
        entry: The saved entry; a fifth item is the plan (a list of sizes, or None). A state
            saved before plans were kept has four.
        where: Its dotted name, for errors.
        low: The smallest global batch of the range.
        high: The largest.

    Returns:
        The observation.

    Raises:
        StateError: Naming the field: a batch outside the range, a time, variance or
            prediction that is not a finite number (a positive one for the variance), or a
            plan of negative sizes or not summing to the batch.
    """
    if not isinstance(entry, (list, tuple)) or len(entry) not in (4, 5):
        raise StateError(where, "must be [batch, log time, variance, log prediction, plan]")
    batch = whole(entry[0], f"{where}[0]", low, high)
    plan = None if len(entry) == 4 else entry[4]
    if plan is not None:
        if not isinstance(plan, (list, tuple)):
            raise StateError(f"{where}[4]", f"must be a list of sizes or null, got {plan!r}")
        plan = tuple(whole(size, f"{where}[4][{i}]", 0) for i, size in enumerate(plan))
        if sum(plan) != batch:
            raise StateError(f"{where}[4]", f"sums to {sum(plan)}, not to its batch {batch}")
    return GoodputObservation(
        batch,
        real(entry[1], f"{where}[1]"),
        real(entry[2], f"{where}[2]", positive=True),
        real(entry[3], f"{where}[3]"),
        plan,
    )


def refresh_predictions(
    obs: Sequence[GoodputObservation], predict_plan: Callable[[tuple[int, ...]], float]
) -> None:
    """Remake every observation's prediction with the rank model as it is now.

    Args:
        obs: The observations; those with a plan are updated in place.
        predict_plan: The rank model's step time (seconds, overhead included) of a plan;
            a time that is not a positive finite number leaves the prediction as it was.
    """
    made: dict[tuple[int, ...], float] = {}
    for observation in obs:
        if observation.plan is None:
            continue
        if observation.plan not in made:
            made[observation.plan] = predict_plan(observation.plan)
        seconds = made[observation.plan]
        if 0 < seconds < math.inf:
            observation.pred = math.log(seconds)


def log_batch_input(batch: np.ndarray, config: GlobalBatchScaling) -> torch.Tensor:
    """Global batches as the GP's input: ``log B`` scaled to [0, 1] over the range.

    Args:
        batch: Global batches.
        config: The scaling settings (the range).

    Returns:
        A ``(len(batch), 1)`` float64 tensor.
    """
    import torch

    log_low, log_high = math.log(config.min_global_batch), math.log(config.max_global_batch)
    scaled = (np.log(np.asarray(batch, dtype=np.float64)) - log_low) / (log_high - log_low)
    return torch.as_tensor(scaled, dtype=torch.float64).reshape(-1, 1)


def residual_gp(obs: Sequence[GoodputObservation], config: GlobalBatchScaling) -> Any:
    """The residual's GP over the observations (in eval mode).

    Args:
        obs: The observations (at least one).
        config: The scaling settings.

    Returns:
        A BoTorch ``SingleTaskGP``: zero prior mean, a spline kernel with a prior scale of
        10% of the step time, each window's variance as its noise.
    """
    import torch
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import ScaleKernel

    from lightning_rex.core.model.kernels import SplineKernel

    train_x = log_batch_input(np.array([o.batch for o in obs]), config)
    train_y = torch.tensor([[o.log_t - o.pred] for o in obs], dtype=torch.float64)
    yvar = torch.tensor([[o.var] for o in obs], dtype=torch.float64)
    kernel = ScaleKernel(SplineKernel(num_basis=8, lower=0.0, upper=1.0))
    kernel.outputscale = 0.1**2  # residuals of about 10% of the step time, a priori
    model = SingleTaskGP(train_x, train_y, yvar, covar_module=kernel, outcome_transform=None)
    model.mean_module.constant.data.fill_(0.0)
    model.eval()
    return model


def residual_posterior(
    obs: Sequence[GoodputObservation], config: GlobalBatchScaling, batches: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The residual's posterior mean and standard deviation at ``batches``.

    Args:
        obs: The observations.
        config: The scaling settings.
        batches: Global batches.

    Returns:
        ``(mean, sd)`` arrays; with no observation, 0 and 0.1 (the prior).
    """
    import torch

    if not obs:
        return np.zeros(len(batches)), np.full(len(batches), 0.1)
    model = residual_gp(obs, config)
    with torch.no_grad():
        post = model.posterior(log_batch_input(batches, config))
        mean = post.mean.reshape(-1).numpy()
        std = post.variance.clamp_min(0).sqrt().reshape(-1).numpy()
    return mean, std
