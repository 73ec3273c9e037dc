"""Per-rank compute-time model: an affine prior mean plus a spline-kernel GP residual.

Every rank's compute time for micro-batch ``b`` is modelled as

    t_r(b) = a_r + b / rate_r + f_r(b),   f_r ~ GP(0, s^2 k_spline)

where ``k_spline`` is :class:`~lightning_rex.core.model.kernels.SplineKernel` on a log scale over
the sizes a rank can plausibly get, ``[b_ref / 16, 16 b_ref]`` clipped to ``[1, b_max]``
(``b_ref = B / N``): knots a constant ratio apart (1.53x with 16 cubic basis functions), so
a knee at 24 samples and a memory wall at 250 are both resolved whatever ``B``. (Over
``[0, B - N + 1]`` at 64 ranks the knots were 576 samples apart and every size in play sat
in the first interval.) Beyond the domain the spline is flat and the affine part
extrapolates. Compute time is
affine, not proportional, in ``b`` (``a_r = 0`` is the proportional model of LBB and BOA);
the GP residual captures the knee of an under-filled GPU and the memory wall.

Scale. The spline kernel has finite rank, so the GP is Bayesian linear regression on the
features ``[1, b / b_ref, phi(x)]`` with a Gaussian prior on the affine coefficients. That
posterior is computed in closed form, batched over all ranks in torch float64 (one
``D x D`` Cholesky per rank, ``D = 2 + num_basis``), which takes milliseconds at 4096 ranks,
where a batched exact GP fit takes minutes. Units are relative: each rank's times are divided
by its first observed median (its device group's median, when pooled), so one set of
hyperparameters serves every rank. Device groups pool partially (see ``groups``).

Hyperparameters. The residual scale ``s^2``, one for all ranks, is fitted with BoTorch
(:mod:`lightning_rex.core.model.fit`). The controller refits only when it needs a proposal. The
posterior is exposed as a BoTorch model (:meth:`RankTimeModel.posterior_model`), which the
planner reads.

Cold start. With one observation per rank the prior decides the split between overhead and
rate: ``a ~ N(0, 0.3^2)`` (relative), so the first proposal is close to the proportional plan;
the second plan's observations identify the affine part. Old observations are down-weighted
(their noise variance grows by ``exp(age / memory)``) so that drift and events are tracked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.model.saved_state import check_model_state

if TYPE_CHECKING:  # torch and BoTorch load when a model is built, not on import
    import torch

    from lightning_rex.core.model.posterior import SplineAffineModel

__all__ = ["RankTimeModel"]

_MIN_GROUP = 4
"""Groups smaller than this are not pooled (a member's own windows weigh on its prior)."""
_REACH = 16.0
"""The spline domain spans sizes from ``b_ref / _REACH`` to ``b_ref * _REACH``."""


def _solve(
    prior_prec: torch.Tensor, prior_rhs: torch.Tensor, gram: torch.Tensor, data: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian posterior of linear weights: precision ``prior_prec + gram``, batched."""
    import torch

    chol = torch.linalg.cholesky(prior_prec + gram)
    mu = torch.cholesky_solve((prior_rhs + data).unsqueeze(-1), chol).squeeze(-1)
    return mu, torch.cholesky_inverse(chol)


class RankTimeModel:
    """Batched per-rank time model over one set of ranks.

    Args:
        world_size: The number of ranks ``N``.
        global_batch: The global batch ``B``; ``b_ref = B / N`` normalizes the affine term.
        b_max: The largest micro-batch any rank may get (it bounds the spline domain).
        num_basis: Number of spline basis functions.
        outputscale: Initial residual variance ``s^2`` in relative units.
        overhead_prior_sd: Prior standard deviation of the relative overhead ``a``.
        slope_prior_sd: Prior standard deviation of the relative slope, as a fraction of its
            prior mean.
        memory: Age (in windows) at which an observation's weight has dropped by ``e``.
        max_history: The most windows kept; older ones are dropped.
        fit_ranks: Size of the rank subset for the BoTorch hyperparameter fit.
        fit_windows: The fit uses at most this many of the most recent windows.
        seed: Seed of the subset choice (with the fit count, so refits are reproducible).
        groups: Per-rank device labels, or None. Ranks with the same label share one curve
            (their windows are pooled into one posterior, in a common unit), so that at
            thousands of ranks the plan is not set by the worst of thousands of separate
            estimation errors. A rank whose speed changes (:meth:`forget`) leaves its group.
    """

    def __init__(
        self,
        world_size: int,
        global_batch: int,
        b_max: int,
        *,
        num_basis: int = 16,
        outputscale: float = 0.02**2,
        overhead_prior_sd: float = 0.3,
        slope_prior_sd: float = 0.5,
        memory: float = 12.0,
        max_history: int = 48,
        fit_ranks: int = 8,
        fit_windows: int = 48,
        seed: int = 0,
        groups: Sequence[str | None] | None = None,
    ) -> None:
        from lightning_rex.core.model.kernels import SplineKernel

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if b_max < 1:
            raise ValueError(f"b_max must be >= 1, got {b_max}")
        self.world_size = int(world_size)
        self.b_ref = float(global_batch) / world_size
        self.b_max = int(b_max)
        lower = max(1.0, self.b_ref / _REACH)
        upper = max(min(float(self.b_max), self.b_ref * _REACH), lower * 2.0)
        self.kernel = SplineKernel(num_basis, lower, upper, log_scale=True)
        self.outputscale = float(outputscale)
        self.overhead_prior_sd = float(overhead_prior_sd)
        self.slope_prior_sd = float(slope_prior_sd)
        self.memory = float(memory)
        self.max_history = int(max_history)
        self.fit_ranks = int(fit_ranks)
        self.fit_windows = int(fit_windows)
        self.seed = int(seed)
        self.n_fits = 0
        self.scale: np.ndarray | None = None
        self.first_u: np.ndarray | None = None
        self.sizes: list[list[int]] = []
        self.medians: list[list[float]] = []
        self.rel_var: list[float] = []
        self.n_added = 0
        self.cutoff = np.zeros(self.world_size, dtype=np.int64)
        self._post: tuple[torch.Tensor, torch.Tensor] | None = None
        if groups is not None and len(groups) != self.world_size:
            raise ValueError(f"groups must have {self.world_size} labels, got {len(groups)}")
        # group[r]: the index of the rank whose curve rank r shares (itself when alone)
        labels = [None] * self.world_size if groups is None else list(groups)
        first: dict[str, int] = {}
        self.group = np.array(
            [r if g is None else first.setdefault(str(g), r) for r, g in enumerate(labels)],
            dtype=np.int64,
        )

    # ----------------------------------------------------------------- data
    @property
    def n_obs(self) -> int:
        """The number of windows held."""
        return len(self.sizes)

    def add(self, plan: tuple[int, ...], medians: np.ndarray, rel_var: float) -> None:
        """Add one window's per-rank medians.

        Args:
            plan: The sizes the window ran under.
            medians: Per-rank median compute time, seconds, shape ``(N,)``.
            rel_var: Variance of a window median relative to its value (shared by ranks).
        """
        med = np.asarray(medians, dtype=np.float64)
        if self.scale is None:
            # a group's ranks share one unit (their median's), so their relative times are
            # one curve; a lone rank's unit is its own first median
            self.scale = med.copy()
            self.first_u = np.asarray(plan, dtype=np.float64) / self.b_ref
            for g in np.unique(self.group):
                members = self.group == g
                if members.sum() < _MIN_GROUP:
                    continue  # not pooled (see _posterior): each member keeps its own unit
                self.scale[members] = np.median(med[members])
                self.first_u[members] = np.mean(self.first_u[members])
        self.sizes.append([int(b) for b in plan])
        self.medians.append([float(m) for m in med])
        self.rel_var.append(float(max(rel_var, 1e-8)))
        self.n_added += 1
        if len(self.sizes) > self.max_history:
            del self.sizes[0], self.medians[0], self.rel_var[0]
        self._post = None

    def forget(self, ranks: list[int], keep_last: int) -> None:
        """Discount all but the last ``keep_last`` windows of some ranks (a change point).

        Their older observations stay stored but get a negligible weight, so the ranks'
        curves are re-learned from the recent windows and the prior.

        Args:
            ranks: The ranks whose curve changed.
            keep_last: How many recent windows still count for them.
        """
        self.cutoff[list(ranks)] = max(0, self.n_added - int(keep_last))
        # a rank whose speed changed is no longer like its group: it gets its own curve, and
        # a group led by it (group ids are a member's index) is led by its next member
        gone = np.zeros(self.world_size, dtype=bool)
        gone[list(ranks)] = True
        for r in ranks:
            rest = np.flatnonzero((self.group == r) & ~gone)
            if rest.size:
                self.group[rest] = rest.min()
        self.group[list(ranks)] = list(ranks)
        self._post = None

    def _features(self, b: torch.Tensor) -> torch.Tensor:
        import torch

        u = b / self.b_ref
        phi = self.kernel.features(b.unsqueeze(-1))
        return torch.cat([torch.ones_like(u).unsqueeze(-1), u.unsqueeze(-1), phi], dim=-1)

    def _prior(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        assert self.first_u is not None
        n, m = self.world_size, self.kernel.num_basis
        c0 = torch.as_tensor(1.0 / self.first_u, dtype=torch.float64)
        mean = torch.zeros(n, 2 + m, dtype=torch.float64)
        mean[:, 1] = c0
        var = torch.empty(n, 2 + m, dtype=torch.float64)
        var[:, 0] = self.overhead_prior_sd**2
        var[:, 1] = (self.slope_prior_sd * c0) ** 2
        var[:, 2:] = self.outputscale
        return mean, var

    def _data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        assert self.scale is not None
        b = torch.as_tensor(np.asarray(self.sizes, dtype=np.float64).T)  # (N, W)
        y = torch.as_tensor(np.asarray(self.medians).T / self.scale[:, None])  # (N, W)
        w = len(self.sizes)
        age = torch.arange(w - 1, -1, -1, dtype=torch.float64)
        v = torch.as_tensor(self.rel_var, dtype=torch.float64) * torch.exp(age / self.memory)
        index = torch.as_tensor(self.n_added - w + np.arange(w))
        old = index[None, :] < torch.as_tensor(self.cutoff)[:, None]
        v = v.expand(self.world_size, w) * torch.where(old, 1e8, 1.0)
        return b, y, v

    def _posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if self._post is None:
            if self.scale is None:
                raise RuntimeError("the model has no observations yet")
            b, y, v = self._data()
            phi = self._features(b)  # (N, W, D)
            m0, p0 = self._prior()
            prec = 1.0 / v
            gram = phi.transpose(-1, -2) @ (prec.unsqueeze(-1) * phi)  # (N, D, D)
            data = (phi * (prec * y).unsqueeze(-1)).sum(-2)  # (N, D)
            prior_prec = torch.diag_embed(1.0 / p0)
            mu, cov = _solve(prior_prec, m0 / p0, gram, data)
            g = torch.as_tensor(self.group)
            ones = torch.ones(self.world_size, dtype=torch.float64)
            pooled = (torch.zeros_like(ones).index_add_(0, g, ones)[g] >= _MIN_GROUP).view(-1, 1)
            if bool(pooled.any()):
                mu_p, cov_p = self._partial_pool(prior_prec, m0 / p0, gram, data, phi, y, prec, g)
                mu = torch.where(pooled, mu_p, mu)
                cov = torch.where(pooled.unsqueeze(-1), cov_p, cov)
            self._post = (mu, cov)
        return self._post

    def _partial_pool(
        self,
        prior_prec: torch.Tensor,
        prior_rhs: torch.Tensor,
        gram: torch.Tensor,
        data: torch.Tensor,
        phi: torch.Tensor,
        y: torch.Tensor,
        prec: torch.Tensor,
        g: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial pooling within device groups: the group's curve times a shrunk per-rank level.

        The group's posterior comes from all its members' windows. Each member's own level
        relative to it, the precision-weighted mean of ``log(y / group curve)`` over its
        windows, is shrunk toward 0 by ``tau^2 / (tau^2 + se^2)``, with ``tau^2`` the spread of
        the members' levels beyond their noise (method of moments). Identical units follow
        their group (their levels are noise, ``tau^2`` near 0); a unit that is truly faster
        than its group (unit-to-unit spread) keeps its own level.
        """
        import torch

        sum_gram = torch.zeros_like(gram).index_add_(0, g, gram)[g]
        sum_data = torch.zeros_like(data).index_add_(0, g, data)[g]
        mu_g, cov_g = _solve(prior_prec, prior_rhs, sum_gram, sum_data)
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
        return mu_g * f.unsqueeze(-1), cov_g * (f * f).view(-1, 1, 1)

    # ------------------------------------------------------------- predict
    def posterior_model(self) -> SplineAffineModel:
        """The current posterior as a BoTorch model (see :mod:`lightning_rex.core.model.posterior`).

        A rank whose fitted slope is not positive (a change it has not yet been told about,
        or too little spread in its sizes) would offer "free" capacity to the planner: it
        falls back to the proportional model through its latest observation, with no claimed
        certainty, since compute time never falls as the batch grows.

        Returns:
            The :class:`SplineAffineModel`, in seconds.

        Raises:
            RuntimeError: Before the first observation.
        """
        import torch

        from lightning_rex.core.model.posterior import SplineAffineModel

        if self.scale is None:
            raise RuntimeError("the model has no observations yet")
        mu, cov = self._posterior()
        root = torch.linalg.cholesky(cov)
        bad = mu[:, 1] <= 0
        if bool(bad.any()):
            mu, root = mu.clone(), root.clone()
            last_b = torch.as_tensor(self.sizes[-1], dtype=torch.float64)[bad]
            last_y = (
                torch.as_tensor(self.medians[-1], dtype=torch.float64)[bad]
                / torch.as_tensor(self.scale, dtype=torch.float64)[bad]
            )
            mu[bad] = 0.0
            mu[bad, 1] = last_y * self.b_ref / last_b
            root[bad] = 0.0
        return SplineAffineModel(
            mu, root, self._features, torch.as_tensor(self.scale, dtype=torch.float64)
        )

    def predict_grid(
        self, sizes: np.ndarray, kappa: float = 0.0, var_points: int = 96
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and optimistic quantile of every rank's time on a size grid.

        Both are read from :meth:`posterior_model`'s ``posterior()``; the quantile is
        BoTorch's (:func:`~lightning_rex.core.model.posterior.optimistic_quantile`).

        Args:
            sizes: Increasing micro-batch sizes, shape ``(G,)``.
            kappa: Standard deviations of the quantile below the mean (0: the mean).
            var_points: The quantile's distance from the mean is computed on at most this
                many grid points and linearly interpolated in between (it is smooth), so
                that no ``N x G x D`` array is built on a long grid.

        Returns:
            ``(mean, quantile)``, both shape ``(N, G)`` in seconds.
        """
        import torch

        from lightning_rex.core.model.posterior import optimistic_quantile

        model = self.posterior_model()
        grid = torch.as_tensor(np.asarray(sizes, dtype=np.float64))
        mean = model.posterior(grid.unsqueeze(-1)).mean.squeeze(-1).numpy()
        if kappa <= 0:
            return mean, mean.copy()
        g = grid.numel()
        idx = np.unique(np.linspace(0, g - 1, min(g, var_points)).round().astype(np.int64))
        post = model.posterior(grid[idx].unsqueeze(-1))
        gap_c = (post.mean.squeeze(-1) - optimistic_quantile(post, kappa)).numpy()
        if len(idx) < g:  # linear interpolation between the computed points, all ranks at once
            pos = np.arange(g)
            hi = np.clip(np.searchsorted(idx, pos), 1, len(idx) - 1)
            lo = hi - 1
            w = (pos - idx[lo]) / (idx[hi] - idx[lo])
            gap = gap_c[:, lo] * (1.0 - w) + gap_c[:, hi] * w
        else:
            gap = gap_c
        return mean, mean - gap

    def predict(self, plan: tuple[int, ...]) -> np.ndarray:
        """Posterior mean time of every rank at its size in ``plan``, seconds, shape (N,)."""
        import torch

        x = torch.as_tensor(np.asarray(plan, dtype=np.float64)).reshape(-1, 1, 1)
        return self.posterior_model().posterior(x).mean.reshape(-1).numpy()

    def summary(self) -> dict[str, list[float]]:
        """Fitted per-rank affine parts: ``overhead_s`` (a_r) and ``rate`` (samples/s).

        Returns:
            A dict of lists, one entry per rank; a rate is ``inf`` when the fitted slope is
            not positive.
        """
        if self.scale is None:
            return {"overhead_s": [], "rate": []}
        mu, _ = self._posterior()
        a = mu[:, 0].numpy() * self.scale
        slope = mu[:, 1].numpy() * self.scale / self.b_ref
        rate = np.where(slope > 0, 1.0 / np.maximum(slope, 1e-300), math.inf)
        return {"overhead_s": [float(x) for x in a], "rate": [float(x) for x in rate]}

    # ---------------------------------------------------------------- fit
    def fit_hyperparameters(self) -> float:
        """Refit the residual scale ``s^2`` with BoTorch on a seeded subset of ranks.

        Skipped (the current value is kept) with fewer than 3 windows or one distinct size.

        Returns:
            The residual scale in use afterwards.
        """
        from lightning_rex.core.model.fit import fit_residual_scale

        if self.n_obs < 3 or self.scale is None:
            return self.outputscale
        b, y, v = (a[:, -self.fit_windows :] for a in self._data())
        # a seeded subset of ranks, drawn afresh at every fit (reproducible from the count)
        rng = np.random.default_rng([self.seed, self.n_fits])
        self.n_fits += 1
        sub = np.sort(
            rng.choice(self.world_size, size=min(self.world_size, self.fit_ranks), replace=False)
        )
        k = self.kernel
        scale = fit_residual_scale(
            b[sub],
            y[sub],
            v[sub],
            (k.num_basis, k.lower, k.upper),
            self.outputscale,
            self.seed + self.n_fits,
        )
        if scale is not None:
            self.outputscale = float(min(max(scale, 1e-6), 0.25))
            self._post = None
        return self.outputscale

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: observations, scale, hyperparameters and fit count."""
        return {
            "outputscale": self.outputscale,
            "n_fits": self.n_fits,
            "scale": None if self.scale is None else [float(s) for s in self.scale],
            "first_u": None if self.first_u is None else [float(s) for s in self.first_u],
            "sizes": [list(r) for r in self.sizes],
            "medians": [list(r) for r in self.medians],
            "rel_var": list(self.rel_var),
            "n_added": self.n_added,
            "cutoff": [int(c) for c in self.cutoff],
            "group": [int(g) for g in self.group],
        }

    #: Check saved model state against the number of ranks, without loading it: see
    #: :func:`~lightning_rex.core.model.saved_state.check_model_state`.
    check_state = staticmethod(check_model_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Args:
            d: A dict from :meth:`state_dict`.

        Raises:
            StateError: Naming the field, when the state does not fit (see
                :meth:`check_state`).
        """
        c = self.check_state(d, self.world_size)
        self.outputscale = c["outputscale"]
        self.n_fits = c["n_fits"]
        self.scale = None if c["scale"] is None else np.asarray(c["scale"], dtype=np.float64)
        self.first_u = None if c["first_u"] is None else np.asarray(c["first_u"], dtype=np.float64)
        self.sizes = c["sizes"]
        self.medians = c["medians"]
        self.rel_var = c["rel_var"]
        self.n_added = c["n_added"]
        self.cutoff = np.asarray(c["cutoff"], dtype=np.int64)
        self.group = np.asarray(c["group"], dtype=np.int64)
        self._post = None
