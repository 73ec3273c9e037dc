"""Each rank's own compute time per step, without the time it waits on its peers.

The wall time of a synchronous step is the same on every rank (the all-reduce makes the fast
ranks wait for the slowest), so it carries no signal. What differs is how long each rank
computes. What is measured, per micro-batch:

* **the span**: from ``on_train_batch_start`` to the end of its last backward pass, marked by
  an autograd final callback that the first gradient of each backward pass queues (so a
  parameter that gets no gradient, an unused head with ``find_unused_parameters=True``, a
  frozen layer or an untaken branch, changes nothing); a micro-batch with no backward ends
  at ``on_train_batch_end``;
* **minus every wait on a peer inside the span**:
  - every ``torch.distributed`` collective the step calls, from entry to return
    (:mod:`lightning_rex.measure.collectives`): ``self.log(..., sync_dist=True)``,
    ``self.all_gather``, torchmetrics syncing on step, ``SyncBatchNorm``'s forward and
    backward, a user's ``all_reduce`` in the loss, also when recomputed by activation
    checkpointing;
  - DDP's wait for its gradient buckets at the end of a backward pass that is not the last
    of the micro-batch (manual optimization with several backward passes): a second final
    callback, queued by the first, runs after DDP's and closes that wait.

DDP launches its bucket all-reduces asynchronously during the backward and waits for them
only when it finalises the backward, after the span's end, so that wait is never counted.
What is left out on every rank alike: the optimizer step, the data fetch, Lightning's loop
outside the hooks; what is left in: the forward, the loss, the backward, and the launch of
each collective (its transfer, the same on every rank). So the ranks' ratios, which the plan
depends on, are the ratios of their devices' compute.

With gradient accumulation a step's sample is the sum over its micro-batches. On CUDA every
mark is a CUDA event recorded on the current stream, never a host clock around asynchronous
kernels and never a synchronisation: a collective's events bracket its kernels on the stream
(the stream waits for NCCL's at a blocking collective), and the elapsed times are read once
per window, when the events have long completed. On other devices the host's
``perf_counter`` is exact because the work is synchronous.

Not separable, and said once on the rank where it happens (a ``RuntimeWarning`` naming the
cause and the fix):

* an asynchronous collective (``async_op=True``) inside the step: its wait is wherever
  ``wait()`` is called;
* a collective the wrappers cannot see, before the backward: one bound before the timer
  attached (``from torch.distributed import all_reduce`` at import), a functional collective
  (DTensor, ``torch.distributed._functional_collectives``) or one issued from C++. The
  default process group numbers its collectives; when, in 3 micro-batches in a row, it ran
  more of them between the step's start and the backward's first gradient than it ran
  inside the wrapped calls, the timer says so. (DDP's gradient buckets are launched in the
  backward, after that point; a hidden collective inside the backward is not detected.)
  The ranks' times alone cannot show it: a rank that waits on a slower one in its forward
  measures about as slow, whatever their times' correlation (it was near 0 both with such a
  wait and without).

A sharded model (FSDP2) synchronises at every layer: each unit all-gathers its parameters
before its forward and its backward, so the time to the last gradient holds every wait on
the slowest rank and is the same on every rank. For such a model (:meth:`ComputeTimer.attach_to`
finds FSDP units in it) the timer instead sums the windows of the *leaf computations*: every
module with parameters of its own, from its forward pre-hook to its forward hook and from the
gradient of its output to the gradient of its input, less any collective inside them. The
units' collectives and their waits run in the units' own hooks, outside those windows. What
runs between leaves (activations, attention's functional part) is left out on every rank
alike, so the ranks' ratios are kept.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch.autograd import Variable

from lightning_rex.measure import collectives
from lightning_rex.measure.backward import BackwardEnd

__all__ = ["ComputeTimer"]


def _sequence() -> int | None:
    """How many collectives the default process group has run (None: not numbered)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())  # type: ignore[attr-defined]
    except Exception:  # a backend that does not number its collectives
        return None


