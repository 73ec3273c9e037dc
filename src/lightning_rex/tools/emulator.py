"""``HeterogeneityEmulator``: make ranks of one machine behave like slower GPUs.

A rank with slowdown ``f`` must take ``f`` times its real compute time per step, and the
extra time must sit *inside* its compute phase, before its gradients are ready, so that it
delays the all-reduce exactly as a slower GPU would, and it must scale with the step's own
work (a smaller micro-batch gets a shorter delay). The emulator therefore sleeps right after
the forward pass (``on_before_backward``) for ``(f - 1) x (forward + backward)`` of this
step, where the backward time is the step's forward time times the backward/forward ratio
measured on earlier steps (from ``on_before_backward`` until the last local gradient is
accumulated, which excludes waiting for peers). Sleeping frees the CPU core, like an idle
host waiting on a slow device.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

__all__ = ["EmulatedEvent", "HeterogeneityEmulator"]

_EVENT_KEYS = ("ranks", "start", "end", "factor")


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
        backward_ratio: The backward/forward time ratio assumed until one is measured.

    Raises:
        ValueError: For slowdowns below 1, malformed events, or (at fit start) a slowdown
            list whose length is not the world size.
    """

    def __init__(
        self,
        slowdowns: Sequence[float] | None = None,
        events: Sequence[Mapping[str, Any]] | None = None,
        backward_ratio: float = 2.0,
    ) -> None:
        if slowdowns is not None:
            bad = [s for s in slowdowns if not float(s) >= 1.0]
            if bad:
                raise ValueError(
                    "slowdowns must all be >= 1.0 (a factor on compute time), got "
                    f"{list(slowdowns)}"
                )
        if not backward_ratio > 0:
            raise ValueError(f"backward_ratio must be > 0, got {backward_ratio}")
        self.slowdowns = None if slowdowns is None else tuple(float(s) for s in slowdowns)
        self.events = tuple(EmulatedEvent.from_mapping(e, i) for i, e in enumerate(events or ()))
        self._ratio = float(backward_ratio)
        self._t_start = 0.0
        self._t_fwd_end = 0.0
        self._fwd = 0.0
        self._last_grad = 0.0
        self._handles: list[Any] = []
        self.total_delay_s = 0.0

    def factor(self, rank: int, step: int) -> float:
        """The slowdown factor of ``rank`` at optimizer ``step``.

        Args:
            rank: The global rank.
            step: The optimizer step.

        Returns:
            ``slowdowns[rank]`` times every active event's factor for that rank.
        """
        f = 1.0 if self.slowdowns is None else self.slowdowns[rank]
        for e in self.events:
            if rank in e.ranks and e.start <= step < e.end:
                f *= e.factor
        return f

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validate against the world size and hook the parameters' gradient accumulation."""
        n = trainer.world_size
        if self.slowdowns is not None and len(self.slowdowns) != n:
            raise ValueError(
                f"slowdowns must have one entry per rank: the world size is {n}, got "
                f"{len(self.slowdowns)} ({list(self.slowdowns)})"
            )
        bad = sorted({r for e in self.events for r in e.ranks if r >= n})
        if bad:
            raise ValueError(f"events name ranks {bad}, but the world size is {n}")
        for p in pl_module.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

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

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _grad_ready(self, _: Tensor) -> None:
        self._last_grad = time.perf_counter()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Mark the start of the step's compute."""
        self._sync(pl_module)
        self._t_start = time.perf_counter()

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        """After the forward pass: sleep the extra compute time of a slower device."""
        self._sync(pl_module)
        now = time.perf_counter()
        self._fwd = now - self._t_start
        f = self.factor(trainer.global_rank, trainer.global_step)
        if f > 1.0:
            delay = (f - 1.0) * self._fwd * (1.0 + self._ratio)
            time.sleep(delay)
            self.total_delay_s += delay
        self._t_fwd_end = time.perf_counter()
        self._last_grad = self._t_fwd_end

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Update the backward/forward ratio from this step's local backward time."""
        bwd = self._last_grad - self._t_fwd_end
        if self._fwd > 0 and bwd > 0:
            self._ratio = 0.8 * self._ratio + 0.2 * (bwd / self._fwd)

    @staticmethod
    def _sync(pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
