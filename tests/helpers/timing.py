"""Injected step times: drive timing-dependent logic without wall clocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_rex import RexCallback


def with_step_times(fn: Callable[[int, int, int], float], **kwargs: Any) -> RexCallback:
    """A RexCallback whose samples are ``fn(rank, step, micro_batch)`` seconds, not measured."""
    cb = RexCallback(**kwargs)
    cb._step_time_fn = fn
    return cb
