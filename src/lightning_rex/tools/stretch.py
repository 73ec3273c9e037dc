"""How the emulator stretches a step: the rank's work inside its model, and the sleep it owes.

A slower GPU runs every kernel slower, forward and backward, but not the host's Python:
Lightning's loop, the hooks, the optimizer's bookkeeping take as long on every rank. So the
work this account stretches is the time spent *inside the model's computations*:

* **forward**: the union of the forward windows of every module with parameters of its own,
  from its forward pre-hook to its forward hook (modules nest; overlapping windows count
  once; a functional loss between modules is left out, as is the step's Python around them);
* **backward**: from the first gradient that reaches any such module's output (or any
  parameter) to the backward pass's end (an autograd final callback), the whole autograd
  pass, activation checkpointing's recomputation included.

Inside those windows, time spent in a ``torch.distributed`` collective is neither work nor
compute (it is waiting on peers), and neither is a sleep of the emulator's. The rank owes
``target x work - (compute so far + slept so far)`` seconds of sleep, ``target`` being its
slowdown times the headroom, and it sleeps them at the points where a peer could see how far
it has got: before every collective, at the backward's last gradient (before DDP's reducer
hears of it) and at the backward's end. Work is the thread's CPU time on a one-thread CPU
rank (a process sharing the core does not add to it), wall time elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_rex.measure.backward import BackwardEnd

__all__ = ["StepStretch"]


class StepStretch:
    """One rank's account of a step's work and of the sleep it owes (see the module docstring).

    Args:
        sync: Synchronises the device before a clock is read (a no-op on CPU).
        on_backward_end: Called at each backward's end with the step's wall seconds per second
            of work so far (on the CPU clock), for the emulator's load check.
    """

    def __init__(self, sync: Callable[[], None], on_backward_end: Callable[[float], None]) -> None:
        self._sync = sync
        self._on_backward_end = on_backward_end
        self.active = False  # inside a step's compute phase
        self.target = 1.0
        self.cpu_clock = False
        self.slept_s = 0.0  # this step's sleeps
        self.total_delay_s = 0.0  # every sleep of the fit
        self._depth = 0  # windows open now
        self._opened = (0.0, 0.0)  # the open window's start (wall, work)
        self._wall = self._work = 0.0  # closed windows' wall (sleeps and waits left out), work
        self._out_wall = self._out_work = 0.0  # waits and sleeps inside the open window
        self._coll_at: tuple[float, float] | None = None
        self._backward = BackwardEnd(self._backward_done)
        self._grads = 0  # gradients of this backward pass so far
        self.expected = 0  # gradients the last backward pass had: the last one sleeps

    # ------------------------------------------------------------------ hooks
    def attach(self, module: torch.nn.Module) -> list[Any]:
        """Hook the module's leaf computations and its parameters' gradients.

        Args:
            module: The model.

        Returns:
            The hook handles (for the caller to remove).
        """
        handles: list[Any] = []
        for submodule in module.modules():
            if any(p.requires_grad for p in submodule.parameters(recurse=False)):
                handles.append(submodule.register_forward_pre_hook(self._forward_start))
                handles.append(submodule.register_forward_hook(self._forward_end))
        for param in module.parameters():
            if param.requires_grad:
                handles.append(param.register_hook(self._grad_computed))
        self.expected = sum(p.requires_grad for p in module.parameters())
        return handles

    def _forward_start(self, *_: Any) -> None:
        if self.active:
            self._open()

    def _forward_end(self, _: Any, args: tuple[Any, ...], out: Any) -> None:
        if not self.active:
            return
        self._close()
        if isinstance(out, Tensor) and out.requires_grad:
            out.register_hook(self._backward_reached)

    def _backward_reached(self, _: Tensor) -> None:
        self._backward_starts()

    def _grad_computed(self, _: Tensor | None) -> None:
        # a parameter's gradient hook runs before its AccumulateGrad, so before every
        # post-accumulate hook and DDP's reducer hook
        if not self.active:
            return
        self._backward_starts()
        self._grads += 1
        if self._grads == self.expected:  # the last gradient, as the last pass counted
            self.settle()

    def _backward_starts(self) -> None:
        """The first gradient of a backward pass: its window opens, its end is queued."""
        if self._backward.gradient():
            self._grads = 0
            self._open()

    def _backward_done(self) -> None:
        """The backward pass is over, before DDP finalises it: close it and settle."""
        self._close()
        if self._grads:
            self.expected = self._grads  # the next pass likely leaves out the same ones
        if self.active and self.cpu_clock:
            wall, work = self._so_far()
            if work > 0:
                self._on_backward_end((wall + self.slept_s) / work)
        self.settle()

    # ------------------------------------------------------------------ windows
    def _clock(self) -> tuple[float, float]:
        wall = time.perf_counter()
        return wall, (time.thread_time() if self.cpu_clock else wall)

    def _open(self) -> None:
        if self._depth == 0:
            self._sync()
            self._opened = self._clock()
            self._out_wall = self._out_work = 0.0
        self._depth += 1

    def _close(self) -> None:
        if self._depth == 1:
            wall, work = self._so_far_open()
            self._wall += wall
            self._work += work
        self._depth = max(0, self._depth - 1)

    def _so_far_open(self) -> tuple[float, float]:
        """The open window's compute so far: its wall and work, less waits and sleeps."""
        if self._depth == 0:
            return 0.0, 0.0
        self._sync()
        wall, work = self._clock()
        return (
            wall - self._opened[0] - self._out_wall,
            work - self._opened[1] - self._out_work,
        )

    def _so_far(self) -> tuple[float, float]:
        wall, work = self._so_far_open()
        return self._wall + wall, self._work + work

    # ------------------------------------------------------------------ the step
    def start(self, target: float, cpu_clock: bool) -> None:
        """A step's compute starts.

        Args:
            target: Its slowdown times the headroom.
            cpu_clock: Whether work is the thread's CPU time (else wall time).
        """
        self.target, self.cpu_clock = target, cpu_clock
        self.active, self.slept_s = True, 0.0
        self._depth, self._wall, self._work = 0, 0.0, 0.0
        self._coll_at = None
        self._backward.reset()

    def end(self) -> None:
        """Settle what is owed and stop: what follows (the optimizer) is not stretched."""
        self.settle()
        self.active = False
        self._depth = 0

    def collective_entered(self) -> None:
        """Before a collective: settle what is owed, then count nothing until it returns."""
        if not self.active:
            return
        self.settle()
        self._coll_at = self._clock()

    def collective_left(self) -> None:
        """After a collective: its time is a wait, inside an open window too."""
        if not self.active or self._coll_at is None:
            return
        wall, work = self._clock()
        if self._depth > 0:
            self._out_wall += wall - self._coll_at[0]
            self._out_work += work - self._coll_at[1]
        self._coll_at = None

    def collective_unseen(self, name: str, why: str) -> None:
        """An asynchronous collective: nothing to settle (the compute timer warns of it).

        Args:
            name: The ``torch.distributed`` function.
            why: Why its wait is not seen.
        """

    def settle(self) -> None:
        """Sleep what is owed: until the compute so far has lasted ``target x`` its work."""
        if not self.active or self.target <= 1.0:
            return
        wall, work = self._so_far()
        delay = self.target * work - wall - self.slept_s
        if delay <= 0:
            return
        time.sleep(delay)
        self.slept_s += delay
        self.total_delay_s += delay
        if self._depth > 0:  # a sleep inside a window is not the window's compute
            self._out_wall += delay
            if not self.cpu_clock:
                self._out_work += delay
