"""What REX reads of Lightning's fit loop: steps, step boundaries, a pending loader position.

REX counts *steps*: optimizer-step boundaries, one per ``accumulate_grad_batches`` batches.
Under automatic optimization that is ``trainer.global_step``; under manual optimization
``global_step`` counts every ``optimizer.step()`` (two per batch in a GAN), so REX uses the
fit loop's own count of batches that stepped, which Lightning keeps for its loggers and
saves in checkpoints. These helpers are the only place that reads Lightning's private loop
attributes (and :func:`set_epoch_length` the only one that writes them); the package pins
Lightning to a range in which they exist.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.loops.progress import _ProcessedTracker

__all__ = [
    "batches_in_flight",
    "count_stopped_epoch_as_unfinished",
    "fraction_done",
    "is_logging_step",
    "is_step_end",
    "loader_state_to_restore",
    "restored_epoch_ended",
    "resume_after_epoch_end",
    "set_epoch_length",
    "steps_done",
]


def steps_done(trainer: pl.Trainer) -> int:
    """Step boundaries completed so far: during a batch, the index of its step.

    Args:
        trainer: The Trainer.

    Returns:
        The fit loop's count of batches that stepped.
    """
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def fraction_done(trainer: pl.Trainer) -> float | None:
    """How much of the fit is done, for pricing a global batch trial (read at a step's end).

    The largest share of the bounds that end the fit: the steps' share of ``max_steps``, the
    epochs' share of ``max_epochs`` (an epoch's share counts its batches done of the epoch's
    batches now; global batch scaling changes them, :func:`set_epoch_length`), and the
    training time's share of a :class:`~lightning.pytorch.callbacks.Timer`'s duration
    (``Trainer(max_time=...)`` adds one; a resumed fit's Timer counts the time before the
    checkpoint too). Whichever bound ends the fit first is the furthest along.

    Args:
        trainer: The Trainer.

    Returns:
        A fraction in ``[0, 1]``, or None when no bound is set.
    """
    shares = []
    if trainer.max_steps is not None and trainer.max_steps > 0:
        shares.append(trainer.global_step / trainer.max_steps)
    loop = trainer.fit_loop
    epochs, batches = loop.max_epochs, loop.max_batches
    if epochs is not None and epochs > 0 and 0 < batches < math.inf:
        within = min(1.0, (loop.epoch_loop.batch_idx + 1) / batches)
        shares.append((trainer.current_epoch + within) / epochs)
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, Timer):
            remaining = callback.time_remaining()
            if remaining is not None:  # (a Timer without a duration bounds nothing)
                elapsed = callback.time_elapsed()
                total = elapsed + max(0.0, remaining)
                shares.append(elapsed / total if total > 0 else 1.0)
    return min(1.0, max(shares)) if shares else None


def is_step_end(trainer: pl.Trainer) -> bool:
    """Whether the batch being trained ends a step (read in ``on_train_batch_end``).

    Args:
        trainer: The Trainer.

    Returns:
        True unless the batch only accumulates gradients.
    """
    return not trainer.fit_loop._should_accumulate()


def batches_in_flight(trainer: pl.Trainer) -> int:
    """Train batches fetched whose step is not yet done, as Lightning resumes them (0 or 1).

    A checkpoint taken inside a step (``trainer.save_checkpoint`` from ``on_train_batch_start``,
    ``on_before_backward`` or ``on_before_optimizer_step``, or a signal handler's) is resumed
    by Lightning at its count of *processed* batches: the batch in flight is trained again.
    One saved from ``on_train_batch_end`` counts its batch as done (it was processed).

    Args:
        trainer: The Trainer.

    Returns:
        Lightning's ready count less its processed count, in the current epoch.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    if not isinstance(progress, _ProcessedTracker):  # a batch progress always is one
        return 0
    return max(0, int(progress.ready) - int(progress.processed))


def is_logging_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning sends this step's metrics to the loggers (``log_every_n_steps``).

    Read in ``on_train_batch_end``: what is logged there reaches the loggers with the step's
    own metrics, in one record.

    Args:
        trainer: The Trainer.

    Returns:
        Lightning's own answer (its logger connector's ``should_update_logs``).
    """
    return bool(trainer._logger_connector.should_update_logs)


def loader_state_to_restore(trainer: pl.Trainer) -> tuple[dict[str, Any], bool] | None:
    """The train loader's state a resuming fit is to restore, if any, taken from Lightning.

    Lightning restores a stateful train loader only after it has read ``len(loader)`` to
    size the epoch; the strategy restores it earlier, from here, so that the length is right.
    After a checkpoint taken once an epoch was over (``ModelCheckpoint``'s default, at the
    epoch's end) Lightning does not restore the loader at all: it starts the next epoch
    afresh. The plan schedule lives in that state, so the strategy restores it then too, as
    an epoch that is over. The state is taken from Lightning's list either way: Lightning
    does not load it a second time (over what the strategy made of it), and a loader rebuilt
    later in the fit does not restore it again.

    Args:
        trainer: The Trainer.

    Returns:
        The saved state of the (single) stateful train loader and whether its epoch is over
        by Lightning's count (it will not iterate the rest), or None.
    """
    loop = trainer.fit_loop
    states = getattr(loop, "_combined_loader_states_to_load", None)
    if not states:
        return None
    state = states[0]
    if not (isinstance(state, dict) and "rex_sampler" in state):
        return None
    loop._combined_loader_states_to_load = []
    return state, not loop.restarting


def restored_epoch_ended(trainer: pl.Trainer) -> bool:
    """Whether the checkpoint being resumed was taken after its epoch's last batch.

    Lightning's own saved judgement (its batch progress's ``is_last_batch``): under
    ``limit_train_batches`` an epoch ends before the loader's, and on another world size
    this run's count of the saved epoch is not the one that ended it.

    Args:
        trainer: The Trainer, with the checkpoint's loop state restored.

    Returns:
        True when the restored epoch's last batch was trained.
    """
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def count_stopped_epoch_as_unfinished(trainer: pl.Trainer) -> bool:
    """A ``max_steps`` stop's epoch-end checkpoint, resumed to more steps: a mid-epoch restart.

    When ``max_steps`` stops a run in the middle of an epoch, ``ModelCheckpoint``'s default
    still saves in ``on_train_epoch_end``, with the epoch counted as processed. Continued to
    more steps, Lightning goes on in that epoch but moves the sampler to the next epoch's
    permutation (the one it counts as processed), and with ``max_epochs`` set it may not go
    on at all. The epoch is unfinished: counted so here, at the restore, before Lightning
    judges the loop's stage (a restart in the middle of the epoch) and whether it is done.

    Args:
        trainer: The Trainer, with the checkpoint's loop state restored.

    Returns:
        Whether the count was changed (then :func:`resume_after_epoch_end` finishes it).
    """
    loop = trainer.fit_loop
    total: Any = loop.epoch_progress.total  # a _ProcessedTracker
    on_epoch_end = (
        total.started == total.ready
        and total.processed == total.started
        and total.completed == total.processed - 1
    )
    if not (
        loop.restarting
        and loop._iteration_based_training()
        and on_epoch_end
        and not restored_epoch_ended(trainer)
    ):
        return False
    for tracker in (loop.epoch_progress.total, loop.epoch_progress.current):
        tracker.processed -= 1  # type: ignore[attr-defined]  # a _ProcessedTracker
    return True


def resume_after_epoch_end(trainer: pl.Trainer, stopped_mid_epoch: bool = False) -> bool:
    """Resume a ``max_steps`` run after an epoch-end checkpoint as Lightning does others.

    A checkpoint saved in ``on_train_epoch_end`` (``ModelCheckpoint``'s default) after the
    epoch's last batch records an epoch that is over. Resuming a run bounded by epochs,
    Lightning starts the next epoch afresh. Bounded by ``max_steps`` it counts itself as
    restarting, and then trains one more batch in the finished epoch (numbered past its
    end, from the next epoch's data) and counts that epoch as the next one's: plain DDP
    skips the rest of that epoch's data, and an uneven split has no such batch. This puts
    the loop where an epoch-bounded run is: the epoch over, not restarting.

    After :func:`count_stopped_epoch_as_unfinished` (``stopped_mid_epoch``), Lightning
    resumes the epoch as after a checkpoint saved at a validation's end, before the step
    was counted: if the checkpoint's last batch validated, it counts that step again. The
    count is put back here. Called at ``on_train_start``, after Lightning's reset.

    Args:
        trainer: The Trainer.
        stopped_mid_epoch: Whether the restore counted a ``max_steps`` stop's epoch as
            unfinished.

    Returns:
        Whether the loop was changed.
    """
    from lightning.pytorch.loops.fit_loop import RestartStage

    loop = trainer.fit_loop
    epoch_loop = loop.epoch_loop
    if stopped_mid_epoch:
        fetcher = loop._data_fetcher
        if (
            epoch_loop.restarted_on_last
            and fetcher is not None
            and not epoch_loop._should_accumulate()
            and epoch_loop._should_check_val_fx(fetcher)
        ):
            epoch_loop._batches_that_stepped -= 1
            return True
        return False
    if not (
        loop.restarted_on_epoch_end
        and loop._iteration_based_training()
        and restored_epoch_ended(trainer)
    ):
        return False
    loop.epoch_progress.increment_completed()  # what Lightning does for an epoch-bounded run
    loop._restart_stage = RestartStage.RESUMED_ON_EPOCH_END
    epoch_loop.reset_restart_stage()
    _Loop.restarting.fset(loop, False)  # type: ignore[attr-defined]  # and the loops in it
    return True


def set_epoch_length(trainer: pl.Trainer, n: int) -> None:
    """Tell Lightning the train epoch now has ``n`` batches.

    Lightning counts them once, at the start of the fit, in four places: the fit loop's
    ``max_batches``, the combined loader's limits, the data fetcher's length (it ends the
    epoch there) and, for a fractional ``val_check_interval``, ``val_check_batch`` (it
    validates there). Without ``limit_train_batches=1.0`` the user's limit stands and
    nothing is changed; a batch count or time interval for validation stands too.

    Args:
        trainer: The Trainer.
        n: The epoch's batches now.
    """
    limit = trainer.limit_train_batches
    if not (isinstance(limit, float) and limit == 1.0):  # the int 1 is "one batch"
        return
    loop = trainer.fit_loop
    loop.max_batches = n
    combined = loop._combined_loader
    if combined is not None and combined.limits is not None:
        combined.limits = [n] * len(combined.flattened)
    fetcher = loop._data_fetcher
    if fetcher is not None and fetcher.length is not None:
        fetcher.length = n
        fetcher.done = fetcher.fetched >= n
    vcb = trainer.val_check_batch
    if (
        getattr(trainer, "_val_check_time_interval", None) is None
        and isinstance(trainer.val_check_interval, float)
        and vcb is not None
        and vcb != float("inf")
    ):
        trainer.val_check_batch = max(1, int(n * trainer.val_check_interval))
