"""Every parameter of REX's decisions, with its default, in one frozen object.

:class:`DecisionSettings` is where the defaults live: the controller reads its parameters
from it, :class:`~lightning_rex.RexCallback` builds one from its arguments, and the
simulator's rex policy from its own; :func:`~lightning_rex.core.build.build_decider` turns
settings into the decider both run. A parameter's default is written here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_rex.core.checks import is_integer, is_number
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.window_spec import WindowSpec

__all__ = ["DecisionSettings"]


@dataclass(frozen=True)
class DecisionSettings:
    """The controller's parameters (and global batch scaling's, when it is on).

    Args:
        alpha: Family-wise significance level of the imbalance test, in (0, 1).
        min_effect: Practical effect threshold on the median ratio (>= 0; 5%).
        persistence: Consecutive imbalanced windows before a rescale (>= 1).
        consistency: Raw one-sided p-value each of the ``persistence`` windows must reach on
            its own for the flagged rank, in (0, 1).
        ending_alpha: Level of the veto that calls an imbalance transient when it ends (or
            starts) inside the latest window, in (0, 1).
        min_gain: Smallest predicted relative step-time gain worth a proposal (twice this
            after a rollback, until a plan is accepted), >= 0.
        margin: Non-inferiority margin of a new plan's validation (>= 0).
        validation_confidence: One-sided confidence of that bound, in (0, 1).
        tolerance: A new plan is also rolled back when its measured step time exceeds the
            prediction by more than this fraction (plus a noise allowance), >= 0.
        explore: Exploration width: the planner uses ``mean - explore / sqrt(n) * sd``.
        explore_slack: The exploring plan is used only while its posterior-mean step time
            is within this fraction of the best posterior-mean plan's.
        num_basis: Spline basis functions of the rank time model (>= 4).
        memory: Age in windows at which old observations' weight has dropped by ``e``.
        seed: Seed for everything random (hyperparameter-fit subsets).
        window: The window (:class:`~lightning_rex.core.window_spec.WindowSpec`: steps,
            looks, warm-up), the object the window loop runs by: the controller joins
            segments of ``window.segment`` steps into windows of ``window.whole``.
        pool_by_device: Ranks on devices of the same identity share evidence in the time
            model (groups of 4 or more).
        global_batch: Global batch scaling's settings, or None (off).
        shape_change_s: The seconds a step pays when a rank runs a micro-batch size it has
            not run recently (cuDNN autotuning, recompilation), if known (the simulator
            knows its scenario's); None: measured from the first step of every new plan.
        payback_windows: A change that brings new sizes must pay their cost back, twice,
            within this many windows of predicted gain (>= 1).
        shape_cache: The distinct sizes per rank taken as still cached (no new cost).

    Raises:
        ValueError: Naming the argument, for a value outside its range.
    """

    alpha: float = 0.01
    min_effect: float = 0.05
    persistence: int = 2
    consistency: float = 0.01
    ending_alpha: float = 0.05
    min_gain: float = 0.02
    margin: float = 0.02
    validation_confidence: float = 0.95
    tolerance: float = 0.10
    explore: float = 0.5
    explore_slack: float = 0.03
    num_basis: int = 16
    memory: float = 12.0
    seed: int = 0
    window: WindowSpec = field(default_factory=WindowSpec)
    pool_by_device: bool = True
    global_batch: GlobalBatchScaling | None = None
    shape_change_s: float | None = None
    payback_windows: int = 10
    shape_cache: int = 8

    def __post_init__(self) -> None:
        unit = ("alpha", "consistency", "ending_alpha", "validation_confidence")
        for name in unit:
            value = getattr(self, name)
            if not (is_number(value) and 0.0 < value < 1.0):
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        for name in ("min_effect", "min_gain", "margin", "tolerance", "explore", "explore_slack"):
            value = getattr(self, name)
            if not (is_number(value) and value >= 0.0):
                raise ValueError(f"{name} must be >= 0 (a finite number), got {value!r}")
        if not (is_number(self.memory) and self.memory > 0.0):
            raise ValueError(f"memory must be a finite number > 0, got {self.memory!r}")
        if not (is_integer(self.persistence) and self.persistence >= 1):
            raise ValueError(
                f"persistence must be an integer >= 1 window, got {self.persistence!r}"
            )
        if not (is_integer(self.num_basis) and self.num_basis >= 4):
            raise ValueError(f"num_basis must be an integer >= 4, got {self.num_basis!r}")
        if not is_integer(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.window, WindowSpec):
            raise ValueError(f"window must be a WindowSpec, got {type(self.window).__name__}")
        if self.shape_change_s is not None and not (
            is_number(self.shape_change_s) and self.shape_change_s >= 0
        ):
            raise ValueError(
                f"shape_change_s must be seconds >= 0 or None, got {self.shape_change_s!r}"
            )
        for name in ("payback_windows", "shape_cache"):
            value = getattr(self, name)
            if not (is_integer(value) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.pool_by_device, bool):
            raise ValueError(f"pool_by_device must be True or False, got {self.pool_by_device!r}")
        if self.global_batch is not None and not isinstance(self.global_batch, GlobalBatchScaling):
            raise ValueError(
                f"global_batch must be a GlobalBatchScaling or None, got {type(self.global_batch)}"
            )
