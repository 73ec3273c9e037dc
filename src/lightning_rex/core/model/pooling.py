"""Bayesian linear regression over every rank at once, with partial pooling by device group.

:class:`~lightning_rex.core.model.time_model.RankTimeModel` is linear in its features
(``[1, u, pad, phi]``), so each rank's weight posterior is Gaussian and closed-form: one
``D x D`` Cholesky per rank, batched in torch float64. Ranks of one device group (at least
``min_group`` members) share the group's curve, each with its own level shrunk toward the
group's (:func:`pooled_posterior`).

torch loads inside the functions, when a model solves, not on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["pooled_posterior", "solve"]


def solve(
    prior_prec: torch.Tensor, prior_rhs: torch.Tensor, gram: torch.Tensor, data: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian posterior of linear weights, batched over the leading dimension.

    Args:
        prior_prec: Prior precision matrices, ``(N, D, D)``.
        prior_rhs: Prior precision times prior mean, ``(N, D)``.
        gram: ``Phi^T W Phi`` of the data, ``(N, D, D)``.
        data: ``Phi^T W y`` of the data, ``(N, D)``.

    Returns:
        ``(mean, covariance)`` of shapes ``(N, D)`` and ``(N, D, D)``.
    """
    import torch

    chol = torch.linalg.cholesky(prior_prec + gram)
    mu = torch.cholesky_solve((prior_rhs + data).unsqueeze(-1), chol).squeeze(-1)
    return mu, torch.cholesky_inverse(chol)


def pooled_posterior(
    phi: torch.Tensor,
    y: torch.Tensor,
    prec: torch.Tensor,
    m0: torch.Tensor,
    p0: torch.Tensor,
    group: np.ndarray,
    min_group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's weight posterior, pooled within device groups of ``min_group`` or more.

    A rank alone (or in a smaller group) gets its own posterior from its own windows. In a
    pooled group, the group's posterior comes from all its members' windows, and each
    member's own level relative to it, the precision-weighted mean of ``log(y / group
    curve)`` over its windows, is shrunk toward the group's mean level by
    ``tau^2 / (tau^2 + se^2)``, with ``tau^2`` the spread of the members' levels beyond
    their noise (method of moments). Identical units follow their group (their levels are
    noise, ``tau^2`` near 0); a unit truly faster than its group keeps its own level.

    Args:
        phi: Features of every window, ``(N, W, D)``.
        y: Relative times, ``(N, W)``.
        prec: Their precisions, ``(N, W)``.
        m0: Prior means of the weights, ``(N, D)``.
        p0: Prior variances of the weights (independent), ``(N, D)``.
        group: ``group[r]``: the index of the rank whose curve rank ``r`` shares.
        min_group: Groups smaller than this are not pooled.

    Returns:
        ``(mean, covariance)`` of every rank's weights, ``(N, D)`` and ``(N, D, D)``.
    """
    import torch

    gram = phi.transpose(-1, -2) @ (prec.unsqueeze(-1) * phi)  # (N, D, D)
    data = (phi * (prec * y).unsqueeze(-1)).sum(-2)  # (N, D)
    prior_prec = torch.diag_embed(1.0 / p0)
    prior_rhs = m0 / p0
    g = torch.as_tensor(group)
    ones = torch.ones(len(group), dtype=torch.float64)
    pooled = torch.zeros_like(ones).index_add_(0, g, ones)[g] >= min_group
    alone = torch.nonzero(~pooled).view(-1)
    if not bool(pooled.any()):
        return solve(prior_prec, prior_rhs, gram, data)
    # one solve per group: its members share its data, and their priors are the group's
    # (a pooled group has one unit), so thousands of ranks of a few device kinds cost a few
    # solves; a member whose prior differs from its group's leader's solves on its own
    sum_gram = torch.zeros_like(gram).index_add_(0, g, gram)
    sum_data = torch.zeros_like(data).index_add_(0, g, data)
    same = (m0 == m0[g]).all(-1) & (p0 == p0[g]).all(-1)
    own = torch.nonzero(pooled & ((g == torch.arange(len(g))) | ~same)).view(-1)
    mu_g, cov_g = torch.zeros_like(data), torch.zeros_like(gram)
    lead = g[own]
    mu_g[own], cov_g[own] = solve(prior_prec[own], prior_rhs[own], sum_gram[lead], sum_data[lead])
    follow = pooled & same
    mu_g[follow], cov_g[follow] = mu_g[g[follow]], cov_g[g[follow]]
    fit = (phi * mu_g.unsqueeze(-2)).sum(-1).clamp_min(1e-12)  # (N, W) group curve
    lr = torch.log(y.clamp_min(1e-12) / fit)
    w = prec * y * y  # the precision of log y (relative noise)
    se2 = 1.0 / w.sum(-1)
    level = (w * lr).sum(-1) * se2  # (N,)
    n = torch.zeros_like(level).index_add_(0, g, torch.ones_like(level))[g]
    mean = torch.zeros_like(level).index_add_(0, g, level)[g] / n
    var = torch.zeros_like(level).index_add_(0, g, (level - mean) ** 2)[g] / (n - 1)
    noise = torch.zeros_like(level).index_add_(0, g, se2)[g] / n
    tau2 = (var - noise).clamp_min(0.0)
    shrunk = mean + (level - mean) * tau2 / (tau2 + se2)
    f = torch.exp(shrunk)
    mu, cov = mu_g * f.unsqueeze(-1), cov_g * (f * f).view(-1, 1, 1)
    if alone.numel():
        mu[alone], cov[alone] = solve(prior_prec[alone], prior_rhs[alone], gram[alone], data[alone])
    return mu, cov
