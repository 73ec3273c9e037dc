"""The per-rank time model: the affine prior, the spline kernel, its posterior and its fit.

Importing this package loads neither torch nor BoTorch: they are imported when a model is
first built.
"""

from lightning_rex.core.model.time_model import RankTimeModel

__all__ = ["RankTimeModel"]
