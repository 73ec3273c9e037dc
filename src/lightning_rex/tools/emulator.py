"""``HeterogeneityEmulator``: make ranks of one machine behave like slower GPUs.

A rank with slowdown ``f`` must take ``f`` times its real compute time per step, and the
extra time must sit where a slower GPU's would: *in the model's computations*, forward and
backward, so that a peer meets the slow rank late at every collective the step holds (a
``self.log(..., sync_dist=True)``, an ``all_gather`` in the loss, a synchronised batch norm),
not only at the gradient all-reduce; and it must scale with the step's own work (a smaller
micro-batch gets a shorter delay). A slower GPU does not slow the host's Python, so
Lightning's loop and hooks are not stretched. :class:`~lightning_rex.tools.stretch.StepStretch`
keeps the account: the work inside every module's forward and inside the backward pass, less
the time inside collectives, and the sleep that makes it last ``f x headroom`` times that
work, slept before every collective, at the backward's last gradient (before DDP's reducer
hears of it, so the last all-reduce waits for it) and at the backward's end. Every stretch of
computation between two points where the rank meets its peers therefore lasts ``f x
headroom`` times its work, as on a device that slow. It sleeps at those few points only: a
thread that sleeps often comes back to cold caches and computes slower (sleeping at every
module's forward made a 3x rank measure 3.6x). Before, the emulator slept once, at the
backward's end, after every in-step collective, and stretched the host's per-step Python
too, so a small model's best plan under it leaned far to the fast rank (``[55, 9]`` where a
slowed forward gave ``[47, 17]``).

A sharded model (FSDP2) is stretched inside its leaf computations instead, sleeping at the
end of each (see :meth:`HeterogeneityEmulator.attach`).

The work is the rank's CPU time where it computes on the CPU with one thread: time the rank
spends descheduled, because another process shares its core, is not work, so that load does
not multiply the emulated slowdown; the sleep absorbs it while the load takes less than the
``f x headroom`` share. Elsewhere (CUDA, after synchronising; several CPU threads) the work is
wall time. ``headroom`` makes every rank, the fastest included, an emulated device that
computes ``headroom`` times slower than its host: a host shared with other processes then
changes no rank's step time while the rank gets at least ``1 / (f x headroom)`` of its core.
It is 2 on a CPU rank by default (1 on CUDA): at 1 the fastest rank runs at its core's real
speed, so any other process on the machine stretches its steps while the slow ranks' sleep
absorbs the same load, and the ratio asked for shrinks (3x measured as 1.7x beside two busy
processes on two cores). Where the load exceeds the headroom (the rank's compute lasts more
than ``f x headroom`` times its CPU work in most of 20 steps), the emulator warns once, with
the headroom that would absorb it.
"""

from __future__ import annotations

import collections
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_rex.measure import collectives
from lightning_rex.tools.stretch import StepStretch

__all__ = ["EmulatedEvent", "HeterogeneityEmulator"]

_EVENT_KEYS = ("ranks", "start", "end", "factor")
CPU_HEADROOM = 2.0
"""The default headroom on a CPU rank (1.0 on CUDA)."""
_CHECK_STEPS = 20
"""Steps the load check looks back over."""
_TOLERANCE = 1.1
"""A step is over its emulated factor when its compute lasts more than this times it."""


