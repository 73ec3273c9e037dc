"""Injected step times: drive timing-dependent logic without wall clocks."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

from lightning_rex import RexCallback


def with_step_times(fn: Callable[[int, int, int], float], **kwargs: Any) -> RexCallback:
    """A RexCallback whose samples are ``fn(rank, step, micro_batch)`` seconds, not measured."""
    cb = RexCallback(**kwargs)
    cb._step_time_fn = fn
    return cb


def step_noise(rank: int, step: int) -> float:
    """A deterministic log-normal factor (about 5%) for ``(rank, step)``."""
    u = (zlib.crc32(f"{rank}:{step}".encode()) % 10_000 + 0.5) / 10_000
    return math.exp(0.05 * math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * u * 7.3))


def affine_step_time(rank: int, step: int, b: int) -> float:
    """Two ranks, rank 1 about 3x slower: ``(2 ms + b / rate) x`` :func:`step_noise`."""
    rate = 2000.0 if rank == 0 else 700.0  # samples/s
    return (0.002 + b / rate) * step_noise(rank, step)
