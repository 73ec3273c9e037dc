"""An epoch's batch grid: which samples of the permutation each global batch starts at.

With one global batch ``B`` the grid is regular: batch ``k`` starts at ``k B``. A run resumed
on another world size starts the rest of its epoch at the first sample not yet consumed, and
under global batch scaling a new ``B`` re-cuts the rest of the epoch the same way, so the grid
is piecewise: ``(first batch, its first sample, B)`` segments. These functions are pure: the
sampler computes its grid from its plan schedule, and so does the check of a saved position.
"""

from __future__ import annotations

from lightning_rex.core.plans.schedule import PlanSchedule

__all__ = ["Grid", "batch_grid", "grid_first_sample", "grid_length"]

Grid = list[tuple[int, int, int]]
"""An epoch's batch grid: ``(first batch, its first sample, global batch)`` segments."""


def batch_grid(
    plans: PlanSchedule,
    num_samples: int,
    origin: tuple[int, int],
    epoch_start_step: int,
    accumulate: int,
    world_size: int = 1,
    drop_last: bool = False,
    min_size: int = 1,
) -> Grid:
    """An epoch's batch grid: where each run of batches of one global batch starts.

    Args:
        plans: The plan schedule (its plans' sums are the global batches).
        num_samples: The epoch's samples.
        origin: ``(batch, sample)``: batch ``batch`` starts at sample ``sample`` (``(0, 0)``
            except in an epoch resumed on another world size).
        epoch_start_step: The step of the epoch's first batch.
        accumulate: Batches per step.
        world_size: The number of ranks (a final partial batch needs ``min_size`` samples
            for each).
        drop_last: Whether the final partial batch is dropped.
        min_size: The fewest samples a rank may get (``min_micro_batch_size``).

    Returns:
        Segments in batch order; a schedule entry that changes the global batch at a batch
        the epoch still reaches starts a new one at the first sample not yet taken.
    """
    origin_batch, origin_sample = origin
    grid: Grid = [
        (origin_batch, origin_sample, plans.batch_at(epoch_start_step + origin_batch // accumulate))
    ]
    for step, plan in plans.entries:
        change_batch = (step - epoch_start_step) * accumulate
        first_batch, first_sample, global_batch = grid[-1]
        new_global_batch = sum(plan)
        if change_batch <= first_batch or new_global_batch == global_batch:
            continue
        # a change at or past the epoch's last batch belongs to the next epoch (with
        # drop_last the samples left over are not "the rest of the epoch")
        if change_batch >= grid_length(
            [(first_batch, first_sample, global_batch)],
            num_samples,
            world_size,
            drop_last,
            min_size,
        ):
            break
        grid.append(
            (
                change_batch,
                first_sample + (change_batch - first_batch) * global_batch,
                new_global_batch,
            )
        )
    return grid


def grid_first_sample(grid: Grid, index: int) -> int:
    """The first sample of batch ``index`` on a grid.

    Args:
        grid: The epoch's grid.
        index: The batch index.

    Returns:
        The permutation position its global batch starts at.
    """
    for first_batch, first_sample, global_batch in reversed(grid):
        if index >= first_batch:
            return first_sample + (index - first_batch) * global_batch
    first_batch, first_sample, global_batch = grid[0]
    return first_sample + (index - first_batch) * global_batch


def grid_length(
    grid: Grid, num_samples: int, world_size: int, drop_last: bool, min_size: int = 1
) -> int:
    """Batches in an epoch on a grid.

    A final partial batch is kept only if it holds ``min_size`` samples for every rank.

    Args:
        grid: The epoch's grid.
        num_samples: The epoch's samples.
        world_size: The number of ranks.
        drop_last: Drop the final partial batch.
        min_size: The fewest samples a rank may get (``min_micro_batch_size``).

    Returns:
        The number of batches.
    """
    first_batch, first_sample, global_batch = grid[-1]
    full, rem = divmod(max(0, num_samples - first_sample), global_batch)
    return first_batch + full + (1 if (rem >= world_size * min_size and not drop_last) else 0)
