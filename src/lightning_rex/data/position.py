"""A checkpoint's loader position, checked against the run that resumes from it.

``UnevenBatchSampler.state_dict`` saves where the epoch stood: its epoch, the batches
consumed and the samples they took, the origin of its batch grid, its first step and the
plan schedule. :func:`check_position` checks every field against the resuming run (the
dataset, the saved run's own rules for its schedule, the grid the saved schedule cuts) and
says whether the run continues the saved schedule or re-cuts the rest of the epoch at its own
global batch (another world size, or a global batch this run does not serve).
"""

from __future__ import annotations

from typing import Any

from lightning_rex.core.plans.plan import even_plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.saved import StateError, field, int_list, whole
from lightning_rex.data.grid import batch_grid, grid_first_sample, grid_length

__all__ = ["check_position"]

_ANY_BATCH = 1 << 62
"""The largest global batch a saved position may be for (any a run could reach)."""
_MOST_RANKS = 1 << 20
"""The most ranks a saved schedule may be for."""


def _serves(batch_range: tuple[int, int] | None, run_batch: int, batch: int) -> bool:
    """Whether a run of global batch ``run_batch`` (and range) serves plans summing to ``batch``."""
    if batch_range is None:
        return batch == run_batch
    low, high = batch_range
    return low <= batch <= high


def check_position(
    state: Any,
    *,
    num_samples: int,
    world_size: int,
    global_batch: int,
    bounds: SizeBounds,
    batch_range: tuple[int, int] | None,
    accumulate: int,
    drop_last: bool,
    name: str = "rex_sampler",
) -> dict[str, Any]:
    """Check a saved position against the run that resumes and its own grid; apply nothing.

    Args:
        state: A dictionary from ``UnevenBatchSampler.state_dict``.
        num_samples: The resuming run's dataset length.
        world_size: Its number of ranks.
        global_batch: Its global batch ``B``.
        bounds: Its size bounds.
        batch_range: Its range of ``B`` under global batch scaling, or None.
        accumulate: Its batches per step.
        drop_last: Whether it drops an epoch's final partial batch.
        name: Its dotted name, for errors.

    Returns:
        The state, normalised, with ``continues`` (the saved schedule is this run's:
        the same ``N`` and base ``B``, and every plan sums to a global batch this run
        serves), ``reason`` (why not, in terms of this run), ``finished`` (the saved
        epoch was complete) and ``length`` (the saved epoch's batches).

    Raises:
        StateError: Naming the field: another dataset length, a schedule that is empty,
            out of step order or whose plans break ``B`` or the bounds, a consumed count
            outside the epoch or one that disagrees with the consumed samples.
    """
    if not isinstance(state, dict):
        raise StateError(name, f"must be a mapping, got {type(state).__name__}")
    samples = whole(field(state, "num_samples", name), f"{name}.num_samples", 0)
    if samples != num_samples:
        raise StateError(
            f"{name}.num_samples",
            f"is {samples}, but this run's dataset has {num_samples} samples: the "
            "checkpoint was made with another dataset",
        )
    world = whole(field(state, "world_size", name), f"{name}.world_size", 1, _MOST_RANKS)
    batch = whole(field(state, "global_batch", name), f"{name}.global_batch", world, _ANY_BATCH)
    # the saved schedule as it was, checked by the saved run's own rules: its plans sum
    # to its global batch, or (global batch scaling) to any in its range; it places this
    # epoch's batches
    ranged = state.get("batch_range")  # absent from checkpoints before it was kept
    if ranged is not None:
        low, high = int_list(ranged, f"{name}.batch_range", 2, world)
        if not low <= batch <= high:
            raise StateError(f"{name}.batch_range", f"must hold the global batch {batch}")
        ranged = (low, high)
    saved = PlanSchedule(even_plan(batch, world), batch, batch_range=ranged)
    entries = field(state, "schedule", name)
    saved.load_state_dict(entries, f"{name}.schedule")
    moved = sorted({sum(p) for _, p in saved.entries} - {batch})
    reason = ""
    if world != world_size or batch != global_batch:
        reason = (
            f"the checkpoint was made with {world} ranks and a global batch of {batch}, this "
            f"run has {world_size} and {global_batch}"
        )
    elif not all(_serves(batch_range, global_batch, b) for b in moved):
        serves = (
            f"global batches in {list(batch_range)}"
            if batch_range is not None
            else f"only its global batch {global_batch} (global batch scaling is off)"
        )
        reason = (
            f"the checkpoint's schedule moved the global batch to {moved}; this run serves {serves}"
        )
    schedule = saved
    if not reason:  # continued: every plan is checked against this run's bounds too
        schedule = PlanSchedule(even_plan(batch, world), batch, bounds, batch_range=batch_range)
        schedule.load_state_dict(entries, f"{name}.schedule")
    origin_batch, origin_sample = int_list(field(state, "origin", name), f"{name}.origin", 2, 0)
    if origin_sample > samples:
        raise StateError(
            f"{name}.origin", f"starts at sample {origin_sample}, past the epoch's {samples}"
        )
    start = whole(field(state, "epoch_start_step", name), f"{name}.epoch_start_step", 0)
    # the saved run's smallest micro-batch cut its final batch (1 before it was saved)
    least = whole(state.get("min_size", 1), f"{name}.min_size", 1, max(1, batch // world))
    grid = batch_grid(
        saved, samples, (origin_batch, origin_sample), start, accumulate, world, drop_last, least
    )
    length = grid_length(grid, samples, world, drop_last, least)
    consumed = whole(field(state, "consumed", name), f"{name}.consumed", origin_batch, length)
    done = whole(field(state, "consumed_samples", name), f"{name}.consumed_samples", 0, samples)
    expect = samples if consumed >= length else min(samples, grid_first_sample(grid, consumed))
    if done != expect:
        raise StateError(
            f"{name}.consumed_samples",
            f"is {done}, but {consumed} batches of this epoch's grid end at sample {expect}",
        )
    return {
        "epoch": whole(field(state, "epoch", name), f"{name}.epoch", 0),
        "consumed": consumed,
        "consumed_samples": done,
        "origin": (origin_batch, origin_sample),
        "epoch_start_step": start,
        "schedule": schedule,
        "continues": not reason,
        "reason": reason,
        "finished": consumed >= length,
        "length": length,
    }
