"""The residual scale of the rank time model, fitted with BoTorch.

A batched :class:`botorch.models.SingleTaskGP` (float64, one affine
:class:`gpytorch.means.LinearMean` per rank, one ``ScaleKernel(SplineKernel)`` shared by all,
the measured window-median variances as fixed noise) on a seeded subset of at most
``fit_ranks`` ranks and the last ``fit_windows`` windows, optimised by
:func:`botorch.fit.fit_gpytorch_mll` on the sum of the ranks' marginal likelihoods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from lightning_rex.core.kernels import SplineKernel

if TYPE_CHECKING:
    from lightning_rex.core.model import RankTimeModel

__all__ = ["fit_residual_scale"]

_DT = torch.float64


def fit_residual_scale(model: RankTimeModel) -> float | None:
    """Fit the shared residual scale ``s^2`` to the model's windows.

    Args:
        model: The rank time model (at least one window held); its fit count advances.

    Returns:
        The fitted scale (relative variance), or None when there is nothing to fit (one
        size per rank in the subset) or BoTorch cannot fit.
    """
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.optim.closures import get_loss_closure_with_grads
    from gpytorch.kernels import ScaleKernel
    from gpytorch.means import LinearMean
    from gpytorch.mlls import ExactMarginalLogLikelihood

    b, y, v = (a[:, -model.fit_windows :] for a in model._data())
    rng = np.random.default_rng([model.seed, model.n_fits])
    model.n_fits += 1
    n_sub = min(model.world_size, model.fit_ranks)
    sub = np.sort(rng.choice(model.world_size, size=n_sub, replace=False))
    bs = b[sub]
    if bool((bs.max(dim=1).values == bs.min(dim=1).values).all()):
        return None
    shape = torch.Size([n_sub])
    x = bs.unsqueeze(-1)
    k = model.kernel
    mean = LinearMean(1, batch_shape=shape)
    covar = ScaleKernel(SplineKernel(k.num_basis, k.lower, k.upper, log_scale=True))
    # Deterministic starting point (LinearMean draws its initial weights at random): each
    # rank's affine fit through its data, and the scale in use.
    with torch.no_grad():
        design = torch.stack([torch.ones_like(bs), bs], dim=-1)  # (n_sub, W, 2)
        coef = torch.linalg.lstsq(design, y[sub].unsqueeze(-1)).solution.squeeze(-1)
        mean.bias.copy_(coef[:, :1])
        mean.weights.copy_(coef[:, 1:].unsqueeze(-1))
        covar.outputscale = torch.as_tensor(max(model.outputscale, 1e-4), dtype=_DT)
    gp = SingleTaskGP(
        x,
        y[sub].unsqueeze(-1),
        train_Yvar=v[sub].unsqueeze(-1).clone(),
        # one residual scale shared by the subset (the sum of the ranks' marginal
        # likelihoods): a rank measured at two sizes has no evidence of curvature, and
        # per-rank scales left its median at the floor while others saw a knee
        covar_module=covar,
        mean_module=mean,
        outcome_transform=None,
    )
    mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
    with torch.random.fork_rng():
        torch.manual_seed(model.seed + model.n_fits)
        try:
            # one loss (the sum over the subset) for the shared scale: BoTorch's own
            # closure, which also keeps it off its per-batch-member independent fits
            params = {n: p for n, p in mll.named_parameters() if p.requires_grad}
            fit_gpytorch_mll(
                mll,
                closure=get_loss_closure_with_grads(mll, params),
                optimizer_kwargs={"options": {"maxiter": 100}},
            )
        except Exception:  # keep the previous scale if BoTorch cannot fit
            return None
    return float(gp.covar_module.outputscale.detach())
