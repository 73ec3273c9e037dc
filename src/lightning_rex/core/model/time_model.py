"""Per-rank compute-time model: an affine prior mean plus a spline-kernel GP residual.

Every rank's compute time for micro-batch ``b`` is modelled as

    t_r(b) = a_r + b / rate_r + c_r pad_T(b) + f_r(b),   f_r ~ GP(0, s^2 k_spline)

where ``k_spline`` is :class:`~lightning_rex.core.model.kernels.SplineKernel` on a log scale
over the sizes a rank can plausibly get, ``[b_ref / 16, 16 b_ref]`` clipped to ``[1, b_max]``
(``b_ref = B / N``): knots a constant ratio apart (1.53x with 16 cubic basis functions), so
a knee at 24 samples and a memory wall at 250 are both resolved whatever ``B``. Beyond the
domain the spline is flat and the affine part extrapolates. Compute time is affine, not
proportional, in ``b`` (``a_r = 0`` is the proportional model of LBB and BOA); the GP
residual captures the knee of an under-filled GPU and the memory wall. ``pad_T(b)`` is the
padding of ``b`` up to a multiple of a tile ``T``: a staircase no smooth spline resolves.
Which tile a rank has is inferred (:mod:`~lightning_rex.core.model.tiles`), and predictions
average the tile hypotheses by their posterior probability
(:mod:`~lightning_rex.core.model.mixture`).

Scale. The spline kernel has finite rank, so the GP is Bayesian linear regression on the
features ``[1, b / b_ref, pad_T(b), phi(b)]`` with a Gaussian prior on the weights, solved in
closed form for all ranks at once (:mod:`~lightning_rex.core.model.pooling`; one ``D x D``
Cholesky per rank and tile, ``D = 3 + num_basis``): milliseconds at 4096 ranks, where a
batched exact GP fit takes minutes. Units are relative: each rank's times are divided by its
first observed median (its device group's median, when pooled), so one set of
hyperparameters serves every rank. Device groups pool partially (see ``groups``).

Hyperparameters. The residual scale ``s^2``, one for all ranks, is fitted with BoTorch
(:mod:`lightning_rex.core.model.fit`). The controller refits only when it needs a proposal.
The posterior is exposed as a BoTorch model (:meth:`RankTimeModel.posterior_model`), which
the planner reads.

Cold start. With one observation per rank the prior decides the split between overhead and
rate: ``a ~ N(0, 0.3^2)`` (relative), so the first proposal is close to the proportional
plan; the second plan's observations identify the affine part. Old observations are
down-weighted (their noise variance grows by ``exp(age / memory)``) so that drift and events
are tracked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.model.accumulation import PassAccumulation
from lightning_rex.core.model.pooling import pooled_posterior
from lightning_rex.core.model.saved_state import SavedModelState
from lightning_rex.core.model.tiles import (
    HYPOTHESES,
    PADS,
    hypothesis_weights,
    pad_prior,
    pads,
)

if TYPE_CHECKING:  # torch and BoTorch load when a model is built, not on import
    import torch

    from lightning_rex.core.model.posterior import SplineAffineModel

__all__ = ["RankTimeModel"]


_MIN_GROUP = 4
"""Groups smaller than this are not pooled (a member's own windows weigh on its prior)."""
_REACH = 16.0
"""The spline domain spans sizes from ``b_ref / _REACH`` to ``b_ref * _REACH``."""


class RankTimeModel(PassAccumulation, SavedModelState):
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
        pass_caps: Per-rank pass caps (samples per pass, None entries for none), or None: a
            larger size runs as accumulation passes, and the model learns one pass and
            predicts whole steps (:mod:`~lightning_rex.core.model.accumulation`).
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
        pass_caps: Sequence[int | None] | None = None,
    ) -> None:
        # BoTorch and GPyTorch load when a model is built, not inside its first decision
        from lightning_rex.core.model import posterior  # noqa: F401
        from lightning_rex.core.model.fit import load_fitting
        from lightning_rex.core.model.kernels import SplineKernel

        load_fitting()

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
        self.window_caps: list[list[int] | None] = []  # the pass caps each window ran under
        self.set_pass_caps(pass_caps)
        self.n_added = 0
        self.cutoff = np.zeros(self.world_size, dtype=np.int64)
        self._weights = np.zeros((self.world_size, len(HYPOTHESES)))
        self._weights[:, 0] = 1.0
        self._post: tuple[torch.Tensor, torch.Tensor] | None = None
        # the tile weights depend on the data, not on the residual scale: a refit keeps them
        self._weights_fresh = False
        self._tile_posts: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
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
        caps = self._caps_row()
        if self.scale is None:
            # a group's ranks share one unit (their median's), so their relative times are
            # one curve; a lone rank's unit is its own first median (of one pass)
            pass_sizes, pass_times = self._single_passes(
                np.asarray(plan, dtype=np.float64), med, [caps]
            )
            self.scale = pass_times.copy()
            self.first_u = pass_sizes / self.b_ref
            for group_id in np.unique(self.group):
                members = self.group == group_id
                if members.sum() < _MIN_GROUP:
                    continue  # not pooled (see _posterior): each member keeps its own unit
                self.scale[members] = np.median(pass_times[members])
                self.first_u[members] = np.mean(self.first_u[members])
        self.sizes.append([int(b) for b in plan])
        self.medians.append([float(m) for m in med])
        self.rel_var.append(float(max(rel_var, 1e-8)))
        self.window_caps.append(caps)
        self.n_added += 1
        if len(self.sizes) > self.max_history:
            del self.sizes[0], self.medians[0], self.rel_var[0], self.window_caps[0]
        self._post, self._weights_fresh = None, False

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
        for rank in ranks:
            rest = np.flatnonzero((self.group == rank) & ~gone)
            if rest.size:
                self.group[rest] = rest.min()
        self.group[list(ranks)] = list(ranks)
        self._post, self._weights_fresh = None, False

    def _features(self, b: torch.Tensor, hypothesis: Any = None) -> torch.Tensor:
        """``[1, u, pad_T(b), pad_W(b), phi(b)]`` with ``u = b / b_ref``.

        The paddings of a ``(tile, wave)`` hypothesis
        (:func:`~lightning_rex.core.model.tiles.pads`): one pair, one per rank (``(N, 2)``,
        aligned with ``b``'s first dimension), or None (zeros).
        """
        import torch

        u = b / self.b_ref
        phi = self.kernel.features(b.unsqueeze(-1))
        padding = pads(b, hypothesis, self.b_ref)
        return torch.cat([torch.ones_like(u).unsqueeze(-1), u.unsqueeze(-1), padding, phi], dim=-1)

    def _prior(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        assert self.first_u is not None
        num_ranks, num_basis = self.world_size, self.kernel.num_basis
        slope_mean = torch.as_tensor(1.0 / self.first_u, dtype=torch.float64)
        mean = torch.zeros(num_ranks, PADS.stop + num_basis, dtype=torch.float64)
        mean[:, 1] = slope_mean
        var = torch.empty(num_ranks, PADS.stop + num_basis, dtype=torch.float64)
        var[:, 0] = self.overhead_prior_sd**2
        var[:, 1] = (self.slope_prior_sd * slope_mean) ** 2
        # the paddings' costs: about the slope when a tile (a wave) is real
        var[:, PADS] = (slope_mean**2).unsqueeze(-1)
        var[:, PADS.stop :] = self.outputscale
        return mean, var

    def _data(self, decay: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sizes, relative medians and their noise variances, ``(N, W)`` each.

        With ``decay`` older windows count less (their variance grows with age, so that
        drift is tracked); windows before a rank's change point never count.
        """
        import torch

        assert self.scale is not None
        # an accumulating rank's window is one pass of its mean pass size
        sizes, medians = self._single_passes(
            np.asarray(self.sizes, dtype=np.float64).T, np.asarray(self.medians).T, self.window_caps
        )
        batch_sizes = torch.as_tensor(sizes)  # (N, W)
        rel_times = torch.as_tensor(medians / self.scale[:, None])  # (N, W)
        n_windows = len(self.sizes)
        age = torch.arange(n_windows - 1, -1, -1, dtype=torch.float64)
        # the noise is relative to each median (a window at half the first size's time has
        # half its noise in these units)
        noise_var = torch.as_tensor(self.rel_var, dtype=torch.float64)
        if decay:
            noise_var = noise_var * torch.exp(age / self.memory)
        noise_var = noise_var * rel_times.clamp_min(1e-6) ** 2
        index = torch.as_tensor(self.n_added - n_windows + np.arange(n_windows))
        old = index[None, :] < torch.as_tensor(self.cutoff)[:, None]
        noise_var = noise_var * torch.where(old, 1e8, 1.0)
        return batch_sizes, rel_times, noise_var

    def _posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if self._post is None:
            if self.scale is None:
                raise RuntimeError("the model has no observations yet")
            batch_sizes, rel_times, noise_var = self._data()
            prior_mean, prior_var = self._prior()
            prec = 1.0 / noise_var
            phi = self._features(batch_sizes)
            # A tile belongs to the kernels, not to the rank's current speed: its evidence
            # keeps every window since the rank's last change point at full weight. Each
            # hypothesis's evidence is maximised over residual scales, so the weights
            # outlive a refit of the scale.
            if not self._weights_fresh:
                kept = 1.0 / self._data(decay=False)[2]
                self._weights = hypothesis_weights(
                    phi, batch_sizes, rel_times, kept, prior_mean, prior_var, self.group, self.b_ref
                )
                self._weights_fresh = True
            best = self._weights.argmax(axis=1)
            used = set(np.flatnonzero((self._weights > 0).any(axis=0)).tolist())
            self._tile_posts = {
                HYPOTHESES[i]: self._solve_tile(
                    HYPOTHESES[i], phi, batch_sizes, rel_times, prec, prior_mean, prior_var
                )
                for i in sorted(used)
            }
            # the posterior under each rank's most probable hypothesis
            post_mean, cov = (x.clone() for x in self._tile_posts[HYPOTHESES[int(best[0])]])
            for hyp_index in set(best.tolist()):
                rows = torch.as_tensor(best == hyp_index)
                post_mean[rows], cov[rows] = (
                    x[rows] for x in self._tile_posts[HYPOTHESES[hyp_index]]
                )
            self._post = (post_mean, cov)
        return self._post

    def _solve_tile(
        self,
        hypothesis: tuple[int, int],
        phi: torch.Tensor,
        b: torch.Tensor,
        y: torch.Tensor,
        prec: torch.Tensor,
        m0: torch.Tensor,
        p0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's weight posterior ``(mean, cov)`` under one ``(tile, wave)``."""
        features = phi.clone()  # (N, W, D), the paddings' columns filled in
        features[..., PADS] = pads(b, hypothesis, self.b_ref)
        return pooled_posterior(
            features, y, prec, pad_prior(m0, hypothesis), p0, self.group, _MIN_GROUP
        )

    # ------------------------------------------------------------- predict
    def posterior_model(self) -> SplineAffineModel:
        """The current posterior as a BoTorch model (see :mod:`lightning_rex.core.model.posterior`).

        Each rank's posterior under its most probable tile and wave (:attr:`tile`); the
        planner reads the hypotheses' mixture through :meth:`predict_grid`. A rank whose
        fitted slope is not positive (a change it has not yet been told about, or too little
        spread in its sizes) would offer "free" capacity to the planner: it falls back to the
        proportional model through its latest observation, with no claimed certainty, since
        compute time never falls as the batch grows.

        Returns:
            The :class:`SplineAffineModel`, in seconds.

        Raises:
            RuntimeError: Before the first observation.
        """
        if self.scale is None:
            raise RuntimeError("the model has no observations yet")
        return self._as_model(*self._posterior(), self._features_at)

    def _as_model(
        self,
        mu: torch.Tensor,
        cov: torch.Tensor,
        features: Callable[[torch.Tensor], torch.Tensor],
        rows: np.ndarray | None = None,
    ) -> SplineAffineModel:
        """A weight posterior as a BoTorch model, with the fallback for non-positive slopes.

        With ``rows``, a model of those ranks only (``mu`` and ``cov`` are theirs).
        """
        import torch

        from lightning_rex.core.model.posterior import SplineAffineModel

        rank_index = np.arange(self.world_size) if rows is None else np.flatnonzero(rows)
        scale = torch.as_tensor(np.asarray(self.scale)[rank_index], dtype=torch.float64)
        root = torch.linalg.cholesky(cov)
        bad = mu[:, 1] <= 0
        if bool(bad.any()):
            mu, root = mu.clone(), root.clone()
            pass_sizes, pass_times = self._single_passes(
                np.asarray(self.sizes[-1], dtype=np.float64),
                np.asarray(self.medians[-1]),
                self.window_caps[-1:],
            )
            last_b = torch.as_tensor(pass_sizes[rank_index], dtype=torch.float64)[bad]
            last_y = torch.as_tensor(pass_times[rank_index], dtype=torch.float64)[bad]
            mu[bad] = 0.0
            mu[bad, 1] = last_y / scale[bad] * self.b_ref / last_b
            root[bad] = 0.0
        return SplineAffineModel(mu, root, features, scale)

    def summary(self) -> dict[str, list[float]]:
        """Fitted per-rank affine parts: ``overhead_s`` (a_r) and ``rate`` (samples/s).

        Returns:
            A dict of lists, one entry per rank; a rate is ``inf`` when the fitted slope is
            not positive.
        """
        if self.scale is None:
            return {"overhead_s": [], "rate": []}
        post_mean, _ = self._posterior()
        overhead = post_mean[:, 0].numpy() * self.scale
        slope = post_mean[:, 1].numpy() * self.scale / self.b_ref
        rate = np.where(slope > 0, 1.0 / np.maximum(slope, 1e-300), math.inf)
        return {"overhead_s": [float(x) for x in overhead], "rate": [float(x) for x in rate]}

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
        import torch

        self._posterior()  # the tiles in use
        batch_sizes, rel_times, noise_var = (a[:, -self.fit_windows :] for a in self._data())
        tile_sizes = torch.as_tensor(self.tile[:, 0], dtype=batch_sizes.dtype).view(-1, 1)
        # the sizes as the kernels run them (a full tile's cost)
        batch_sizes = torch.ceil(batch_sizes / tile_sizes) * tile_sizes
        # a seeded subset of ranks, drawn afresh at every fit (reproducible from the count)
        rng = np.random.default_rng([self.seed, self.n_fits])
        self.n_fits += 1
        sub = np.sort(
            rng.choice(self.world_size, size=min(self.world_size, self.fit_ranks), replace=False)
        )
        kernel = self.kernel
        scale = fit_residual_scale(
            batch_sizes[sub],
            rel_times[sub],
            noise_var[sub],
            (kernel.num_basis, kernel.lower, kernel.upper),
            self.outputscale,
            self.seed + self.n_fits,
        )
        if scale is not None:
            self.outputscale = float(min(max(scale, 1e-6), 0.25))
            self._post = None
        return self.outputscale
