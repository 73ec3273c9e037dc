"""What keeps one rank's fit from hanging: the hang watchdog and the preemption handlers.

A :class:`FitGuards` is part of a :class:`~lightning_rex.lightning.session.FitSession`. It
starts the :class:`~lightning_rex.lightning.watchdog.HangWatchdog` (on several ranks, with a
process group's store) and installs the :class:`~lightning_rex.lightning.preemption.SignalCatcher`
(main thread), advances the watchdog's progress where the session passes a point of a step
or one of rex's own collectives, and lets both go when the fit ends: at once, or, when it
ends on an exception, once every exception handler has run.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl

from lightning_rex.driver.errors import RexRankError
from lightning_rex.driver.stopping import StopRequests
from lightning_rex.lightning.preemption import SignalCatcher
from lightning_rex.lightning.watchdog import HangWatchdog, default_store

__all__ = ["FitGuards"]


class FitGuards:
    """One rank's hang watchdog and preemption handlers for one fit (module docstring).

    Args:
        hang_timeout: The watchdog's floor in seconds (None: no watchdog).
        hang_factor: The watchdog's multiple of the typical step (>= 1).
        preemption: Whether SIGTERM and SLURM's requeue signal are rex's during the fit.
    """

    def __init__(self, hang_timeout: float | None, hang_factor: float, preemption: bool) -> None:
        self.hang_timeout, self.hang_factor, self.preemption = hang_timeout, hang_factor, preemption
        self.watchdog: HangWatchdog | None = None
        self.signals: SignalCatcher | None = None
        self._stops: StopRequests | None = None
        self._backward = False

    def start(self, trainer: pl.Trainer, run_id: str, stops: StopRequests) -> None:
        """Every rank, once the window loop has started (its run id names the fit).

        Args:
            trainer: The Trainer.
            run_id: The window loop's run id (the watchdog's keys).
            stops: Where the handlers record a signal (the loop's next exchange carries it).
        """
        timeout = self.hang_timeout
        store = default_store() if trainer.world_size > 1 and timeout is not None else None
        if store is not None and timeout is not None:
            self.watchdog = HangWatchdog(
                store, trainer.global_rank, trainer.world_size, run_id, timeout, self.hang_factor
            )
            self.watchdog.start()
        if self.preemption:
            self._stops = stops
            self.signals = SignalCatcher(trainer, stops.request)
            self.signals.install()

    @property
    def error(self) -> RexRankError | None:
        """The watchdog's verdict, once it has found a silent rank."""
        return None if self.watchdog is None else self.watchdog.error

    def advance(self, step_end: bool = False) -> None:
        """This rank passed a point of a step, or of one of rex's collectives.

        Args:
            step_end: Whether the point ends a step (or a micro-batch).
        """
        if self.watchdog is not None:
            self.watchdog.advance(step_end)
        if step_end:
            self._backward = False

    def backward(self) -> None:
        """This rank reached a micro-batch's backward: one point, however many passes.

        A rank that splits its micro-batch into more accumulation passes than another calls
        ``backward`` more often; counting each would leave it ahead for good, and a long
        pause every rank shares would look like a hang of the others.
        """
        if not self._backward:
            self._backward = True
            self.advance()

    def release(self, watch_handlers: bool = False, on_error: bool = False) -> None:
        """Let go at the fit's end, or let the watchdog and handlers watch its exception's.

        Args:
            watch_handlers: The fit is ending on an exception under a rex strategy: the
                watchdog watches its handlers, and rex's signal handlers stay (Lightning's
                run collectives), until :meth:`stop_watching`.
            on_error: The fit is ending on an exception (whether or not it is watched).
        """
        if self.watchdog is not None and watch_handlers:
            self.watchdog.close()
        else:
            self.stop_watching(on_error)

    def stop_watching(self, on_error: bool = False) -> None:
        """Stop the watchdog and put the signal handlers back (no collective).

        Args:
            on_error: The fit ended on an exception (rank 0 tells the other ranks so).
        """
        if self.watchdog is not None:
            self.watchdog.stop(on_error)
            self.watchdog = None
        signals, self.signals = self.signals, None
        if signals is not None:
            signals.uninstall()
            stops = self._stops
            if signals.received and stops is not None and stops.agreed is None:
                warnings.warn(  # on the rank that got it
                    "lightning-rex: a preemption signal arrived after the fit's last exchange;"
                    " the fit ended first, so no preemption checkpoint was taken",
                    UserWarning,
                    stacklevel=2,
                )
