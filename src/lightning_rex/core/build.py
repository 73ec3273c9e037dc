"""The one place that turns settings into a decider: training and the simulator both call it.

:func:`build_decider` builds the :class:`~lightning_rex.core.decide.controller.Controller` from
:class:`~lightning_rex.core.settings.DecisionSettings`, the plan in force, the run's base
global batch, the size bounds and the ranks' device identities, and wraps it in a
:class:`~lightning_rex.core.scaling.scaling_decider.ScalingDecider` when global batch scaling is on.
:func:`check_decider_state` checks a checkpoint's decider state for the decider these
settings build. :class:`~lightning_rex.RexCallback` and the simulator's rex policy call
these and nothing else, so a simulated rex is the rex that trains.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.scaling.batch_scaling import BatchScaler
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.settings import DecisionSettings

__all__ = ["build_decider", "check_decider_state"]


def build_decider(
    settings: DecisionSettings,
    plan: Sequence[int],
    base_batch: int,
    bounds: SizeBounds,
    devices: Sequence[str | None] | None = None,
) -> Controller | ScalingDecider:
    """The decider for a run.

    Args:
        settings: The decision parameters (global batch scaling among them).
        plan: The plan in force; it may sum to another batch than ``base_batch`` when a run
            resumes at a batch the scaler moved to.
        base_batch: The run's first global batch ``B0``.
        bounds: The size bounds (per-rank caps included).
        devices: Each rank's device identity, or None; ranks of one identity share evidence
            in the time model when ``settings.pool_by_device``.

    Returns:
        The controller, or the controller and the global batch scaler behind one decider.
    """
    start_plan: Plan = tuple(int(b) for b in plan)
    n_ranks, cfg = len(start_plan), settings.global_batch
    labelled = (
        devices is not None and len(devices) == n_ranks and any(d is not None for d in devices)
    )
    groups = list(devices) if devices is not None and labelled and settings.pool_by_device else None
    controller = Controller(
        base_batch,
        n_ranks,
        settings=settings,
        min_size=bounds.min_size,
        max_sizes=bounds.caps(n_ranks),
        initial_plan=start_plan if sum(start_plan) == base_batch else None,
        groups=groups,
        max_global_batch=None if cfg is None else cfg.max_global_batch,
        window=settings.window,  # the loop's own window (RexCallback builds both from one)
    )
    if sum(start_plan) != base_batch:  # resuming at a batch the scaler moved to
        controller.set_global_batch(sum(start_plan), start_plan)
    if cfg is None:
        return controller
    return ScalingDecider(controller, BatchScaler(cfg, base_batch, n_ranks), settings.window.steps)


def check_decider_state(
    settings: DecisionSettings, d: Any, base_batch: int, world_size: int
) -> Any | None:
    """Check a saved decider's state for the decider ``settings`` build.

    Args:
        settings: The decision parameters of the run that resumes.
        d: The saved state.
        base_batch: The run's first global batch.
        world_size: The number of ranks.

    Returns:
        ``d`` when it is the state of the decider these settings build; None (with a
        warning) when it is another kind's, global batch scaling being on in one run and
        off in the other: the decider then starts afresh.

    Raises:
        StateError: Naming the field, when the state is malformed.
    """
    scaling = isinstance(d, dict) and "scaler" in d
    if scaling != (settings.global_batch is not None):
        warnings.warn(
            f"lightning-rex: global batch scaling is {'off' if scaling else 'on'} in this run"
            f" and was {'on' if scaling else 'off'} in the checkpoint's: the controller starts"
            " afresh",
            UserWarning,
            stacklevel=2,
        )
        return None
    if scaling:
        ScalingDecider.check_state(d, base_batch, world_size, settings.global_batch)
    else:
        Controller.check_state(d, base_batch, world_size)
    return d
