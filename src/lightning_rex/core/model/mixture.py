"""The time model's tile mixture: predictions averaged over the tile hypotheses.

:class:`TileMixture` gives :class:`~lightning_rex.core.model.time_model.RankTimeModel` its
tile weights (:attr:`TileMixture.tile_weights`, :attr:`TileMixture.tile`), the hypotheses
in use as BoTorch models (:meth:`TileMixture.mixture`) and the predictions that mix them
with each rank's weights (:meth:`TileMixture.predict_grid`, :meth:`TileMixture.predict`):
Bayesian model averaging over the ``(tile, wave)`` hypotheses of
:mod:`~lightning_rex.core.model.tiles`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_rex.core.model.tiles import HYPOTHESES

if TYPE_CHECKING:  # torch and BoTorch load when a model is built, not on import
    import torch

    from lightning_rex.core.model.posterior import SplineAffineModel

__all__ = ["TileMixture"]


class TileMixture:
    """Tile weights, the tile hypotheses' models and their mixed predictions."""

    world_size: int
    scale: np.ndarray | None
    _weights: np.ndarray
    _tile_posts: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]
    _rows_cache: tuple[Any, list[tuple[SplineAffineModel, np.ndarray, np.ndarray]]] | None = None

    if TYPE_CHECKING:  # provided by the time model

        def _posterior(self) -> tuple[torch.Tensor, torch.Tensor]: ...

        def _features(self, b: torch.Tensor, hypothesis: Any = None) -> torch.Tensor: ...

        def _as_model(
            self,
            mu: torch.Tensor,
            cov: torch.Tensor,
            features: Callable[[torch.Tensor], torch.Tensor],
            rows: np.ndarray | None = None,
        ) -> SplineAffineModel: ...

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

    def _tiled(self, hypothesis: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Features under one ``(tile, wave)`` hypothesis for every rank."""

        def features(b: torch.Tensor) -> torch.Tensor:
            return self._features(b, hypothesis)

        return features

    def _features_at(self, b: torch.Tensor) -> torch.Tensor:
        """Features with each rank's most probable tile (``(G,)`` sizes expand to ``(N, G)``)."""
        tile = self.tile
        if bool((tile == 1).all()):
            return self._features(b, (1, 1))
        if b.dim() == 1:
            b = b.expand(self.world_size, -1)
        return self._features(b, tile)

    def mixture(self) -> list[tuple[SplineAffineModel, np.ndarray]]:
        """The tile hypotheses in use, each as a BoTorch model with every rank's weight on it.

        Returns:
            ``[(model, weights), ...]``: one per ``(tile, wave)`` hypothesis in some rank's
            mixture (at most :data:`~lightning_rex.core.model.tiles.MAX_MIXTURE` per rank,
            each of at least :data:`~lightning_rex.core.model.tiles.MIN_WEIGHT`);
            ``weights`` has shape ``(N,)``, and a rank's weights sum to 1.
        """
        self._posterior()
        used = sorted(self._tile_posts)
        weights = self.tile_weights[:, [HYPOTHESES.index(t) for t in used]]
        weights = weights / weights.sum(axis=1, keepdims=True)
        return [
            (self._as_model(*self._tile_posts[t], self._tiled(t)), weights[:, i])
            for i, t in enumerate(used)
        ]

    def predict_grid(
        self, sizes: np.ndarray, kappa: float = 0.0, var_points: int = 96
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and optimistic quantile of every rank's time on a size grid.

        Both are read from the tiles' BoTorch posteriors and mixed with each rank's tile
        weights (:mod:`~lightning_rex.core.model.tiles`); the quantile is BoTorch's
        (:func:`~lightning_rex.core.model.posterior.optimistic_quantile`), mixed the same way.

        Args:
            sizes: The grid, shape ``(G,)``, shared by all ranks.
            kappa: Standard deviations of the quantile below the mean (0: the mean).
            var_points: The quantile's distance from the mean is computed on at most this
                many grid points and interpolated linearly between them.

        Returns:
            ``(mean, quantile)``, both shape ``(N, G)`` in seconds.
        """
        from lightning_rex.core.model.posterior import grid_quantile

        grid = np.asarray(sizes, dtype=np.float64)
        mean = np.zeros((self.world_size, grid.size))
        quantile = np.zeros_like(mean) if kappa > 0 else mean  # kappa 0: the mean itself
        for model, weights, rows in self._mixture_rows():
            hyp_mean, hyp_quantile = grid_quantile(model, grid, kappa, var_points)
            every = bool(rows.all())  # no row selection to copy through
            for out, values in (
                ((mean, hyp_mean), (quantile, hyp_quantile)) if kappa > 0 else ((mean, hyp_mean),)
            ):
                if every:
                    out += weights[:, None] * values
                else:
                    out[rows] += weights[:, None] * values
        return mean, (quantile if kappa > 0 else mean.copy())

    def predict(self, plan: tuple[int, ...]) -> np.ndarray:
        """Posterior mean time of every rank at its size in ``plan``, seconds, shape (N,)."""
        import torch

        plan_sizes = np.asarray(plan, dtype=np.float64)
        out = np.zeros(self.world_size)
        for model, weights, rows in self._mixture_rows():
            points = torch.as_tensor(plan_sizes[rows]).reshape(-1, 1, 1)
            out[rows] += weights * model.mean(points).reshape(-1).numpy()
        return out

    def _mixture_rows(self) -> list[tuple[SplineAffineModel, np.ndarray, np.ndarray]]:
        """:meth:`mixture`, each hypothesis's model built for the ranks that weigh it only.

        Returns:
            ``[(model, weights, rows), ...]``: ``rows`` a boolean mask over ranks, the
            model and ``weights`` (shape ``(rows.sum(),)``) for those ranks.
        """
        import torch

        post = self._posterior()
        cached = self._rows_cache
        if cached is not None and cached[0] is post:  # the models of this posterior, built
            return list(cached[1])
        out = []
        for hypothesis in sorted(self._tile_posts):
            weights = self.tile_weights[:, HYPOTHESES.index(hypothesis)]
            rows = weights > 0
            mean, cov = (x[torch.as_tensor(rows)] for x in self._tile_posts[hypothesis])
            out.append(
                (self._as_model(mean, cov, self._tiled(hypothesis), rows), weights[rows], rows)
            )
        # every change to the data, the groups or the hyperparameters makes a new posterior
        self._rows_cache = (post, out)
        return list(out)
