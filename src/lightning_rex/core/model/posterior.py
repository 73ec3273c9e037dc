"""The rank time model as a BoTorch :class:`~botorch.models.model.Model`.

:class:`~lightning_rex.core.model.time_model.RankTimeModel` computes its posterior in
closed form (the spline kernel has finite rank, so the GP is Bayesian linear regression on
the features ``[1, b / b_ref, phi(b)]``). :class:`SplineAffineModel` exposes that posterior through
BoTorch's interface: :meth:`SplineAffineModel.posterior` returns a
:class:`~botorch.posteriors.gpytorch.GPyTorchPosterior` whose mean and covariance are those
of the exact GP with kernel ``k(b, b') = p_a + p_s u u' + s^2 phi(b)^T phi(b')`` and prior
mean ``c0 u`` (``u = b / b_ref``) conditioned on the same data
(``tests/core/model/test_posterior.py`` checks this against BoTorch's ``SingleTaskGP`` to 1e-6).
The covariance is a low-rank :mod:`linear_operator` (``F L (F L)^T``, ``L`` the Cholesky
factor of the weights' covariance), so a mean over thousands of sizes and ranks never
materialises a covariance matrix. The planner reads acquisitions from it with BoTorch's
machinery (:func:`optimistic_quantile`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from botorch.models.model import Model
from botorch.posteriors import Posterior
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
)
from scipy import stats

__all__ = ["SplineAffineModel", "grid_quantile", "optimistic_quantile", "weights_model"]

_DENSE_ROOT_SIZES = 256
"""Up to this many sizes per rank, the covariance root ``F L`` is computed at once."""


class SplineAffineModel(Model):
    """A batched (one batch member per rank) BoTorch model of every rank's step time.

    Args:
        weights_mean: Posterior mean of each rank's feature weights, shape ``(N, D)``.
        weights_root: A root ``L`` of each rank's weight covariance (``L L^T``), ``(N, D, D)``.
        features: Maps sizes ``(..., G)`` to features ``(..., G, D)``.
        scale: Each rank's unit (seconds per relative unit), shape ``(N,)``.
        jitter: Variance added on the diagonal (seconds squared, relative), so that the
            covariance is positive definite.
    """

    def __init__(
        self,
        weights_mean: torch.Tensor,
        weights_root: torch.Tensor,
        features: Callable[[torch.Tensor], torch.Tensor],
        scale: torch.Tensor,
        jitter: float = 1e-12,
    ) -> None:
        super().__init__()
        self.weights_mean = weights_mean
        self.weights_root = weights_root
        self.features = features
        self.scale = scale
        self.jitter = float(jitter)
        self._cov: torch.Tensor | None = None

    @property
    def num_outputs(self) -> int:
        """One output: a rank's compute time."""
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """``(N,)``: one batch member per rank."""
        return torch.Size([self.weights_mean.shape[0]])

    def mean(self, X: torch.Tensor) -> torch.Tensor:
        """The posterior mean alone (what :meth:`posterior` gives as ``.mean``, squeezed).

        The planner's mean over thousands of sizes and ranks does not need the covariance
        that :meth:`posterior` builds.

        Args:
            X: Sizes, shape ``(G, 1)`` (the same sizes for every rank) or ``(N, G, 1)``.

        Returns:
            The mean, shape ``(N, G)``, in seconds.
        """
        return self._features_and_mean(X)[1]

    def _features_and_mean(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The features at ``X`` (``(G, D)`` or ``(N, G, D)``) and the mean, ``(N, G)``."""
        features = self.features(X.squeeze(-1).to(self.weights_mean.dtype))
        unit = self.scale.unsqueeze(-1)  # (N, 1)
        if features.dim() == 2:  # the units folded into the weights: one (N, G) product, no copy
            return features, (self.weights_mean * unit) @ features.T
        return features, (features * self.weights_mean.unsqueeze(-2)).sum(-1) * unit

    def posterior(
        self,
        X: torch.Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | torch.Tensor = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        """The posterior of every rank's time (seconds) at the sizes ``X``.

        Args:
            X: Sizes, shape ``(G, 1)`` (the same sizes for every rank) or ``(N, G, 1)``.
            output_indices: Must be None or ``[0]`` (one output).
            observation_noise: Not supported (the model predicts the noiseless median).
            posterior_transform: Not supported; must be None.
            **kwargs: Ignored.

        Returns:
            A :class:`GPyTorchPosterior` over a :class:`MultivariateNormal` with batch shape
            ``(N,)`` and event shape ``(G,)``.

        Raises:
            NotImplementedError: For observation noise or a posterior transform.
        """
        if posterior_transform is not None or observation_noise is not False:
            raise NotImplementedError("SplineAffineModel predicts noiseless medians only")
        if output_indices not in (None, [0]):
            raise NotImplementedError("SplineAffineModel has one output")
        num_ranks = self.weights_mean.shape[0]
        features, mean = self._features_and_mean(X)
        unit = self.scale.unsqueeze(-1)  # (N, 1)
        if features.dim() == 2:
            features = features.expand(num_ranks, *features.shape)
        num_sizes = features.shape[-2]
        scaled_root = self.weights_root * unit.unsqueeze(-1)
        if num_sizes <= _DENSE_ROOT_SIZES:
            # the root F L at once: GPyTorch's variance of a lazy product costs 50x more
            root: Any = DenseLinearOperator(features @ scaled_root)
        else:  # a long grid (a mean over every size): the product stays lazy
            root = MatmulLinearOperator(
                DenseLinearOperator(features), DenseLinearOperator(scaled_root)
            )
        eye = torch.full((num_ranks, num_sizes), self.jitter, dtype=mean.dtype)
        covar = LowRankRootAddedDiagLinearOperator(
            LowRankRootLinearOperator(root), DiagLinearOperator(eye)
        )
        return GPyTorchPosterior(MultivariateNormal(mean, covar))

    def marginal_posterior(self, X: torch.Tensor) -> GPyTorchPosterior:
        """The posterior at the sizes ``X`` with each size's marginal variance only.

        The same mean and per-size variances as :meth:`posterior`, with a diagonal
        covariance: what a quantile reads. On a grid shared by every rank the variances are
        one matrix product, every rank's weight covariance against the grid's feature outer
        products, instead of a batched root ``F L`` per rank, and no low-rank operator is
        built: at thousands of ranks, several times cheaper.

        Args:
            X: Sizes, shape ``(G, 1)`` (the same sizes for every rank) or ``(N, G, 1)``.

        Returns:
            A :class:`GPyTorchPosterior` with batch shape ``(N,)``, event shape ``(G,)`` and
            a diagonal covariance.
        """
        f, mean = self._features_and_mean(X)
        if f.dim() == 2:  # one product for every rank: f_g^T S_n f_g as (f f^T)_g . S_n
            cov = self._weights_cov()
            num_ranks, dim = cov.shape[0], cov.shape[-1]
            outer = (f.unsqueeze(-1) * f.unsqueeze(-2)).reshape(f.shape[0], dim * dim)
            var = (cov.reshape(num_ranks, dim * dim) @ outer.T).clamp_min(0.0)
        else:
            root = f @ self.weights_root
            var = (root * root).sum(-1)
        var = var * (self.scale * self.scale).unsqueeze(-1) + self.jitter
        # GPyTorch raises any variance below its floor to it, with a NumericalWarning (a
        # rank measured many times at a size has next to none there): the same floor, here
        var = var.clamp_min(gpytorch_settings.min_variance.value(var.dtype))
        return GPyTorchPosterior(MultivariateNormal(mean, DiagLinearOperator(var)))

    def _weights_cov(self) -> torch.Tensor:
        """Every rank's weight covariance ``L L^T``, ``(N, D, D)``, computed once."""
        if self._cov is None:
            self._cov = self.weights_root @ self.weights_root.transpose(-1, -2)
        return self._cov


def weights_model(
    mean: torch.Tensor,
    cov: torch.Tensor,
    features: Callable[[torch.Tensor], torch.Tensor],
    scale: torch.Tensor,
    last_pass: Callable[[], tuple[np.ndarray, np.ndarray]],
    b_ref: float,
) -> SplineAffineModel:
    """A weight posterior as a :class:`SplineAffineModel`, with the fallback for bad slopes.

    A rank whose fitted slope is not positive (a change it has not yet been told about, or
    too little spread in its sizes) would offer "free" capacity to the planner: it falls back
    to the proportional model through its latest observation, with no claimed certainty,
    since compute time never falls as the batch grows.

    Args:
        mean: The ranks' weight posterior means, ``(n, D)`` (relative units).
        cov: Their covariances, ``(n, D, D)``.
        features: Maps sizes ``(..., G)`` to features ``(..., G, D)``.
        scale: The ranks' units (seconds), ``(n,)``.
        last_pass: The ranks' latest window as one pass, ``(sizes, seconds)`` each ``(n,)``;
            called only when some slope needs the fallback.
        b_ref: The unit of sizes in the features (``u = b / b_ref``).

    Returns:
        The model, in seconds.
    """
    root = torch.linalg.cholesky(cov)
    bad = mean[:, 1] <= 0
    if bool(bad.any()):
        mean, root = mean.clone(), root.clone()
        pass_sizes, pass_times = last_pass()
        last_b = torch.as_tensor(pass_sizes, dtype=torch.float64)[bad]
        last_y = torch.as_tensor(pass_times, dtype=torch.float64)[bad]
        mean[bad] = 0.0
        mean[bad, 1] = last_y / scale[bad] * b_ref / last_b
        root[bad] = 0.0
    return SplineAffineModel(mean, root, features, scale)


def optimistic_quantile(posterior: GPyTorchPosterior, kappa: float) -> torch.Tensor:
    """The lower posterior quantile ``mean - kappa * sd`` through BoTorch's ``quantile``.

    This is the acquisition the planner water-fills: a rank's time at the
    ``Phi(-kappa)`` quantile, optimistic where the posterior is uncertain (optimism in the
    face of uncertainty, the lower-confidence-bound rule of GP-UCB for minimisation).

    Args:
        posterior: A posterior from :meth:`SplineAffineModel.posterior`.
        kappa: Standard deviations below the mean (0 gives the mean).

    Returns:
        The quantile, shape ``(N, G)``.
    """
    if kappa <= 0:
        return posterior.mean.squeeze(-1) if posterior.mean.dim() > 2 else posterior.mean
    level = torch.tensor(float(stats.norm.cdf(-kappa)), dtype=posterior.mean.dtype)
    out = posterior.quantile(level)
    return out.squeeze(-1) if out.dim() > 2 else out


def grid_quantile(
    model: Model, sizes: np.ndarray, kappa: float, var_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """A batched model's mean and optimistic quantile on one size grid shared by all ranks.

    Args:
        model: A model whose posterior at ``(G, 1)`` sizes has shape ``(N, G)``.
        sizes: The grid, shape ``(G,)``.
        kappa: Standard deviations of the quantile below the mean (0: the mean).
        var_points: The quantile's distance from the mean is computed on at most this many
            grid points and interpolated linearly between them.

    Returns:
        ``(mean, quantile)``, both ``(N, G)``.
    """
    grid = torch.as_tensor(np.asarray(sizes, dtype=np.float64))
    if isinstance(model, SplineAffineModel):  # the mean alone, without the covariance
        mean = model.mean(grid.unsqueeze(-1)).numpy()
    else:
        first = model.posterior(grid.unsqueeze(-1))
        assert isinstance(first, GPyTorchPosterior)
        mean = first.mean.squeeze(-1).numpy()
    if kappa <= 0:
        return mean, mean.copy()
    num_sizes = grid.numel()
    idx = np.unique(
        np.linspace(0, num_sizes - 1, min(num_sizes, var_points)).round().astype(np.int64)
    )
    var_sizes = grid[idx].unsqueeze(-1)
    # a quantile reads each size's marginal: the spline model gives it without its low-rank
    # covariance (the same variances, several times faster at thousands of ranks)
    post: Posterior
    if isinstance(model, SplineAffineModel):
        post = model.marginal_posterior(var_sizes)
    else:
        post = model.posterior(var_sizes)
    assert isinstance(post, GPyTorchPosterior)
    gap_c = (post.mean.squeeze(-1) - optimistic_quantile(post, kappa)).numpy()
    if len(idx) < num_sizes:  # linear interpolation between the computed points, all ranks at once
        pos = np.arange(num_sizes)
        upper = np.clip(np.searchsorted(idx, pos), 1, len(idx) - 1)
        lower = upper - 1
        weight = (pos - idx[lower]) / (idx[upper] - idx[lower])
        gap = gap_c[:, lower] * (1.0 - weight) + gap_c[:, upper] * weight
    else:
        gap = gap_c
    return mean, mean - gap
