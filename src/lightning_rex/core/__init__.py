"""The framework-free REX core: plans, step-time windows, significance, models, planner.

Nothing under this package imports Lightning or ``torch.distributed``; the simulator and
the Lightning callback both drive it through the same :class:`Controller` interface.
"""

from lightning_rex.core.plan import (
    Plan,
    even_plan,
    round_fractions,
    split_in_proportion,
    validate_plan,
)

__all__ = ["Plan", "even_plan", "round_fractions", "split_in_proportion", "validate_plan"]
