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

The spline kernel has finite rank, so the GP is Bayesian linear regression on the features
with a Gaussian prior on the weights, solved in closed form for all ranks at once (its data,
prior, units and cold start: :mod:`~lightning_rex.core.model.weights`). The residual scale
``s^2`` is fitted with BoTorch (:mod:`~lightning_rex.core.model.fit`), and the posterior is
read as a BoTorch model (:meth:`RankTimeModel.posterior_model`). Accumulation passes are
:mod:`~lightning_rex.core.model.accumulation`'s: the model learns one pass, predicts steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.model.accumulation import AccumulationCaps
from lightning_rex.core.model.mixture import TileMixture
from lightning_rex.core.model.pooling import device_groups, leave_groups
from lightning_rex.core.model.saved_state import check_model_state, model_state
from lightning_rex.core.model.tiles import HYPOTHESES, hypothesis_weights, pads
from lightning_rex.core.model.weights import first_units, tile_posteriors, weight_prior, window_data

if TYPE_CHECKING:  # torch and BoTorch load when a model is built, not on import
    import torch

    from lightning_rex.core.model.posterior import SplineAffineModel

__all__ = ["RankTimeModel"]


_MIN_GROUP = 4
"""Groups smaller than this are not pooled (a member's own windows weigh on its prior)."""
_REACH = 16.0
"""The spline domain spans sizes from ``b_ref / _REACH`` to ``b_ref * _REACH``."""


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
        # the caps now and those each window ran under: it learns one pass, predicts steps
        self.passes = AccumulationCaps(self.world_size, pass_caps)
        self.n_added = 0
        self.cutoff = np.zeros(self.world_size, dtype=np.int64)
        self._weights = np.zeros((self.world_size, len(HYPOTHESES)))
        self._weights[:, 0] = 1.0
        self._post: tuple[torch.Tensor, torch.Tensor] | None = None
        # the tile weights depend on the data, not on the residual scale: a refit keeps them
        self._weights_fresh = False
        self._mixture: TileMixture | None = None  # the tile mixture of the posterior
        # group[r]: the index of the rank whose curve rank r shares (itself when alone)
        self.group = device_groups(groups, self.world_size)

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
        caps = self.passes.row()
        if self.scale is None:  # the units: each rank's first window, as one pass
            first = self.passes.single_passes(np.asarray(plan, dtype=np.float64), med, [caps])
            self.scale, self.first_u = first_units(*first, self.group, self.b_ref, _MIN_GROUP)
        self.sizes.append([int(b) for b in plan])
        self.medians.append([float(m) for m in med])
        self.rel_var.append(float(max(rel_var, 1e-8)))
        self.passes.windows.append(caps)
        self.n_added += 1
        if len(self.sizes) > self.max_history:
            del self.sizes[0], self.medians[0], self.rel_var[0], self.passes.windows[0]
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
        leave_groups(self.group, ranks)  # a rank whose speed changed gets its own curve
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

    def _data(self, decay: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sizes, relative medians and their noise variances, ``(N, W)`` each.

        With ``decay`` older windows count less (their variance grows with age, so that
        drift is tracked); windows before a rank's change point never count.
        """
        assert self.scale is not None
        # an accumulating rank's window is one pass of its mean pass size
        sizes, medians = self.passes.single_passes(
            np.asarray(self.sizes, dtype=np.float64).T,
            np.asarray(self.medians).T,
            self.passes.windows,
        )
        first = self.n_added - len(self.sizes)
        memory = self.memory if decay else None
        return window_data(sizes, medians, self.rel_var, self.scale, first, self.cutoff, memory)

    def _posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._post is None:
            if self.scale is None or self.first_u is None:
                raise RuntimeError("the model has no observations yet")
            batch_sizes, rel_times, noise_var = self._data()
            prior_sd = (self.overhead_prior_sd, self.slope_prior_sd)
            prior = weight_prior(self.first_u, self.kernel.num_basis, *prior_sd, self.outputscale)
            phi = self._features(batch_sizes)
            # A tile belongs to the kernels, not to the rank's current speed: its evidence
            # keeps every window since the rank's last change point at full weight. Each
            # hypothesis's evidence is maximised over residual scales, so the weights
            # outlive a refit of the scale.
            if not self._weights_fresh:
                kept = 1.0 / self._data(decay=False)[2]
                self._weights = hypothesis_weights(
                    phi, batch_sizes, rel_times, kept, *prior, self.group, self.b_ref
                )
                self._weights_fresh = True
            data = (phi, batch_sizes, rel_times, 1.0 / noise_var)
            posteriors, self._post = tile_posteriors(
                *data, prior, self._weights, self.group, self.b_ref, _MIN_GROUP
            )
            self._mixture = TileMixture(self.world_size, self._weights, posteriors, self._model_of)
        return self._post

    # ------------------------------------------------------------- predict
    @property
    def tile_weights(self) -> np.ndarray:
        """Each rank's posterior probability of every tile hypothesis, ``(N, H)``.

        In the order of :data:`~lightning_rex.core.model.tiles.HYPOTHESES`
        (:func:`~lightning_rex.core.model.tiles.hypothesis_weights`); all on no tile before
        the first window.
        """
        if self.scale is not None:
            self._posterior()
        return self._weights

    @property
    def tile(self) -> np.ndarray:
        """Each rank's most probable ``(tile, wave)``, ``(N, 2)`` (1: none of that kind)."""
        return np.asarray(HYPOTHESES, dtype=np.int64)[self.tile_weights.argmax(axis=1)]

    def mixture(self) -> list[tuple[SplineAffineModel, np.ndarray]]:
        """The tile hypotheses in use as BoTorch models, with every rank's weight on each.

        Returns:
            :meth:`TileMixture.models <lightning_rex.core.model.mixture.TileMixture.models>`
            of the current posterior.
        """
        return self._tile_mixture().models()

    def predict_grid(
        self, sizes: np.ndarray, kappa: float = 0.0, var_points: int = 96
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and optimistic quantile of every rank's step time on a size grid.

        The tile mixture's single-pass predictions, summed over a rank's passes where its
        size exceeds its pass cap (:mod:`~lightning_rex.core.model.accumulation`).

        Args:
            sizes: The grid, shape ``(G,)``, shared by all ranks.
            kappa: Standard deviations of the quantile below the mean (0: the mean).
            var_points: The quantile's distance from the mean is computed on at most this
                many grid points and interpolated linearly between them.

        Returns:
            ``(mean, quantile)``, both shape ``(N, G)`` in seconds.
        """
        return self.passes.step_grid(self._tile_mixture().predict_grid, sizes, kappa, var_points)

    def predict(self, plan: tuple[int, ...]) -> np.ndarray:
        """Posterior mean step time of every rank at its size in ``plan``, passes included.

        Args:
            plan: Per-rank sizes.

        Returns:
            Seconds, shape ``(N,)``.
        """
        return self.passes.step_times(self._tile_mixture().predict, plan)

    def _tile_mixture(self) -> TileMixture:
        """The tile mixture of the current posterior."""
        self._posterior()
        assert self._mixture is not None
        return self._mixture

    def _model_of(
        self, mean: torch.Tensor, cov: torch.Tensor, hypothesis: Any, rows: np.ndarray | None
    ) -> SplineAffineModel:
        """A hypothesis's weight posterior as a model (of the ranks ``rows`` selects)."""

        def features(sizes: torch.Tensor) -> torch.Tensor:
            return self._features(sizes, hypothesis)

        return self._as_model(mean, cov, features, rows)

    def _features_at(self, b: torch.Tensor) -> torch.Tensor:
        """Features with each rank's most probable tile (``(G,)`` sizes expand to ``(N, G)``)."""
        tile = self.tile
        if bool((tile == 1).all()):
            return self._features(b, (1, 1))
        sizes = b.expand(self.world_size, -1) if b.dim() == 1 else b
        return self._features(sizes, tile)

    def posterior_model(self) -> SplineAffineModel:
        """The current posterior as a BoTorch model (see :mod:`lightning_rex.core.model.posterior`).

        Each rank's posterior under its most probable tile and wave (:attr:`tile`); the
        planner reads the hypotheses' mixture through :meth:`predict_grid`. A rank whose
        fitted slope is not positive falls back to the proportional model through its latest
        observation (:func:`~lightning_rex.core.model.posterior.weights_model`).

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
        mean: torch.Tensor,
        cov: torch.Tensor,
        features: Callable[[torch.Tensor], torch.Tensor],
        rows: np.ndarray | None = None,
    ) -> SplineAffineModel:
        """A weight posterior as a BoTorch model (of the ranks ``rows`` selects, or all)."""
        import torch

        from lightning_rex.core.model.posterior import weights_model

        rank_index = np.arange(self.world_size) if rows is None else np.flatnonzero(rows)
        scale = torch.as_tensor(np.asarray(self.scale)[rank_index], dtype=torch.float64)

        def last_pass() -> tuple[np.ndarray, np.ndarray]:
            sizes, times = self.passes.single_passes(
                np.asarray(self.sizes[-1], dtype=np.float64),
                np.asarray(self.medians[-1]),
                self.passes.windows[-1:],
            )
            return sizes[rank_index], times[rank_index]

        return weights_model(mean, cov, features, scale, last_pass, self.b_ref)

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

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: observations, scale, hyperparameters and fit count.

        Returns:
            The state (:func:`~lightning_rex.core.model.saved_state.model_state`).
        """
        return model_state(self)

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
        state = self.check_state(d, self.world_size)
        scale, first_u, caps = state["scale"], state["first_u"], state["pass_caps"]
        self.outputscale, self.n_fits = state["outputscale"], state["n_fits"]
        self.scale = None if scale is None else np.asarray(scale, dtype=np.float64)
        self.first_u = None if first_u is None else np.asarray(first_u, dtype=np.float64)
        self.sizes, self.medians, self.rel_var = state["sizes"], state["medians"], state["rel_var"]
        self.n_added = state["n_added"]
        self.cutoff = np.asarray(state["cutoff"], dtype=np.int64)
        self.group = np.asarray(state["group"], dtype=np.int64)
        self.passes.current = None if caps is None or not any(caps) else np.asarray(caps, np.int64)
        self.passes.windows = state["window_caps"]
        self._post, self._weights_fresh = None, False

    # ---------------------------------------------------------------- fit
    def fit_hyperparameters(self) -> float:
        """Refit the residual scale ``s^2`` with BoTorch on a seeded subset of ranks.

        Skipped (the current value is kept) with fewer than 3 windows or one distinct size.

        Returns:
            The residual scale in use afterwards.
        """
        from lightning_rex.core.model.fit import fit_on_subset

        if self.n_obs < 3 or self.scale is None:
            return self.outputscale
        self._posterior()  # the tiles in use
        data = tuple(values[:, -self.fit_windows :] for values in self._data())
        kernel = self.kernel
        self.n_fits += 1  # a subset drawn afresh at every fit, reproducible from the count
        scale = fit_on_subset(
            data,
            self.tile[:, 0],
            (kernel.num_basis, kernel.lower, kernel.upper),
            self.outputscale,
            min(self.world_size, self.fit_ranks),
            self.seed,
            self.n_fits,
        )
        if scale is not None:
            self.outputscale = float(min(max(scale, 1e-6), 0.25))
            self._post = None
        return self.outputscale
