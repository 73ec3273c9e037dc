"""The time model's weight posterior: its units, data and prior, and its solve per tile.

The time model (:class:`~lightning_rex.core.model.time_model.RankTimeModel`) is Bayesian
linear regression on the features ``[1, u, pad_T(b), pad_W(b), phi(b)]`` (``u = b / b_ref``).
:func:`weight_prior` is the Gaussian prior on those weights: an affine mean whose slope is
the proportional model through a rank's first observation, the overhead ``a ~ N(0, sd^2)``,
the paddings' costs about the slope, and the residual's spline weights at the residual scale
``s^2``. :func:`window_data` turns the held windows into regression data, older windows
weighing less. :func:`tile_posteriors` solves every ``(tile, wave)`` hypothesis some rank weighs
(:mod:`~lightning_rex.core.model.tiles`), pooled within device groups
(:func:`~lightning_rex.core.model.pooling.pooled_posterior`), and picks each rank's posterior
under its most probable hypothesis. These are pure functions: the model holds the data and
the state.

Scale. The spline kernel has finite rank, so the GP is Bayesian linear regression, solved in
closed form for all ranks at once (:mod:`~lightning_rex.core.model.pooling`; one ``D x D``
Cholesky per rank and tile, ``D = 4 + num_basis``): milliseconds at 4096 ranks, where a
batched exact GP fit takes minutes. Units are relative (:func:`first_units`): each rank's
times are divided by its first observed median (its device group's median, when pooled), so
one set of hyperparameters serves every rank. Device groups pool partially.

Cold start. With one observation per rank the prior decides the split between overhead and
rate: ``a ~ N(0, 0.3^2)`` (relative), so the first proposal is close to the proportional
plan; the second plan's observations identify the affine part. Old observations are
down-weighted (their noise variance grows by ``exp(age / memory)``) so that drift and events
are tracked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lightning_rex.core.model.pooling import pooled_posterior
from lightning_rex.core.model.tiles import HYPOTHESES, PADS, pad_prior, pads

if TYPE_CHECKING:  # torch loads when a model is built, not on import
    import torch

__all__ = ["Posterior", "first_units", "tile_posteriors", "weight_prior", "window_data"]

Posterior = tuple["torch.Tensor", "torch.Tensor"]
"""Every rank's weight posterior ``(mean, cov)``: shapes ``(N, D)`` and ``(N, D, D)``."""


