"""Run ``Controller.observe`` on rank 0 without stalling training.

:class:`BackgroundObserver` hands windows to the controller in one background thread that
only computes (no collective ever leaves it). Windows are observed in order; their decisions
queue up, as JSON-able data, until the callback takes the ones that are ready at an exchange
step. A decision still being computed is simply not ready: the exchange says "none" and the
training thread never waits for the controller (an occasional hyperparameter refit takes a
few hundred milliseconds of CPU).

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
from typing import Any

from lightning_rex.core.controller import Controller, Decision
from lightning_rex.core.window import Window

__all__ = ["BackgroundObserver"]


def _lowest_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _as_dict(pending: Any) -> dict[str, Any]:
    if isinstance(pending, concurrent.futures.Future):
        pending = pending.result()
    if isinstance(pending, Decision):
        pending = pending.to_dict()
    return dict(pending)


class BackgroundObserver:
    """Observe windows with a controller, in a background thread or inline.

    Args:
        controller: The controller (rank 0's).
        background: Use a background thread; False observes inline, on submit, so that
            every decision is ready at the next exchange (deterministic timing).
    """

    def __init__(self, controller: Controller, background: bool = True) -> None:
        self.controller = controller
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="rex", initializer=_lowest_priority
            )
            if background
            else None
        )
        # [Future[Decision] | Decision | dict, info], oldest first
        self._queue: collections.deque[list[Any]] = collections.deque()

    @property
    def pending(self) -> bool:
        """Whether some decision has not been taken yet (ready or still computing)."""
        return bool(self._queue)

    def submit(
        self, window: Window, info: dict[str, Any], max_sizes: list[int | None] | None = None
    ) -> None:
        """Queue ``window`` for the controller.

        Args:
            window: The window to observe.
            info: The window's extras, returned with its decision.
            max_sizes: Per-rank size caps measured with the window (memory); they are set
                on the controller in the same thread, just before it observes the window.
        """
        if self._pool is not None:
            future = self._pool.submit(self._observe, window, max_sizes)
            self._queue.append([future, info])
        else:
            self._queue.append([self._observe(window, max_sizes), info])

    def _observe(self, window: Window, max_sizes: list[int | None] | None) -> Decision:
        self.controller.set_bounds(self.controller.min_size, max_sizes)
        return self.controller.observe(window)

    def take_ready(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Remove and return the decisions that are ready, oldest first, without waiting.

        Stops at the first one still computing, so decisions are always taken in order.

        Returns:
            ``(Decision.to_dict(), info)`` pairs.
        """
        out = []
        while self._queue:
            pending, info = self._queue[0]
            if isinstance(pending, concurrent.futures.Future) and not pending.done():
                break
            self._queue.popleft()
            out.append((_as_dict(pending), info))
        return out

    def drain(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Wait for all queued work, and return the queued decisions, oldest first.

        For checkpoints: afterwards the background thread is idle, so the controller's state
        can be read (declines included), and the decisions stay queued until taken. This
        waits as long as the work left, at most a hyperparameter fit or two.

        Returns:
            ``(Decision.to_dict(), info)`` pairs.
        """
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # a barrier: one thread, FIFO
        for entry in self._queue:
            entry[0] = _as_dict(entry[0])
        return [(dict(d), info) for d, info in self._queue]

    def restore(self, entries: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """Queue decisions saved in a checkpoint again, as ready.

        Args:
            entries: Pairs from :meth:`drain`.
        """
        self._queue = collections.deque([dict(d), info] for d, info in entries)

    def decline(self) -> None:
        """Tell the controller its proposal was not applied, after the windows queued so far."""
        if self._pool is not None:
            self._pool.submit(self.controller.decline)
        else:
            self.controller.decline()

    def shutdown(self) -> None:
        """Stop the background thread after any running observation."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