@dataclass(frozen=True)
class EmulatedEvent:
    """A temporary slowdown: ``factor`` multiplies the ranks' slowdown for steps in [start, end).

    Args:
        ranks: The global ranks affected.
        start: The first optimizer step of the event.
        end: The first optimizer step after it (exclusive).
        factor: The multiplier on the ranks' slowdown (> 0).
    """

    ranks: tuple[int, ...]
    start: int
    end: int
    factor: float

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any], index: int = 0) -> EmulatedEvent:
        """Build and validate an event from a ``{"ranks", "start", "end", "factor"}`` dict.

        Args:
            spec: The event's fields.
            index: Its position in the ``events`` list, for error messages.

        Returns:
            The event.

        Raises:
            ValueError: Naming ``events[index]`` and the bad field.
        """
        unknown = sorted(set(spec) - set(_EVENT_KEYS))
        if unknown:
            raise ValueError(
                f"events[{index}] has unknown keys {unknown}; allowed: {list(_EVENT_KEYS)}"
            )
        missing = [k for k in _EVENT_KEYS if k not in spec]
        if missing:
            raise ValueError(f"events[{index}] is missing {missing}")
        ranks = tuple(int(r) for r in spec["ranks"])
        start, end, factor = int(spec["start"]), int(spec["end"]), float(spec["factor"])
        if not ranks or any(r < 0 for r in ranks):
            raise ValueError(
                f"events[{index}].ranks must be a non-empty list of ranks >= 0, got {ranks}"
            )
        if start < 0 or end <= start:
            raise ValueError(
                f"events[{index}] needs 0 <= start < end, got start={start}, end={end}"
            )
        if not factor > 0:
            raise ValueError(f"events[{index}].factor must be > 0, got {factor}")
        return cls(ranks, start, end, factor)


