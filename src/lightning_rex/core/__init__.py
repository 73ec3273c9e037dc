"""The framework-free REX core: plans, step-time windows, significance, models, planner.

Nothing under this package imports Lightning or ``torch.distributed``, and importing it
loads neither (nor torch: the time model's BoTorch and GPyTorch parts are imported when a
model is first built); the simulator and the Lightning callback both drive it through the
same :class:`Controller` interface.
"""

from typing import TYPE_CHECKING

from lightning_rex.core.lazy import lazy_attributes

if TYPE_CHECKING:
    from lightning_rex.core.decide.controller import Controller
    from lightning_rex.core.decision import Decision
    from lightning_rex.core.model.kernels import SplineKernel, bspline_basis
    from lightning_rex.core.model.time_model import RankTimeModel
    from lightning_rex.core.plans.minimax import (
        affine_plan,
        exploration_kappa,
        resolve_bounds,
        water_fill,
    )
    from lightning_rex.core.plans.plan import (
        Plan,
        even_plan,
        round_fractions,
        split_in_proportion,
        validate_plan,
    )
    from lightning_rex.core.stats.significance import (
        ImbalanceResult,
        WindowHistory,
        holm,
        imbalance_test,
        variance_inflation,
    )
    from lightning_rex.core.window import Window
    from lightning_rex.core.window_spec import WindowSpec

_LAZY = {
    "Controller": "lightning_rex.core.decide.controller",
    "Decision": "lightning_rex.core.decision",
    "ImbalanceResult": "lightning_rex.core.stats.significance",
    "Plan": "lightning_rex.core.plans.plan",
    "RankTimeModel": "lightning_rex.core.model.time_model",
    "SplineKernel": "lightning_rex.core.model.kernels",
    "Window": "lightning_rex.core.window",
    "WindowHistory": "lightning_rex.core.stats.significance",
    "WindowSpec": "lightning_rex.core.window_spec",
    "affine_plan": "lightning_rex.core.plans.minimax",
    "bspline_basis": "lightning_rex.core.model.kernels",
    "even_plan": "lightning_rex.core.plans.plan",
    "exploration_kappa": "lightning_rex.core.plans.minimax",
    "holm": "lightning_rex.core.stats.significance",
    "imbalance_test": "lightning_rex.core.stats.significance",
    "resolve_bounds": "lightning_rex.core.plans.minimax",
    "round_fractions": "lightning_rex.core.plans.plan",
    "split_in_proportion": "lightning_rex.core.plans.plan",
    "validate_plan": "lightning_rex.core.plans.plan",
    "variance_inflation": "lightning_rex.core.stats.significance",
    "water_fill": "lightning_rex.core.plans.minimax",
}


# importing the package (or any module in it) stays light: SciPy, BoTorch and torch load
# with the modules that need them, on first use of a name
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = [
    "Controller",
    "Decision",
    "ImbalanceResult",
    "Plan",
    "RankTimeModel",
    "SplineKernel",
    "Window",
    "WindowHistory",
    "WindowSpec",
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
