"""The residual scale of the rank time model, fitted with BoTorch.

A batched :class:`botorch.models.SingleTaskGP` (float64, one affine
:class:`gpytorch.means.LinearMean` per rank, one ``ScaleKernel(SplineKernel)`` shared by all,
the measured window-median variances as fixed noise) on the windows of a subset of ranks
(the rank time model picks a seeded subset of at most ``fit_ranks`` ranks and the last
``fit_windows`` windows), optimised by :func:`botorch.fit.fit_gpytorch_mll` on the sum of the
ranks' marginal likelihoods.
"""

from __future__ import annotations

import numpy as np
import torch

from lightning_rex.core.model.kernels import SplineKernel

__all__ = ["fit_on_subset", "fit_residual_scale", "load_fitting"]

_DT = torch.float64


def load_fitting() -> None:
    """Import what the first fit needs, so that it loads when a model is built.

    BoTorch's fitting loop and the ``torch.fx`` modules it reaches on its first call take
    about half a second to import; inside the first decision that refits they would delay
    it by as much.
    """
    import botorch.fit
    import botorch.optim.closures  # noqa: F401
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


def fit_residual_scale(
    b: torch.Tensor,
    y: torch.Tensor,
    v: torch.Tensor,
    basis: tuple[int, float, float],
    outputscale: float,
    seed: int,
) -> float | None:
    """Fit the shared residual scale ``s^2`` to a subset of ranks' windows.

    Args:
        b: The subset's micro-batch sizes per window, shape ``(n, W)``.
        y: Their relative median times, shape ``(n, W)``.
        v: Their relative noise variances, shape ``(n, W)``.
        basis: The spline kernel's ``(num_basis, lower, upper)`` (log scale).
        outputscale: The scale in use (the starting point).
        seed: Seeds the optimiser's randomness.

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

    if bool((b.max(dim=1).values == b.min(dim=1).values).all()):
        return None
    shape = torch.Size([b.shape[0]])
    train_x = b.unsqueeze(-1)
    mean = LinearMean(1, batch_shape=shape)
    covar = ScaleKernel(SplineKernel(basis[0], basis[1], basis[2], log_scale=True))
    # Deterministic starting point (LinearMean draws its initial weights at random): each
    # rank's affine fit through its data, and the scale in use.
    with torch.no_grad():
        design = torch.stack([torch.ones_like(b), b], dim=-1)  # (n, W, 2)
        coef = torch.linalg.lstsq(design, y.unsqueeze(-1)).solution.squeeze(-1)
        mean.bias.copy_(coef[:, :1])
        mean.weights.copy_(coef[:, 1:].unsqueeze(-1))
        covar.outputscale = torch.as_tensor(max(outputscale, 1e-4), dtype=_DT)
    model = SingleTaskGP(
        train_x,
        y.unsqueeze(-1),
        train_Yvar=v.unsqueeze(-1).clone(),
        # one residual scale shared by the subset (the sum of the ranks' marginal
        # likelihoods): a rank measured at two sizes has no evidence of curvature, and
        # per-rank scales left its median at the floor while others saw a knee
        covar_module=covar,
        mean_module=mean,
        outcome_transform=None,
    )
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
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
    return float(model.covar_module.outputscale.detach())


def fit_on_subset(
    data: tuple[torch.Tensor, ...],
    tiles: np.ndarray,
    basis: tuple[int, float, float],
    outputscale: float,
    subset: int,
    seed: int,
    n_fits: int,
) -> float | None:
    """:func:`fit_residual_scale` on a seeded subset of ranks, sizes padded to their tiles.

    Args:
        data: The windows' ``(sizes, relative medians, noise variances)``, ``(N, W)`` each.
        tiles: Each rank's most probable tile, ``(N,)`` (1: none): a size runs as a full
            tile's cost.
        basis: The spline kernel's ``(num_basis, lower, upper)`` (log scale).
        outputscale: The scale in use (the starting point).
        subset: How many ranks to fit on.
        seed: The model's seed.
        n_fits: This fit's count (from 1): the subset is drawn from ``[seed, n_fits - 1]``
            and the optimiser seeded with ``seed + n_fits``.

    Returns:
        The fitted scale, or None (see :func:`fit_residual_scale`).
    """
    sizes, times, noise_var = data
    tile_sizes = torch.as_tensor(tiles, dtype=sizes.dtype).view(-1, 1)
    # the sizes as the kernels run them (a full tile's cost)
    sizes = torch.ceil(sizes / tile_sizes) * tile_sizes
    rng = np.random.default_rng([seed, n_fits - 1])
    ranks = np.sort(rng.choice(sizes.shape[0], size=subset, replace=False))
    return fit_residual_scale(
        sizes[ranks], times[ranks], noise_var[ranks], basis, outputscale, seed + n_fits
    )
