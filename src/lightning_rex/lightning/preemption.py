"""Preemption: SIGTERM and SLURM's requeue signal end every rank at one checkpointed step.

Lightning's own handlers run collectives inside the handler (a broadcast of the SIGTERM
flag, a whole checkpoint under SLURM's requeue signal), which deadlocks when the signal
reaches one rank, or reaches the ranks at different points of a step. During a fit, rex
replaces them with handlers that only record the request
(:class:`~lightning_rex.driver.stopping.StopRequests`). The window loop's next exchange
carries it to every rank; at the next batch's start (after every hook of the exchange's step
has run, so the checkpoint holds them all) every rank:

1. saves a checkpoint at one path, Lightning's HPC checkpoint in the Trainer's
   ``default_root_dir`` (``hpc_ckpt_<n>.ckpt``, ``n`` one more than the highest there): a
   run on SLURM resumes from it by itself; elsewhere ``trainer.fit(..., ckpt_path="hpc")``
   does. The batch just fetched is recorded as not trained, so the resumed run trains it;
2. under SLURM's requeue signal, rank 0 asks SLURM to requeue the job
   (``scontrol requeue <job id>``, as Lightning does);
3. raises Lightning's :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException` (a
   ``SystemExit``, so the process exits with code 0): ``on_exception`` hooks run on every
   rank at the same point, ``OnExceptionCheckpoint`` included.

SIGTERM is forwarded once to the processes a Lightning launcher started, as Lightning's own
handler does. The handlers are Lightning's again when the fit ends.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_rex.driver.stopping import AgreedStop, StopKind

__all__ = ["SignalCatcher", "hpc_checkpoint_path", "preempt", "requeue_slurm_job"]

log = logging.getLogger("lightning.pytorch.lightning_rex")


def _slurm(trainer: pl.Trainer) -> SLURMEnvironment | None:
    strategy = trainer.strategy
    env = strategy.cluster_environment if isinstance(strategy, ParallelStrategy) else None
    return env if isinstance(env, SLURMEnvironment) and env.auto_requeue else None


class SignalCatcher:
    """SIGTERM and (under SLURM auto-requeue) the requeue signal, recorded, never acted on here.

    Args:
        trainer: The Trainer (its launcher, and its cluster environment).
        on_signal: Called in the handler with what was asked for
            (:attr:`~lightning_rex.driver.stopping.StopKind.STOP` for SIGTERM,
            :attr:`~lightning_rex.driver.stopping.StopKind.REQUEUE` for the requeue signal).
            It must only record it.
    """

    def __init__(self, trainer: pl.Trainer, on_signal: Callable[[StopKind], None]) -> None:
        self.trainer = trainer
        self.on_signal = on_signal
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}
        env = _slurm(trainer)
        self.signals = {int(signal.SIGTERM): StopKind.STOP}
        if env is not None and env.requeue_signal is not None:
            self.signals[int(env.requeue_signal)] = StopKind.REQUEUE

    def install(self) -> bool:
        """Put the handlers in place (main thread only; elsewhere nothing is installed).

        Returns:
            Whether they were installed.
        """
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return False
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def uninstall(self) -> None:
        """Put back the handlers that were there before (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        first = signum not in self.received
        self.received.append(signum)
        self.on_signal(self.signals.get(signum, StopKind.STOP))
        launcher = self.trainer.strategy.launcher
        if first and signum == signal.SIGTERM and launcher is not None:
            launcher.kill(signum)  # the ranks it started learn it too, as under Lightning


def hpc_checkpoint_path(folder: str | os.PathLike[str]) -> str:
    """Lightning's next HPC checkpoint path in ``folder``: ``hpc_ckpt_<highest + 1>.ckpt``.

    Args:
        folder: The Trainer's ``default_root_dir``.

    Returns:
        The path (a run on SLURM, or ``ckpt_path="hpc"``, resumes from the highest).
    """
    fs = get_filesystem(str(folder))
    names = (
        [os.path.basename(str(p)) for p in fs.ls(str(folder), detail=False)]
        if fs.isdir(str(folder))
        else []
    )
    numbers = [int(m.group(1)) for n in names if (m := re.fullmatch(r"hpc_ckpt_(\d+)\.ckpt", n))]
    name = f"hpc_ckpt_{max(numbers, default=0) + 1}.ckpt"
    return (
        os.path.join(str(folder), name)
        if fs.protocol in ("file", ("file", "local"))
        else f"{folder}/{name}"
    )


def requeue_slurm_job() -> int:
    """``scontrol requeue`` this SLURM job (an array task by its array job and task ids).

    Returns:
        ``scontrol``'s exit code (127 when it cannot be run).
    """
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else None
    job = job or os.environ.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"[0-9_]+", job):
        log.warning(f"lightning-rex: cannot requeue: SLURM_JOB_ID is {job!r}")
        return 127
    try:
        return subprocess.call(["scontrol", "requeue", job])
    except OSError as err:
        log.warning(f"lightning-rex: cannot run scontrol to requeue job {job}: {err}")
        return 127


def preempt(trainer: pl.Trainer, stop: AgreedStop) -> None:
    """Every rank, at the same step: checkpoint, requeue (SLURM), end the fit.

    Args:
        trainer: The Trainer.
        stop: The stop every rank agreed on.

    Raises:
        SIGTERMException: Always, on every rank, once the checkpoint is written.
    """
    strategy = trainer.strategy
    path = hpc_checkpoint_path(trainer.default_root_dir) if trainer.is_global_zero else ""
    path = strategy.broadcast(path, src=0)  # one path, whatever each rank's file system shows
    what = "SLURM's requeue signal" if stop.kind == StopKind.REQUEUE else "SIGTERM"
    if trainer.is_global_zero:
        log.info(
            f"lightning-rex: {what} on rank(s) {list(stop.ranks)}, agreed at step {stop.step}: "
            f"every rank saves {path} at step {trainer.global_step} and stops"
        )
    trainer.save_checkpoint(path)
    if stop.kind == StopKind.REQUEUE and trainer.is_global_zero and _slurm(trainer) is not None:
        code = requeue_slurm_job()
        if code == 0:
            log.info("lightning-rex: the SLURM job is requeued; it resumes from the checkpoint")
        else:
            log.warning(f"lightning-rex: scontrol requeue failed with code {code}")
    raise SIGTERMException
