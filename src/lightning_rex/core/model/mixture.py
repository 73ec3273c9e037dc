"""The time model's tile mixture: predictions averaged over the tile hypotheses.

A :class:`TileMixture` is built from one posterior of
:class:`~lightning_rex.core.model.time_model.RankTimeModel`: every ``(tile, wave)``
hypothesis in use with its weight posterior, and each rank's posterior probability of every
hypothesis (:mod:`~lightning_rex.core.model.tiles`). It gives the hypotheses as BoTorch
models (:meth:`TileMixture.models`) and the predictions that mix them with each rank's
weights (:meth:`TileMixture.predict_grid`, :meth:`TileMixture.predict`): Bayesian model
averaging over the hypotheses. A new posterior (new data, groups or hyperparameters) makes a
new mixture, so the models it builds are kept for as long as it lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from lightning_rex.core.model.tiles import HYPOTHESES

if TYPE_CHECKING:  # torch and BoTorch load when a model is built, not on import
    import torch

    from lightning_rex.core.model.posterior import SplineAffineModel

__all__ = ["ModelBuilder", "TileMixture"]

ModelBuilder = Callable[
    ["torch.Tensor", "torch.Tensor", tuple[int, int], "np.ndarray | None"], "SplineAffineModel"
]
"""``(mean, cov, hypothesis, rows) -> model``: a hypothesis's weight posterior as a BoTorch
model, of the ranks ``rows`` selects (all with None)."""


class TileMixture:
    """The tile hypotheses of one posterior, as models, and their mixed predictions.

    Args:
        world_size: The number of ranks ``N``.
        weights: Each rank's posterior probability of every hypothesis, ``(N, H)``, in the
            order of :data:`~lightning_rex.core.model.tiles.HYPOTHESES`.
        posteriors: Every hypothesis in use to its weight posterior ``(mean, cov)``.
        build: Turns a weight posterior into a BoTorch model (:data:`ModelBuilder`).
    """

    def __init__(
        self,
        world_size: int,
        weights: np.ndarray,
        posteriors: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]],
        build: ModelBuilder,
    ) -> None:
        self.world_size = int(world_size)
        self.weights = weights
        self.posteriors = posteriors
        self._build = build
        self._rows: list[tuple[SplineAffineModel, np.ndarray, np.ndarray]] | None = None

    def models(self) -> list[tuple[SplineAffineModel, np.ndarray]]:
        """The tile hypotheses in use, each as a BoTorch model with every rank's weight on it.

        Returns:
            ``[(model, weights), ...]``: one per ``(tile, wave)`` hypothesis in some rank's
            mixture (at most :data:`~lightning_rex.core.model.tiles.MAX_MIXTURE` per rank,
            each of at least :data:`~lightning_rex.core.model.tiles.MIN_WEIGHT`);
            ``weights`` has shape ``(N,)``, and a rank's weights sum to 1.
        """
        used = sorted(self.posteriors)
        weights = self.weights[:, [HYPOTHESES.index(hyp) for hyp in used]]
        weights = weights / weights.sum(axis=1, keepdims=True)
        return [
            (self._build(*self.posteriors[hyp], hyp, None), weights[:, index])
            for index, hyp in enumerate(used)
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
        """Posterior mean time of every rank at its size in ``plan``.

        Args:
            plan: Per-rank sizes.

        Returns:
            Seconds, shape ``(N,)``.
        """
        import torch

        plan_sizes = np.asarray(plan, dtype=np.float64)
        out = np.zeros(self.world_size)
        for model, weights, rows in self._mixture_rows():
            points = torch.as_tensor(plan_sizes[rows]).reshape(-1, 1, 1)
            out[rows] += weights * model.mean(points).reshape(-1).numpy()
        return out

    def _mixture_rows(self) -> list[tuple[SplineAffineModel, np.ndarray, np.ndarray]]:
        """:meth:`models`, each hypothesis's model built for the ranks that weigh it only.

        Returns:
            ``[(model, weights, rows), ...]``: ``rows`` a boolean mask over ranks, the
            model and ``weights`` (shape ``(rows.sum(),)``) for those ranks.
        """
        import torch

        if self._rows is None:  # built once for this posterior
            self._rows = []
            for hypothesis in sorted(self.posteriors):
                weights = self.weights[:, HYPOTHESES.index(hypothesis)]
                rows = weights > 0
                mean, cov = (x[torch.as_tensor(rows)] for x in self.posteriors[hypothesis])
                model = self._build(mean, cov, hypothesis, rows)
                self._rows.append((model, weights[rows], rows))
        return list(self._rows)
