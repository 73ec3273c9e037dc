"""The framework-free REX core: plans, step-time windows, significance, models, planner.

Nothing under this package imports Lightning or ``torch.distributed``, and importing it
loads neither (nor torch: the time model's BoTorch and GPyTorch parts are imported when a
model is first built); the simulator and the Lightning callback both drive it through the
same :class:`Controller` interface.
"""

from typing import TYPE_CHECKING, Any

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.decision import Decision
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import (
    Plan,
    even_plan,
    round_fractions,
    split_in_proportion,
    validate_plan,
)
from lightning_rex.core.plans.planner import (
    affine_plan,
    exploration_kappa,
    resolve_bounds,
    water_fill,
)
from lightning_rex.core.stats.significance import (
    ImbalanceResult,
    WindowHistory,
    holm,
    imbalance_test,
    variance_inflation,
)
from lightning_rex.core.window import Window

if TYPE_CHECKING:
    from lightning_rex.core.model.kernels import SplineKernel, bspline_basis


def __getattr__(name: str) -> Any:
    """The spline kernel loads GPyTorch (and torch), so it is imported when first used."""
    if name in ("SplineKernel", "bspline_basis"):
        from lightning_rex.core.model import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Controller",
    "Decision",
    "ImbalanceResult",
    "Plan",
    "RankTimeModel",
    "SplineKernel",
    "Window",
    "WindowHistory",
    "affine_plan",
    "bspline_basis",
    "even_plan",
    "exploration_kappa",
    "holm",
    "imbalance_test",
    "resolve_bounds",
    "round_fractions",
    "split_in_proportion",
    "validate_plan",
    "variance_inflation",
    "water_fill",
]
