"""Run the decider on rank 0 without stalling training, and never lose its errors.

:class:`BackgroundObserver` hands windows to the decider in one background thread that only
computes (no collective ever leaves it). Windows are observed in order; their outcomes queue
up until the driver takes the ones that are ready at an exchange step. A decision still being
computed at its own exchange is not ready: that exchange says "none", and the training thread
does not wait for it (an occasional hyperparameter refit takes a few hundred milliseconds of
CPU). At the next poll, one decision lag later, the driver waits for it: a decision is never
later than that, however busy the host (the thread runs at the lowest priority, and where
other processes take every core it would otherwise fall behind for the rest of the run).

An outcome is a :class:`~lightning_rex.core.decide.controller.Decision` or the exception the decider
raised: an error in the thread is never raised there (nobody would see it) nor on rank 0
alone (its peers would hang); the driver sends it through the next exchange, and every rank
raises it.

On Linux the thread runs at the lowest CPU priority (per-thread nice 19): where the host CPU
also trains (CPU runs, the emulated demo), the controller then uses idle time, such as the
fast rank's wait at the all-reduce, instead of rank 0's compute. On GPU hosts it overlaps
device work.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_rex.core.decision import Decision
from lightning_rex.core.window import Window
from lightning_rex.driver.protocols import Decider

__all__ = ["BackgroundObserver", "Outcome", "Pending"]

Outcome = Decision | BaseException


def _lowest_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


@dataclass
class Pending:
    """A window handed to the decider and what came of it.

    Attributes:
        window: The window.
        info: Its extras for the record (throughput, telemetry, dropped samples).
        outcome: The decision or the exception, once known.
        due: The step of the window's own exchange: a poll after it waits for the outcome
            (the seconds waited go into ``info["exchange_wait_s"]``).
    """

    window: Window
    info: dict[str, Any]
    outcome: Outcome | None = None
    due: int = 0


class BackgroundObserver:
    """Observe windows with a decider, in a background thread or inline.

    Args:
        decider: The decider (rank 0's controller).
        min_size: The smallest micro-batch (the size bounds' minimum).
        background: Use a background thread; False observes inline, on submit, so that
            every decision is ready at the next exchange (deterministic timing).
        estimate: After each window, ask the decider for its even-split estimate
            (``info["even_step_s"]``, for the report's headline), in the same thread.
    """

    def __init__(
        self, decider: Decider, min_size: int = 1, background: bool = True, estimate: bool = False
    ) -> None:
        self.decider = decider
        self.min_size = int(min_size)
        self.estimate = bool(estimate)
        self._estimate_failed = False
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="rex", initializer=_lowest_priority
            )
            if background
            else None
        )
        self._queue: collections.deque[tuple[Pending, concurrent.futures.Future[None] | None]]
        self._queue = collections.deque()
        # a failed decline: it has no window of its own to carry its error
        self.error: BaseException | None = None
        self._capped = False  # the decider was given pass caps

    @property
    def pending(self) -> bool:
        """Whether some outcome has not been taken yet (ready or still computing)."""
        return bool(self._queue)

    def submit(
        self,
        window: Window,
        info: dict[str, Any],
        pass_caps: Sequence[int | None] | None = None,
        due: int = 0,
    ) -> None:
        """Queue ``window`` for the decider.

        Args:
            window: The window to observe.
            info: The window's extras, returned with its outcome.
            pass_caps: Per-rank pass caps the window ran under (the largest micro-batch a
                rank runs in one pass: its memory; soft, a larger size accumulates), None
                entries for none; they are set on the decider (``set_pass_caps``) in the
                same thread, just before it observes the window. None: no rank reported
                one (the decider is told so only if it had caps).
            due: The step of the window's own exchange; a later poll waits for its outcome
                (:meth:`take_ready`).
        """
        entry = Pending(window, info, due=int(due))
        caps = None if pass_caps is None else list(pass_caps)
        if self._pool is not None:
            self._queue.append((entry, self._pool.submit(self._observe, entry, caps)))
        else:
            self._observe(entry, caps)
            self._queue.append((entry, None))

    def _observe(self, entry: Pending, caps: list[int | None] | None) -> None:
        try:
            if caps is not None or self._capped:
                self.decider.set_pass_caps(caps)
                self._capped = caps is not None
            entry.outcome = self.decider.observe(entry.window)
        except BaseException as err:  # reported through the next exchange, on every rank
            entry.outcome = err
            return
        if self.estimate:
            try:
                entry.info["even_step_s"] = self.decider.even_split_estimate()
            except Exception as err:  # the report's baseline only: training goes on without it
                entry.info["even_step_s"] = None
                if not self._estimate_failed:
                    self._estimate_failed = True
                    warnings.warn(
                        f"lightning-rex: the even split's estimate failed ({err!r}); the report"
                        " will have no headline for this run",
                        RuntimeWarning,
                        stacklevel=2,
                    )

    def take_ready(self, step: int | None = None) -> list[Pending]:
        """Remove and return the entries whose outcome is known, oldest first.

        Stops at the first one still computing, so outcomes are always taken in order,
        unless its exchange is past: a poll at ``step > due`` waits for that outcome (and
        so for every one queued before it). Without ``step`` it never waits.

        Args:
            step: The step of the poll, or None.

        Returns:
            The entries.
        """
        out = []
        while self._queue:
            entry, future = self._queue[0]
            if future is not None and not future.done():
                if step is None or step <= entry.due:
                    break
                start = time.perf_counter()
                future.result()  # _observe keeps any error in the entry: this never raises
                entry.info["exchange_wait_s"] = time.perf_counter() - start
            self._queue.popleft()
            out.append(entry)
        return out

    def drain(self) -> list[Pending]:
        """Wait for all queued work, and return the queued entries, oldest first.

        For checkpoints: afterwards the background thread is idle, so the decider's state
        can be read (declines included), and the entries stay queued until taken. This
        waits as long as the work left, at most a hyperparameter fit or two.

        Returns:
            The entries, all with their outcome.
        """
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # a barrier: one thread, FIFO
        return [entry for entry, _ in self._queue]

    def restore(self, entries: Sequence[Pending]) -> None:
        """Queue entries saved in a checkpoint again, as ready.

        Args:
            entries: Entries from :meth:`drain`, with their outcomes.
        """
        self._queue = collections.deque((e, None) for e in entries)

    def take_decisions(self, apply_plans: bool, step: int | None = None) -> list[Pending]:
        """The decisions ready now (:meth:`take_ready`), or the decider's error, raised.

        Args:
            apply_plans: Whether plans are applied; in monitor-only use every proposal is
                declined here (it becomes a recommendation).
            step: The step of the poll: a decision whose exchange is past is waited for.

        Returns:
            The entries, each with its decision.

        Raises:
            BaseException: The decider's error, or a window's, as it was raised.
        """
        ready = self.take_ready(step)
        if self.error is not None:
            raise self.error
        for entry in ready:
            if not isinstance(entry.outcome, Decision):
                raise entry.outcome or RuntimeError("a window's decision was lost")
            if entry.outcome.kind == "propose" and not apply_plans:
                self.decline()
        return ready

    def decline(self) -> None:
        """Tell the decider its proposal was not applied, after the windows queued so far."""
        if self._pool is not None:
            self._pool.submit(self._decline)
        else:
            self._decline()

    def _decline(self) -> None:
        try:
            self.decider.decline()
        except Exception as err:  # the driver checks `error` at every exchange
            self.error = err

    def shutdown(self) -> None:
        """Stop the background thread after any running observation."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
