"""Run ``Controller.observe`` on rank 0 without stalling training.

:class:`BackgroundObserver` hands a window to the controller in one background thread that
only computes (no collective ever leaves it) and gives the decision back, as JSON-able data,
when the callback asks for it at the exchange step. On Linux the thread runs at the lowest
CPU priority (per-thread nice 19): where the host CPU also trains (CPU runs, the emulated
demo), the controller's occasional model refit then uses idle time, such as the fast rank's
wait at the all-reduce, instead of rank 0's compute. On GPU hosts it overlaps device work.
"""

from __future__ import annotations

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


class BackgroundObserver:
    """Observe windows with a controller, in a background thread or inline.

    Args:
        controller: The controller (rank 0's).
        background: Use a background thread; False observes inline, on submit.
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
        self._pending: Any = None  # Future[Decision], Decision or its dict

    @property
    def pending(self) -> bool:
        """Whether a decision is waiting to be exchanged."""
        return self._pending is not None

    def submit(self, window: Window) -> None:
        """Start observing ``window``; the previous decision must have been taken.

        Args:
            window: The window to observe.
        """
        if self._pool is not None:
            self._pending = self._pool.submit(self.controller.observe, window)
        else:
            self._pending = self.controller.observe(window)

    def result(self) -> dict[str, Any]:
        """Wait for the pending decision (if still computing) and return it as a dict.

        It stays pending until :meth:`clear`, so that a checkpoint can save it.

        Returns:
            ``Decision.to_dict()`` of the pending decision.
        """
        pending = self._pending
        if isinstance(pending, concurrent.futures.Future):
            pending = pending.result()
        if isinstance(pending, Decision):
            pending = pending.to_dict()
        self._pending = pending
        return dict(pending)

    def restore(self, decision: dict[str, Any]) -> None:
        """Make a decision saved in a checkpoint pending again.

        Args:
            decision: The dict from :meth:`result`.
        """
        self._pending = dict(decision)

    def clear(self) -> None:
        """Forget the pending decision (it was exchanged)."""
        self._pending = None

    def shutdown(self) -> None:
        """Stop the background thread after any running observation."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