class ComputeTimer:
    """Measure a rank's compute time per micro-batch and sum it per optimizer step.

    Args:
        device: The rank's device; CUDA events are used when it is a CUDA device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.use_cuda_events = device.type == "cuda"
        self._handles: list[Any] = []
        self._listening = False
        self._start: Any = None
        self._end: Any = None  # the end of the micro-batch's last backward pass so far
        self._waits: list[tuple[Any, Any]] = []  # waits on peers inside the span so far
        self._pending: list[tuple[Any, Any]] = []  # waits not yet known to be inside it
        self._entered: Any = None  # the open collective's start
        self._backward = BackwardEnd(self._backward_done)
        self._micro: list[tuple[Any, Any, list[tuple[Any, Any]]]] = []  # finished micro-batches
        self._segments = False  # timing leaf computations (a sharded model)
        self._seg_start: Any = None
        self._depth = 0  # leaf windows open now
        self._inputs: list[Any] = []  # the inputs of the leaves whose forward is running
        self._warned: set[str] = set()
        self._seq: int | None = None  # the default group's collective count at the start
        self._seen = 0  # the default group's collectives inside the wrapped calls
        self._seq_at: int | None = None  # the default group's count when a call entered
        self._hidden_streak = 0  # micro-batches in a row with collectives not seen

    # ------------------------------------------------------------------ hooks
    def attach(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Hook every trainable parameter's gradient accumulation, and the collectives.

        Args:
            parameters: The module's parameters.
        """
        self.detach()
        for param in parameters:
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))
        self._listen()

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
        time some leaf of it was computing, less the collectives inside those windows. Only
        tensor hooks are used in backward (a full backward hook would hand FSDP views of the
        units' outputs).

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
        self._listen()

    def _listen(self) -> None:
        if not self._listening:
            collectives.add_listener(self)
            self._listening = True

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
            waits, self._waits = self._waits, []
            self._micro.append((self._seg_start, self._stamp(), waits))

    def detach(self) -> None:
        """Remove the hooks and stop listening to collectives."""
        self._segments = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._listening:
            collectives.remove_listener(self)
            self._listening = False

    def _stamp(self) -> Any:
        if self.use_cuda_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    # ------------------------------------------------------------------ collectives
    def collective_entered(self) -> None:
        """A collective starts: mark it, when a micro-batch is being timed."""
        if self._start is not None and self._seq is not None:
            self._seq_at = _sequence()
        if self._start is not None and (not self._segments or self._depth > 0):
            self._entered = self._stamp()

    def collective_left(self) -> None:
        """A collective returned: its span is a wait, not compute."""
        if self._seq_at is not None:  # what the default group counted in it (coalesced: more)
            now = _sequence()
            self._seen += 0 if now is None else now - self._seq_at
            self._seq_at = None
        if self._entered is not None and self._start is not None:
            wait = (self._entered, self._stamp())
            (self._waits if self._segments else self._pending).append(wait)
        self._entered = None

    def collective_unseen(self, name: str, why: str) -> None:
        """Warn once that a collective in the step is timed as compute.

        Args:
            name: The ``torch.distributed`` function.
            why: Why its wait cannot be timed.
        """
        if self._start is None or self._segments or name in self._warned:
            return  # a sharded model's units wait in their own hooks, outside the leaf windows
        self._warned.add(name)
        warnings.warn(
            f"lightning-rex: torch.distributed.{name} ran inside a training step, and {why}: "
            "whatever this rank waits for it on its peers is timed as its compute, so a slow "
            "rank can make the fast ones look as slow and the plan stay even. Wait on it "
            "before the step ends with a blocking call (async_op=False), or move it out of "
            "training_step (on_train_batch_end, or an epoch-level hook).",
            RuntimeWarning,
            stacklevel=3,
        )

    def _check_hidden(self, hidden: int | None) -> None:
        """Warn once when collectives the wrappers did not see keep running before backward.

        Args:
            hidden: The default group's collectives since the micro-batch started, less
                those the wrappers saw (None: the group does not number them).
        """
        self._hidden_streak = self._hidden_streak + 1 if hidden is not None and hidden > 0 else 0
        if self._hidden_streak < 3 or "hidden" in self._warned:
            return
        self._warned.add("hidden")
        warnings.warn(
            f"lightning-rex: {hidden} collective(s) on the default process group ran in this "
            "rank's training step before its backward that the compute timer cannot see: not "
            "called as torch.distributed.<function>(...) at run time (bound by a "
            "'from torch.distributed import ...' before the fit started, a functional "
            "collective such as DTensor's, or issued from C++). Whatever this rank waits there "
            "on a slower peer is timed as its compute, so the ranks look alike and the plan "
            "can stay even. Call the collective as torch.distributed.<function>(...) inside "
            "the step, or move it out of training_step.",
            RuntimeWarning,
            stacklevel=2,
        )

    # ------------------------------------------------------------------ backward
    def _grad_ready(self, _: torch.Tensor) -> None:
        self._waits += self._pending  # a backward goes on: the waits before it are inside
        self._pending = []
        if self._start is None:
            return
        if self._seq is not None:  # the micro-batch's first gradient
            now = _sequence()
            self._check_hidden(None if now is None else now - self._seq - self._seen)
            self._seq = None
        self._backward.gradient()

    def _backward_done(self) -> None:
        """The backward pass is over (before DDP finalises it): the span ends here, so far."""
        self._waits += self._pending
        self._pending = []
        self._end = self._stamp()
        if self._start is not None:
            Variable._execution_engine.queue_callback(self._ddp_waited)

    def _ddp_waited(self) -> None:
        """After DDP's finalisation: its wait on the buckets is a wait, if a backward follows."""
        if self._start is not None and self._end is not None:
            self._pending.append((self._end, self._stamp()))

    # ------------------------------------------------------------------ per micro-batch
    def start(self) -> None:
        """Mark the start of a micro-batch's compute (call in ``on_train_batch_start``)."""
        self._end = self._entered = None
        self._waits, self._pending = [], []
        self._backward.reset()
        self._depth = 0
        self._inputs.clear()
        self._seen = 0
        self._seq = None if self._segments else _sequence()
        self._start = self._stamp()

    def stop(self) -> None:
        """Close the micro-batch (call in ``on_train_batch_end``).

        A micro-batch without a backward pass ends now, with every wait so far inside it.
        """
        if self._start is None:
            return
        if not self._segments:
            if self._end is None:
                self._end = self._stamp()
                self._waits += self._pending
            self._micro.append((self._start, self._end, self._waits))
        self._start = self._seg_start = self._end = self._entered = None
        self._waits, self._pending = [], []
        self._depth = 0
        self._seq = None

    def take_step(self) -> Any:
        """Close the optimizer step and return its pending measurement.

        Returns:
            An opaque handle for :meth:`resolve`: each micro-batch's (start, end, waits).
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
            for start, end, waits in micro:
                total += self._elapsed(start, end)
                total -= sum(self._elapsed(a, b) for a, b in waits)
            out.append(max(total, 0.0))
        return out

    def _elapsed(self, start: Any, end: Any) -> float:
        if self.use_cuda_events:
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0
        return float(end - start)