class HeterogeneityEmulator(Callback):
    """Emulate per-rank slowdowns and timed slowdown events on homogeneous hardware.

    Args:
        slowdowns: One factor >= 1 per rank (global rank order): rank ``r``'s compute takes
            ``slowdowns[r]`` times its real compute time. None: all 1.0.
        events: Temporary slowdowns, each ``{"ranks": [1], "start": 100, "end": 120,
            "factor": 4.0}`` with ``start``/``end`` in optimizer steps, ``end`` exclusive;
            ``factor`` multiplies the ranks' slowdown during the event.
        backward_ratio: Deprecated and ignored: the backward is measured, not predicted
            from the forward; passing it warns (``FutureWarning``).
        headroom: A factor >= 1 on every rank's compute time, the fastest rank's included:
            each rank's forward and backward last ``slowdown x headroom`` times their work
            (CPU time on a one-thread CPU rank), so that a process sharing the rank's core
            does not change its step time while it leaves the rank ``1 / (slowdown x
            headroom)`` of the core. None (the default): 2.0 on a CPU rank, 1.0 on CUDA.
            1.0: a rank of slowdown 1 runs at its real speed, and another process on the
            machine shrinks the ratios asked for.

    Raises:
        ValueError: For slowdowns below 1, malformed events, a ``headroom`` that is not a
            finite number >= 1, or (at fit start) a slowdown list whose length is not the
            world size.
    """

    def __init__(
        self,
        slowdowns: Sequence[float] | None = None,
        events: Sequence[Mapping[str, Any]] | None = None,
        backward_ratio: float | None = None,
        headroom: float | None = None,
    ) -> None:
        if slowdowns is not None:
            bad = [s for s in slowdowns if not float(s) >= 1.0]
            if bad:
                raise ValueError(
                    "slowdowns must all be >= 1.0 (a factor on compute time), got "
                    f"{list(slowdowns)}"
                )
        if backward_ratio is not None:
            warnings.warn(
                "HeterogeneityEmulator(backward_ratio=...) is ignored and will be removed: the "
                "emulator now measures each step's backward instead of predicting it",
                FutureWarning,
                stacklevel=2,
            )
        if headroom is not None:
            if isinstance(headroom, bool) or not isinstance(headroom, (int, float)):
                raise ValueError(f"headroom must be a number >= 1 or None, got {headroom!r}")
            if not 1.0 <= headroom < math.inf:
                raise ValueError(f"headroom must be a finite number >= 1, got {headroom}")
        self.slowdowns = None if slowdowns is None else tuple(float(s) for s in slowdowns)
        self.events = tuple(EmulatedEvent.from_mapping(e, i) for i, e in enumerate(events or ()))
        #: The headroom asked for (None: by device, see :attr:`headroom_in_use`).
        self.headroom = None if headroom is None else float(headroom)
        #: The headroom of this fit's rank: ``headroom``, or its device's default.
        self.headroom_in_use = CPU_HEADROOM if headroom is None else float(headroom)
        self._rank = 0
        self._over: collections.deque[float] = collections.deque(maxlen=_CHECK_STEPS)
        self._warned = False
        self._cpu_clock = False
        self._target = 1.0  # slowdown x headroom of the step in progress
        self._stretch = StepStretch(self._sync, self._check_load)  # a model not sharded
        self._listening = False
        self._device: torch.device | None = None
        self._handles: list[Any] = []
        self._sharded = False
        # a sharded model: the leaf windows open now, and the step's wall and work in them
        self._depth, self._leaf_wall, self._leaf_work = 0, 0.0, 0.0
        self._win_wall = self._win_work = 0.0
        self._leaf_inputs: list[Any] = []
        self._sharded_delay_s = 0.0

    @property
    def total_delay_s(self) -> float:
        """Seconds this rank has slept in this fit, in all its steps."""
        return self._sharded_delay_s + self._stretch.total_delay_s

    def factor(self, rank: int, step: int) -> float:
        """The slowdown factor of ``rank`` at optimizer ``step``.

        Args:
            rank: The global rank.
            step: The optimizer step.

        Returns:
            ``slowdowns[rank]`` times every active event's factor for that rank.
        """
        slowdown = 1.0 if self.slowdowns is None else self.slowdowns[rank]
        for event in self.events:
            if rank in event.ranks and event.start <= step < event.end:
                slowdown *= event.factor
        return slowdown

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validate against the world size and hook the parameters' gradients."""
        self.attach(pl_module, trainer.global_rank, trainer.world_size, pl_module.device)

    def attach(
        self, module: torch.nn.Module, rank: int, world_size: int, device: torch.device
    ) -> None:
        """Validate against the world size and hook the module's gradients (a custom loop).

        A Trainer calls this at fit start; a Fabric loop (:class:`~lightning_rex.lightning.
        fabric.RexLoop`) calls it, :meth:`step_start`, :meth:`step_end` and
        :meth:`remove`.

        Args:
            module: The model whose backward is stretched.
            rank: This process's global rank.
            world_size: The number of ranks.
            device: The rank's device.

        Raises:
            ValueError: For slowdowns or events that do not match the world size.
        """
        n_ranks = world_size
        if self.slowdowns is not None and len(self.slowdowns) != n_ranks:
            raise ValueError(
                f"slowdowns must have one entry per rank: the world size is {n_ranks}, got "
                f"{len(self.slowdowns)} ({list(self.slowdowns)})"
            )
        bad = sorted({r for e in self.events for r in e.ranks if r >= n_ranks})
        if bad:
            raise ValueError(f"events name ranks {bad}, but the world size is {n_ranks}")
        default = 1.0 if device.type == "cuda" else CPU_HEADROOM
        self.headroom_in_use = default if self.headroom is None else self.headroom
        self._rank = rank
        self._device = device
        self._over.clear()
        self._warned = False
        self._remove()
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in module.modules()):
            # sharded (FSDP2): the gradients land in the shards after the reduce-scatter, so
            # the stretch goes into the leaf computations, where the rank's compute timer
            # looks (ComputeTimer.attach_leaves): each leaf's forward end and each leaf's
            # input gradient sleeps until the step so far has lasted its factor
            self._sharded = True
            for submodule in module.modules():
                if any(p.requires_grad for p in submodule.parameters(recurse=False)):
                    self._handles.append(submodule.register_forward_pre_hook(self._leaf_start))
                    self._handles.append(submodule.register_forward_hook(self._leaf_done))
        else:
            self._sharded = False
            self._handles += self._stretch.attach(module)
            collectives.add_listener(self._stretch, first=True)
            self._listening = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Remove the gradient hooks."""
        self._remove()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Remove the gradient hooks after a failed fit."""
        self._remove()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Remove the gradient hooks."""
        self._remove()

    def remove(self) -> None:
        """Remove the gradient hooks (a custom loop's end)."""
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._listening:
            collectives.remove_listener(self._stretch)
            self._listening = False
        self._stretch.end()

    def _work_clock(self) -> float:
        """The clock that measures the rank's work: its thread's CPU time, or wall time."""
        return time.thread_time() if self._cpu_clock else time.perf_counter()

    def _leaf_start(self, _: Any, args: tuple[Any, ...]) -> None:
        self._open()
        first = next((a for a in args if isinstance(a, Tensor)), None)
        self._leaf_inputs.append(first if first is not None and first.requires_grad else None)

    def _leaf_done(self, _: Any, args: tuple[Any, ...], out: Any) -> None:
        """A leaf's forward ended (sharded model): stretch it; hook its backward likewise."""
        self._close()
        inp = self._leaf_inputs.pop() if self._leaf_inputs else None
        if inp is not None and isinstance(out, Tensor) and out.requires_grad:
            out.register_hook(lambda g: self._open())
            inp.register_hook(lambda g: self._close())

    def _open(self) -> None:
        """A leaf computation starts (sharded model): the timer's windows, counted alike."""
        if self._depth == 0:
            self._win_wall, self._win_work = time.perf_counter(), self._work_clock()
        self._depth += 1

    def _close(self) -> None:
        """A leaf computation ends: sleep until the step's leaf time is its factor x work.

        The rank's compute timer sums the same windows (``ComputeTimer.attach_leaves``), and
        this close runs before the timer's, so the sleep falls inside them and the timer sees
        ``slowdown x headroom`` times the work it would see unstretched.
        """
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        self._leaf_wall += time.perf_counter() - self._win_wall
        self._leaf_work += self._work_clock() - self._win_work
        delay = self._target * self._leaf_work - self._leaf_wall if self._target > 1.0 else 0.0
        if delay > 0:
            time.sleep(delay)
            self._leaf_wall += delay
            self._sharded_delay_s += delay

    def _check_load(self, stretch: float) -> None:
        """Warn once when the rank's work keeps taking longer than its emulated compute.

        Args:
            stretch: Wall seconds per second of CPU work in this step's compute phase.
        """
        self._over.append(stretch if stretch > _TOLERANCE * self._target else 0.0)
        over = [x for x in self._over if x > 0]
        if self._warned or len(over) <= _CHECK_STEPS // 2:
            return
        self._warned = True
        worst = sorted(over)[len(over) // 2]
        slowdown = self._target / self.headroom_in_use
        wanted = math.ceil(_TOLERANCE * worst / slowdown)
        warnings.warn(
            f"HeterogeneityEmulator: rank {self._rank}'s compute took {worst:.1f}x its CPU work "
            f"in {len(over)} of its last {len(self._over)} steps, more than the {self._target:g}x "
            f"it emulates (slowdown {slowdown:g} x headroom {self.headroom_in_use:g}): other "
            "processes are taking its core, so the slowdowns it emulates are not the ones asked "
            f"for. Free the machine, or raise the headroom (HeterogeneityEmulator(headroom="
            f"{max(wanted, 2)}) absorbs this load).",
            RuntimeWarning,
            stacklevel=2,
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Mark the start of the step's compute, and choose the clock that measures work."""
        self._device = pl_module.device
        self.step_start(trainer.global_rank, trainer.global_step)

    def step_start(self, rank: int, step: int) -> None:
        """Mark the start of a step's compute (a custom loop calls it before the forward).

        Args:
            rank: This process's global rank.
            step: The optimizer step about to run.
        """
        self._sync()
        # decided per step: another callback may set the thread count at fit start
        device = self._device
        self._cpu_clock = (
            device is not None and device.type == "cpu" and torch.get_num_threads() == 1
        )
        self._target = self.factor(rank, step) * self.headroom_in_use
        self._depth, self._leaf_wall, self._leaf_work = 0, 0.0, 0.0
        self._leaf_inputs.clear()
        if not self._sharded:
            self._stretch.start(self._target, self._cpu_clock)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Sleep here if no gradient hook did (a parameter got no gradient this step)."""
        self.after_backward()

    def after_backward(self) -> None:
        """After a step's backward: settle what is due (a custom loop calls it).

        The backward's end has settled it already, unless the step had no backward pass
        with a gradient of the model's.
        """
        if not self._sharded:
            self._stretch.settle()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """The micro-batch's compute is over: what follows (the optimizer) is not stretched."""
        self.step_end()

    def step_end(self) -> None:
        """Settle what is due and stop stretching until the next step (a custom loop calls it).

        Collectives after it (the optimizer's, rex's own exchanges) are not delayed.
        """
        self._stretch.end()

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
