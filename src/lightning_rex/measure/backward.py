"""The end of the autograd backward pass that is running, from inside one of its hooks.

The compute timer and the emulator both need the moment a backward pass is over, before
DDP finalises it (DDP queues its own final callback only when its last bucket is ready, so a
callback queued at the pass's first gradient runs before DDP's). A gradient hook tells
:class:`BackwardEnd`; the first one of each pass (each autograd graph task, so a nested
backward of reentrant checkpointing is a pass of its own) queues the callback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import Variable

__all__ = ["BackwardEnd"]


class BackwardEnd:
    """Call ``on_end`` when the backward pass in which :meth:`gradient` was first called ends.

    Args:
        on_end: Called once per backward pass, at its end (an autograd final callback).
    """

    def __init__(self, on_end: Callable[[], None]) -> None:
        self._on_end = on_end
        self._task = -2  # the graph task whose end is queued (-2: none)

    def gradient(self) -> bool:
        """A gradient of the running backward pass is ready (call from a gradient hook).

        Returns:
            Whether it is the pass's first, and its end was queued now (False outside the
            autograd engine, where nothing can be queued).
        """
        task = torch._C._current_graph_task_id()
        if task == self._task:
            return False
        self._task = task
        try:
            Variable._execution_engine.queue_callback(self._ended)
        except RuntimeError:  # not inside the autograd engine
            return False
        return True

    def reset(self) -> None:
        """Forget the pass in progress (a new step starts)."""
        self._task = -2

    def _ended(self) -> None:
        self._task = -2
        self._on_end()
