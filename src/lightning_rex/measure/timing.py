"""Each rank's own compute time per step, without the time it waits on its peers.

The wall time of a synchronous step is the same on every rank (the all-reduce makes the fast
ranks wait for the slowest), so it carries no signal. What differs is how long each rank
computes: from the start of its step until its *last local gradient is ready*. The timer
marks the start in ``on_train_batch_start`` and the end in a post-accumulate-grad hook on
every parameter: the hook that fires last in a backward pass marks the end. DDP launches its
bucket all-reduces asynchronously from the same autograd pass, so waiting on peers (which
happens when DDP finalises the backward) is not included.

On CUDA, start and end are CUDA events recorded on the current stream, never host clocks
around asynchronous kernels; the elapsed times are read once per window, when the events
have long completed, so timing adds no synchronisation to the step. On other devices the
host's ``perf_counter`` is exact because the work is synchronous.

With gradient accumulation a step's sample is the sum over its micro-batches.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ComputeTimer"]


class ComputeTimer:
    """Measure a rank's compute time per micro-batch and sum it per optimizer step.

    Args:
        device: The rank's device; CUDA events are used when it is a CUDA device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.use_cuda_events = device.type == "cuda"
        self._handles: list[Any] = []
        self._n_params = 0
        self._fired = 0
        self._start: Any = None
        self._end: Any = None
        self._host_start = 0.0
        self._host_end = 0.0
        self._micro: list[tuple[Any, Any]] = []  # finished micro-batches of the current step

    # ------------------------------------------------------------------ hooks
    def attach(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Hook every trainable parameter's gradient accumulation.

        Args:
            parameters: The module's parameters.
        """
        self.detach()
        for p in parameters:
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
                self._n_params += 1

    def detach(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._n_params = 0

    def _stamp(self) -> Any:
        if self.use_cuda_events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def _grad_ready(self, _: torch.Tensor) -> None:
        self._fired += 1
        if self._fired == self._n_params:  # the last local gradient of this backward
            self._end = self._stamp()

    # ------------------------------------------------------------------ per micro-batch
    def start(self) -> None:
        """Mark the start of a micro-batch's compute (call in ``on_train_batch_start``)."""
        self._fired = 0
        self._end = None
        self._start = self._stamp()

    def stop(self) -> None:
        """Close the micro-batch (call in ``on_train_batch_end``).

        If some parameters got no gradient (unused parameters), the end is taken now.
        """
        if self._start is None:
            return
        end = self._end if self._end is not None else self._stamp()
        self._micro.append((self._start, end))
        self._start = None

    def take_step(self) -> Any:
        """Close the optimizer step and return its pending measurement.

        Returns:
            An opaque handle for :meth:`resolve`: the micro-batch (start, end) pairs.
        """
        micro, self._micro = self._micro, []
        return micro

    def resolve(self, pending: list[Any]) -> list[float]:
        """Turn pending step measurements into seconds (reads CUDA events once).

        Args:
            pending: Handles from :meth:`take_step`, or seconds (passed through).

        Returns:
            One compute time in seconds per step.
        """
        out = []
        for micro in pending:
            if isinstance(micro, (int, float)):
                out.append(float(micro))
                continue
            total = 0.0
            for start, end in micro:
                if self.use_cuda_events:
                    end.synchronize()
                    total += start.elapsed_time(end) / 1000.0
                else:
                    total += end - start
            out.append(total)
        return out
