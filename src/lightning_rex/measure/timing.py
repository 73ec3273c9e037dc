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

A sharded model (FSDP2) synchronises at every layer: each unit all-gathers its parameters
before its forward and its backward, so the time to the last gradient holds every wait on
the slowest rank and is the same on every rank. For such a model (:meth:`ComputeTimer.attach_to`
finds FSDP units in it) the timer instead sums the windows of the *leaf computations*: every
module with parameters of its own, from its forward pre-hook to its forward hook and from the
gradient of its output to the gradient of its input. The collectives and their waits run in
the units' own hooks, outside those windows. What runs between leaves (activations, attention's
functional part) is left out on every rank alike, so the ranks' ratios, which the plan
depends on, are kept.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
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
        self._segments = False  # timing leaf computations (a sharded model)
        self._seg_start: Any = None
        self._depth = 0  # leaf windows open now
        self._inputs: list[Any] = []  # the inputs of the leaves whose forward is running

    # ------------------------------------------------------------------ hooks
    def attach(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Hook every trainable parameter's gradient accumulation.

        Args:
            parameters: The module's parameters.
        """
        self.detach()
        for param in parameters:
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))
                self._n_params += 1

    def attach_to(self, module: torch.nn.Module) -> None:
        """Hook a module: its leaf computations when it is sharded (FSDP2), else its gradients.

        Args:
            module: The model (the LightningModule, or a Fabric model).
        """
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - torch without distributed
            FSDPModule = ()  # type: ignore[assignment,misc]
        from torch._dynamo.eval_frame import OptimizedModule

        sharded = any(isinstance(m, FSDPModule) for m in module.modules())
        if sharded and any(isinstance(m, OptimizedModule) for m in module.modules()):
            warnings.warn(
                "lightning-rex: a sharded model with compiled parts: the compute timer does not "
                "hook its layers (each hook would break the compiled graph), so each rank's time "
                "runs to its step's end and holds its waits on the other ranks; plans adapt less "
                "than they would uncompiled",
                RuntimeWarning,
                stacklevel=2,
            )
            self.attach(module.parameters())
        elif sharded:
            self.attach_leaves(module)
        else:
            self.attach(module.parameters())

    def attach_leaves(self, module: torch.nn.Module) -> None:
        """Time every module with parameters of its own, forward and backward, and sum them.

        Forward: from a leaf's forward pre-hook to its forward hook. Backward: from the
        gradient of its output (a tensor hook) to the gradient of its input, when its input
        needs one. Overlapping windows count once (their union), so a rank's sample is the
        time some leaf of it was computing. Only tensor hooks are used in backward (a full
        backward hook would hand FSDP views of the units' outputs).

        Args:
            module: The model.
        """
        self.detach()
        self._segments = True
        for submodule in module.modules():
            if any(p.requires_grad for p in submodule.parameters(recurse=False)):
                self._handles += [
                    submodule.register_forward_pre_hook(self._leaf_pre),
                    submodule.register_forward_hook(self._leaf_post),
                ]

    def _leaf_pre(self, _: Any, args: tuple[Any, ...]) -> None:
        self._open()
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self._inputs.append(first if first is not None and first.requires_grad else None)

    def _leaf_post(self, _: Any, args: tuple[Any, ...], out: Any) -> None:
        self._close()
        inp = self._inputs.pop() if self._inputs else None
        if inp is not None and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self._open())
            inp.register_hook(lambda g: self._close())

    def _open(self) -> None:
        if self._start is None:
            return
        if self._depth == 0:
            self._seg_start = self._stamp()
        self._depth += 1

    def _close(self) -> None:
        if self._start is None or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._micro.append((self._seg_start, self._stamp()))

    def detach(self) -> None:
        """Remove the hooks."""
        self._segments = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._n_params = 0

    def _stamp(self) -> Any:
        if self.use_cuda_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def _grad_ready(self, _: torch.Tensor) -> None:
        self._fired += 1
        if self._fired % self._n_params == 0:  # the last local gradient of this backward (pass)
            self._end = self._stamp()

    # ------------------------------------------------------------------ per micro-batch
    def start(self) -> None:
        """Mark the start of a micro-batch's compute (call in ``on_train_batch_start``)."""
        self._fired = 0
        self._end = None
        self._depth = 0
        self._inputs.clear()
        self._start = self._stamp()

    def stop(self) -> None:
        """Close the micro-batch (call in ``on_train_batch_end``).

        If some parameters got no gradient (unused parameters), the end is taken now.
        """
        if self._start is None:
            return
        if not self._segments:
            end = self._end if self._end is not None else self._stamp()
            self._micro.append((self._start, end))
        self._start = self._seg_start = None
        self._depth = 0

    def take_step(self) -> Any:
        """Close the optimizer step and return its pending measurement.

        Returns:
            An opaque handle for :meth:`resolve`: the micro-batch (start, end) pairs.
        """
        micro, self._micro = self._micro, []
        return micro

    def window_row(self, samples: list[Any]) -> np.ndarray:
        """A window's samples of this rank as the driver reads them: one row of seconds.

        Args:
            samples: What the driver was given per step: ``[handle]`` lists, a handle from
                :meth:`take_step` or injected seconds each.

        Returns:
            Shape ``(1, K)`` seconds, float64 (CUDA events are read here, once a window).
        """
        return np.asarray(self.resolve([s[0] for s in samples]), dtype=np.float64)[None, :]

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
