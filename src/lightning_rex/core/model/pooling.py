"""Bayesian linear regression over every rank at once, with partial pooling by device group.

:class:`~lightning_rex.core.model.time_model.RankTimeModel` is linear in its features
(``[1, u, pad, phi]``), so each rank's weight posterior is Gaussian and closed-form: one
``D x D`` Cholesky per rank, batched in torch float64. Ranks of one device group (at least
``min_group`` members) share the group's curve, each with its own level shrunk toward the
group's (:func:`pooled_posterior`).

torch loads inside the functions, when a model solves, not on import.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    mean = torch.cholesky_solve((prior_rhs + data).unsqueeze(-1), chol).squeeze(-1)
    return mean, torch.cholesky_inverse(chol)


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

    prior_rhs = m0 / p0
    group_ids = torch.as_tensor(group)
    _, slot = torch.unique(group_ids, return_inverse=True)  # each rank's group, numbered 0..G-1
    size = torch.bincount(slot)
    pooled = size[slot] >= min_group
    num_ranks, dim = m0.shape
    post_mean = torch.empty_like(m0)
    cov = torch.empty(num_ranks, dim, dim, dtype=m0.dtype)
    alone = torch.nonzero(~pooled).view(-1)
    if alone.numel():
        f_a, p_a = phi[alone], prec[alone].unsqueeze(-1)
        gram = f_a.transpose(-1, -2) @ (p_a * f_a)  # (A, D, D)
        data = (f_a * p_a * y[alone].unsqueeze(-1)).sum(-2)  # (A, D)
        post_mean[alone], cov[alone] = solve(
            torch.diag_embed(1.0 / p0[alone]), prior_rhs[alone], gram, data
        )
    if not bool(pooled.any()):
        return post_mean, cov
    # One solve per group: its members share its data, and their priors are the group's (a
    # pooled group has one unit), so thousands of ranks of a few device kinds cost a few
    # solves; a member whose prior differs from its group leader's solves on its own. A
    # group's sums are one product over all its members' windows.
    pooled_ranks = torch.nonzero(pooled).view(-1)
    pooled_slot = slot[pooled_ranks]
    by_group = pooled_ranks[torch.argsort(pooled_slot, stable=True)]
    sum_gram = torch.zeros(len(size), dim, dim, dtype=m0.dtype)
    sum_data = torch.zeros(len(size), dim, dtype=m0.dtype)
    for group_slot, members in enumerate(
        torch.split(by_group, torch.bincount(pooled_slot, minlength=len(size)).tolist())
    ):
        if members.numel():  # (groups too small to pool have no members here)
            f_g = phi[members].reshape(-1, dim)
            p_g = prec[members].reshape(-1, 1)
            sum_gram[group_slot] = f_g.T @ (p_g * f_g)
            sum_data[group_slot] = f_g.T @ (p_g.view(-1) * y[members].reshape(-1))
    same = (m0 == m0[group_ids]).all(-1) & (p0 == p0[group_ids]).all(-1)
    own = torch.nonzero(pooled & ((group_ids == torch.arange(len(group_ids))) | ~same)).view(-1)
    mu_own, cov_own = solve(
        torch.diag_embed(1.0 / p0[own]), prior_rhs[own], sum_gram[slot[own]], sum_data[slot[own]]
    )
    src = torch.full((len(group_ids),), -1, dtype=torch.long)  # which solve each pooled rank reads
    src[own] = torch.arange(len(own))
    follow = pooled & same
    src[follow] = src[group_ids[follow]]
    mu_g = mu_own[src[pooled_ranks]]
    fit = (phi[pooled_ranks] * mu_g.unsqueeze(-2)).sum(-1).clamp_min(1e-12)  # (P, W) group curve
    pooled_y, pooled_prec = y[pooled_ranks], prec[pooled_ranks]
    log_ratio = torch.log(pooled_y.clamp_min(1e-12) / fit)
    log_prec = pooled_prec * pooled_y * pooled_y  # the precision of log y (relative noise)
    se2 = 1.0 / log_prec.sum(-1)
    level = (log_prec * log_ratio).sum(-1) * se2  # (P,)
    count = size[pooled_slot].to(level.dtype)

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(size), dtype=x.dtype).index_add_(0, pooled_slot, x)[pooled_slot]

    mean = group_sum(level) / count
    var = group_sum((level - mean) ** 2) / (count - 1)
    tau2 = (var - group_sum(se2) / count).clamp_min(0.0)
    factor = torch.exp(mean + (level - mean) * tau2 / (tau2 + se2))
    post_mean[pooled_ranks] = mu_g * factor.unsqueeze(-1)
    cov[pooled_ranks] = cov_own[src[pooled_ranks]].mul_((factor * factor).view(-1, 1, 1))
    return post_mean, cov


def leave_groups(group: np.ndarray, ranks: Sequence[int]) -> None:
    """Take ``ranks`` out of their device groups, in place: each gets a curve of its own.

    A rank whose speed changed is no longer like its group. A group led by one of them
    (group ids are a member's index) is then led by its next member.

    Args:
        group: Each rank's group (the index of its first member), shape ``(N,)``; changed.
        ranks: The ranks that leave.
    """
    gone = np.zeros(group.size, dtype=bool)
    gone[list(ranks)] = True
    for rank in ranks:
        rest = np.flatnonzero((group == rank) & ~gone)
        if rest.size:
            group[rest] = rest.min()
    group[list(ranks)] = list(ranks)


def device_groups(labels: Sequence[str | None] | None, world_size: int) -> np.ndarray:
    """Each rank's device group: the index of the first rank with its label.

    Args:
        labels: Per-rank device labels (None: a group of its own), or None for no groups.
        world_size: The number of ranks ``N``.

    Returns:
        Shape ``(N,)`` int64; a rank without a label is its own group.

    Raises:
        ValueError: For the wrong number of labels.
    """
    if labels is not None and len(labels) != world_size:
        raise ValueError(f"groups must have {world_size} labels, got {len(labels)}")
    first: dict[str, int] = {}
    names = [None] * world_size if labels is None else list(labels)
    return np.array(
        [r if g is None else first.setdefault(str(g), r) for r, g in enumerate(names)],
        dtype=np.int64,
    )
