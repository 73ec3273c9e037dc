"""Each rank's pass cap: declared (``max_pass_sizes``) or measured, and the passes it cuts.

A strategy mixin, shared by :class:`~lightning_rex.RexStrategy` and
:class:`~lightning_rex.RexFSDPStrategy` through :class:`~lightning_rex.lightning.uneven.
UnevenPlans`. A rank's pass cap is the largest micro-batch it trains in one forward and
backward; the weighting (:class:`~lightning_rex.lightning.weighted.Weighted`) runs a larger
micro-batch as the passes :meth:`PassCaps.passes_for` gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_rex.core.checks import is_integer
from lightning_rex.core.passes import passes as pass_sizes
from lightning_rex.core.plans.schedule import SizeBounds

__all__ = ["PassCaps"]


class PassCaps:
    """A strategy mixin: this rank's pass cap, and the accumulation passes it cuts.

    Args:
        *args: The next class's positional arguments, passed through.
        max_pass_sizes: None, one cap for every rank, or one entry per rank (None for none).
        **kwargs: The next class's keyword arguments, passed through.

    Raises:
        ValueError: For a cap that is not None or an integer >= 1.
    """

    global_rank: int

    def __init__(
        self, *args: Any, max_pass_sizes: int | Sequence[int | None] | None = None, **kwargs: Any
    ) -> None:
        self.max_pass_sizes = _pass_caps_arg(max_pass_sizes)
        self._memory_cap: int | None = None  # measured by the callback (CUDA)
        super().__init__(*args, **kwargs)

    @property
    def bounds(self) -> SizeBounds:
        """The size bounds every plan obeys (the strategy's)."""
        raise NotImplementedError

    def declared_pass_cap(self) -> int | None:
        """This rank's pass cap from ``max_pass_sizes`` (None: not declared).

        Returns:
            The cap.
        """
        caps = self.max_pass_sizes
        if caps is None or isinstance(caps, int):
            return caps
        return caps[self.global_rank]

    def pass_cap(self) -> int | None:
        """The largest micro-batch this rank trains in one pass now.

        Returns:
            The smaller of the declared cap and the memory cap the callback measured last
            (None when neither binds).
        """
        caps = [c for c in (self.declared_pass_cap(), self._memory_cap) if c is not None]
        return min(caps) if caps else None

    def passes_for(self, size: int) -> list[int]:
        """The accumulation passes of ``size`` samples on this rank, none below the minimum.

        Args:
            size: The micro-batch.

        Returns:
            The passes' sizes: as :func:`~lightning_rex.core.passes.passes` cuts them under
            the pass cap, in fewer passes where one would fall below ``min_micro_batch_size``.
        """
        cap = self.pass_cap()
        lowest = self.bounds.min_size
        if cap is None or size <= cap:
            return [size]
        pass_count = max(1, min(-(-size // cap), size // lowest))
        return pass_sizes(size, -(-size // pass_count))

    def set_memory_cap(self, cap: int | None) -> None:
        """The pass cap this rank's memory allows, measured between steps (by the callback).

        It applies from the next step; the window that reports it prices it.

        Args:
            cap: The cap in samples (>= 1), or None for none.
        """
        self._memory_cap = None if cap is None else max(1, int(cap))


def _pass_caps_arg(value: int | Sequence[int | None] | None) -> int | tuple[int | None, ...] | None:
    """``max_pass_sizes`` checked: None, an int >= 1, or a list of those and None."""
    if value is None:
        return None
    if is_integer(value):
        entries: list[Any] = [value]
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0:
        entries = list(value)
    else:
        entries = [value]
    bad = [c for c in entries if c is not None and not (is_integer(c) and int(c) >= 1)]
    if bad or (not is_integer(value) and not isinstance(value, Sequence)):
        raise ValueError(
            "max_pass_sizes must be None, an integer >= 1, or one entry per rank (integers "
            f">= 1, or None for no cap), got {value!r}"
        )
    if is_integer(value):
        return int(value)  # type: ignore[arg-type]
    return tuple(None if c is None else int(c) for c in entries)
