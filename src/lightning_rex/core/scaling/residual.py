"""The goodput model's residual: how far measured step times sit from the rank model's.

Every window measured at some global batch is one :class:`GoodputObservation`: its mean log
step time, that mean's variance (from its own steps) and the rank model's log prediction.
Their residual ``log t_measured(B) - log t_predicted(B)`` is modelled over ``log B`` by a
BoTorch ``SingleTaskGP`` on the rank model's spline kernel
(:class:`~lightning_rex.core.model.kernels.SplineKernel`), each window's noise fixed
(:func:`residual_gp`); :class:`~lightning_rex.core.scaling.batch_scaling.BatchScaler` reads
its posterior (:func:`residual_posterior`) and its upper confidence bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.scaling.config import GlobalBatchScaling

if TYPE_CHECKING:  # torch loads when the scaler models goodput, not on import
    import torch

__all__ = ["GoodputObservation", "log_batch_input", "residual_gp", "residual_posterior"]


@dataclass
class GoodputObservation:
    """One window at a global batch.

    Attributes:
        batch: The global batch it ran at.
        log_t: Its mean log step time.
        var: That mean's variance.
        pred: The rank model's log step time of the plan it ran.
    """

    batch: int
    log_t: float
    var: float
    pred: float


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
