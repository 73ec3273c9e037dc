"""What REX reads of Lightning's fit loop: steps, step boundaries, a pending loader position.

REX counts *steps*: optimizer-step boundaries, one per ``accumulate_grad_batches`` batches.
Under automatic optimization that is ``trainer.global_step``; under manual optimization
``global_step`` counts every ``optimizer.step()`` (two per batch in a GAN), so REX uses the
fit loop's own count of batches that stepped, which Lightning keeps for its loggers and
saves in checkpoints. These helpers are the only place that reads Lightning's private loop
attributes; the package pins Lightning to a range in which they exist.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

__all__ = ["is_step_end", "loader_state_to_restore", "steps_done"]


def steps_done(trainer: pl.Trainer) -> int:
    """Step boundaries completed so far: during a batch, the index of its step.

    Args:
        trainer: The Trainer.

    Returns:
        The fit loop's count of batches that stepped.
    """
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def is_step_end(trainer: pl.Trainer) -> bool:
    """Whether the batch being trained ends a step (read in ``on_train_batch_end``).

    Args:
        trainer: The Trainer.

    Returns:
        True unless the batch only accumulates gradients.
    """
    return not trainer.fit_loop._should_accumulate()


def loader_state_to_restore(trainer: pl.Trainer) -> dict[str, Any] | None:
    """The train loader's state a resuming fit is about to restore, if any.

    Lightning restores a stateful train loader only after it has read ``len(loader)`` to
    size the epoch; the strategy restores it earlier, from here, so that the length is right.

    Args:
        trainer: The Trainer.

    Returns:
        The saved state of the (single) stateful train loader, or None.
    """
    loop = trainer.fit_loop
    states = getattr(loop, "_combined_loader_states_to_load", None)
    if not loop.restarting or not states:
        return None
    state = states[0]
    return state if isinstance(state, dict) and "rex_sampler" in state else None
