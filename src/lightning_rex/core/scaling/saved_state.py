"""A scaling decider's saved state, checked field by field before anything is loaded.

:func:`check_scaling_state` checks what
:class:`~lightning_rex.core.scaling.scaling_decider.ScalingDecider` saves (the controller's
state, the scaler's, the change under validation and its trial) against the run's first
global batch, its world size and its scaling range.
"""

from __future__ import annotations

from typing import Any

from lightning_rex.core.decide.saved_state import check_controller_state
from lightning_rex.core.saved import StateError, field, flag, float_list, int_list, real, whole
from lightning_rex.core.scaling.batch_scaling import BatchScaler
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.scaling.step_times import StepTimes

__all__ = ["check_scaling_state"]


def check_scaling_state(
    d: Any,
    global_batch: int,
    world_size: int,
    config: GlobalBatchScaling | None = None,
) -> dict[str, Any]:
    """Check a saved scaling decider's state without loading it (every rank, before a resume).

    Args:
        d: A dict from ``ScalingDecider.state_dict``.
        global_batch: The run's (first) global batch.
        world_size: The number of ranks.
        config: The run's scaling settings: the controller's batch, the change under
            validation and the scaler's observations must lie in its range, and the
            scaler's state must be its (None: only the shapes are checked).

    Returns:
        The state, normalised.

    Raises:
        StateError: Naming the field that is missing or malformed.
    """
    low, high = (
        (config.min_global_batch, config.max_global_batch)
        if config is not None
        else (world_size, None)
    )
    if not isinstance(d, dict):
        raise StateError("decider", f"must be a mapping, got {type(d).__name__}")
    ctl = check_controller_state(field(d, "controller", "decider"), global_batch, world_size)
    batch = sum(ctl["plan"])
    if batch < low or (high is not None and batch > high):
        raise StateError(
            "decider.controller.global_batch",
            f"is {batch}, outside the global batch range [{low}, {high}]",
        )
    scaler = field(d, "scaler", "decider")
    if config is not None:
        scaler = BatchScaler.check_state(scaler, config, global_batch, "decider.scaler")
    change = field(d, "change", "decider")
    if change is not None:
        old = whole(field(change, "batch", "decider.change"), "decider.change.batch", low, high)
        plan = int_list(
            field(change, "plan", "decider.change"), "decider.change.plan", world_size, 1
        )
        if sum(plan) != old:
            raise StateError("decider.change.plan", f"must sum to the batch {old}, got {sum(plan)}")
        base = float_list(
            field(change, "baseline", "decider.change"), "decider.change.baseline", None, True
        )
        # (absent from states saved before the trial re-split)
        resplit = flag(change.get("resplit", False), "decider.change.resplit")
        change = {"batch": old, "plan": tuple(plan), "baseline": base, "resplit": resplit}
    return {
        "controller": ctl,
        "scaler": scaler,
        "change": change,
        "trial": float_list(field(d, "trial", "decider"), "decider.trial", None, True),
        "recent": float_list(field(d, "recent", "decider"), "decider.recent", None, True),
        "elapsed_s": _elapsed(d),
        # (absent from states saved before the step times were: they start afresh)
        "steps": StepTimes.check_state(
            d.get("steps", {"overheads": [], "wait": []}), world_size, "decider.steps"
        ),
    }


def _elapsed(d: dict[str, Any]) -> float:
    """``elapsed_s``, seconds >= 0 (0 in states saved before trials were priced)."""
    elapsed = real(d.get("elapsed_s", 0.0), "decider.elapsed_s")
    if elapsed < 0:
        raise StateError("decider.elapsed_s", f"must be seconds >= 0, got {elapsed}")
    return elapsed