def first_units(
    pass_sizes: np.ndarray, pass_times: np.ndarray, group: np.ndarray, b_ref: float, min_group: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's unit of time and first relative size, from its first window (one pass).

    A group's ranks share one unit (their median's), so their relative times are one curve;
    a lone rank's unit is its own first median.

    Args:
        pass_sizes: The first window's sizes, as single passes, ``(N,)``.
        pass_times: Its medians in seconds, as single passes, ``(N,)``.
        group: Each rank's device group (the index of a member), ``(N,)``.
        b_ref: The unit of sizes (``u = b / b_ref``).
        min_group: Groups smaller than this are not pooled: each member keeps its own unit.

    Returns:
        ``(scale, first_u)``: seconds per relative unit, and ``b / b_ref``, each ``(N,)``.
    """
    scale = pass_times.copy()
    first_u = pass_sizes / b_ref
    for group_id in np.unique(group):
        members = group == group_id
        if members.sum() < min_group:
            continue  # not pooled: each member keeps its own unit
        scale[members] = np.median(pass_times[members])
        first_u[members] = np.mean(first_u[members])
    return scale, first_u


def weight_prior(
    first_u: np.ndarray,
    num_basis: int,
    overhead_sd: float,
    slope_sd: float,
    outputscale: float,
) -> Posterior:
    """The prior mean and variance of every rank's weights (relative units).

    Args:
        first_u: Each rank's first observed size over ``b_ref`` (its slope's prior mean is
            ``1 / first_u``: the proportional model through its first median).
        num_basis: The spline's basis functions.
        overhead_sd: Prior standard deviation of the relative overhead ``a``.
        slope_sd: Prior standard deviation of the slope, as a fraction of its mean.
        outputscale: The residual scale ``s^2`` (the spline weights' variance).

    Returns:
        ``(mean, var)``, both shape ``(N, D)`` with ``D = PADS.stop + num_basis``.
    """
    import torch

    num_ranks = len(first_u)
    slope_mean = torch.as_tensor(1.0 / first_u, dtype=torch.float64)
    mean = torch.zeros(num_ranks, PADS.stop + num_basis, dtype=torch.float64)
    mean[:, 1] = slope_mean
    var = torch.empty(num_ranks, PADS.stop + num_basis, dtype=torch.float64)
    var[:, 0] = overhead_sd**2
    var[:, 1] = (slope_sd * slope_mean) ** 2
    # the paddings' costs: about the slope when a tile (a wave) is real
    var[:, PADS] = (slope_mean**2).unsqueeze(-1)
    var[:, PADS.stop :] = outputscale
    return mean, var


def tile_posteriors(
    phi: torch.Tensor,
    sizes: torch.Tensor,
    times: torch.Tensor,
    prec: torch.Tensor,
    prior: Posterior,
    weights: np.ndarray,
    group: np.ndarray,
    b_ref: float,
    min_group: int,
) -> tuple[dict[tuple[int, int], Posterior], Posterior]:
    """Every hypothesis some rank weighs, solved; and each rank's most probable one's.

    Args:
        phi: The windows' features without padding (zeros in the pads' columns),
            ``(N, W, D)``.
        sizes: The windows' sizes, ``(N, W)``.
        times: Their medians (relative), ``(N, W)``.
        prec: Their precisions, ``(N, W)``.
        prior: :func:`weight_prior`'s ``(mean, var)``.
        weights: Each rank's probability of every hypothesis, ``(N, H)``
            (:func:`~lightning_rex.core.model.tiles.hypothesis_weights`).
        group: Each rank's device group (the index of a member), shape ``(N,)``.
        b_ref: The unit of the paddings.
        min_group: Groups smaller than this are not pooled.

    Returns:
        ``(posteriors, posterior)``: every hypothesis with a weight on some rank to its
        ``(mean, cov)``, and every rank's ``(mean, cov)`` under its most probable one.
    """
    import torch

    prior_mean, prior_var = prior

    def solve(hypothesis: tuple[int, int]) -> Posterior:
        features = phi.clone()  # (N, W, D), the paddings' columns filled in
        features[..., PADS] = pads(sizes, hypothesis, b_ref)
        hyp_mean = pad_prior(prior_mean, hypothesis)
        return pooled_posterior(features, times, prec, hyp_mean, prior_var, group, min_group)

    best = weights.argmax(axis=1)
    used = set(np.flatnonzero((weights > 0).any(axis=0)).tolist())
    posteriors = {HYPOTHESES[index]: solve(HYPOTHESES[index]) for index in sorted(used)}
    # the posterior under each rank's most probable hypothesis
    post_mean, cov = (x.clone() for x in posteriors[HYPOTHESES[int(best[0])]])
    for hyp_index in set(best.tolist()):
        rows = torch.as_tensor(best == hyp_index)
        post_mean[rows], cov[rows] = (x[rows] for x in posteriors[HYPOTHESES[hyp_index]])
    return posteriors, (post_mean, cov)


def window_data(
    sizes: np.ndarray,
    medians: np.ndarray,
    rel_var: list[float],
    scale: np.ndarray,
    first_index: int,
    cutoff: np.ndarray,
    memory: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The held windows as regression data: sizes, relative medians, noise variances.

    Older windows count less with a ``memory`` (their variance grows by
    ``exp(age / memory)``, so that drift is tracked); windows before a rank's change point
    never count (their variance is multiplied by ``1e8``).

    Args:
        sizes: The windows' sizes, as single passes, ``(N, W)``.
        medians: Their medians in seconds, as single passes, ``(N, W)``.
        rel_var: Each window's median variance relative to its value, ``(W,)``.
        scale: Each rank's unit (seconds), ``(N,)``.
        first_index: The index (in windows ever added) of the first window held.
        cutoff: Each rank's change point: the first window index that still counts.
        memory: The age (in windows) at which a window's weight has dropped by ``e``; None
            for no decay.

    Returns:
        ``(sizes, relative medians, noise variances)``, ``(N, W)`` each.
    """
    import torch

    batch_sizes = torch.as_tensor(sizes)  # (N, W)
    rel_times = torch.as_tensor(medians / scale[:, None])  # (N, W)
    n_windows = len(rel_var)
    age = torch.arange(n_windows - 1, -1, -1, dtype=torch.float64)
    # the noise is relative to each median (a window at half the first size's time has
    # half its noise in these units)
    noise_var = torch.as_tensor(rel_var, dtype=torch.float64)
    if memory is not None:
        noise_var = noise_var * torch.exp(age / memory)
    noise_var = noise_var * rel_times.clamp_min(1e-6) ** 2
    index = torch.as_tensor(first_index + np.arange(n_windows))
    old = index[None, :] < torch.as_tensor(cutoff)[:, None]
    noise_var = noise_var * torch.where(old, 1e8, 1.0)
    return batch_sizes, rel_times, noise_var
