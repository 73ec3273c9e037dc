"""Noise-free step-time curve shapes of a simulated GPU rank (numpy and scipy only).

Three shapes, all vectorised over the micro-batch size ``b``:

* :func:`affine_times`: ``overhead_s + max(b, knee) / rate``, optionally on a tile
  staircase (kernels that pad the batch to a multiple of ``tile``) with a share of the work
  in waves (kernels whose blocks fill the GPU's SMs ``wave`` samples at a time);
* :class:`TableCurve`: a measured curve, monotone (PCHIP) interpolation between points;
* :func:`memory_wall_factor`: a multiplier that grows quadratically as ``b`` nears the
  memory capacity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import numpy as np
import numpy.typing as npt
from scipy.interpolate import PchipInterpolator

__all__ = ["TableCurve", "affine_times", "memory_wall_factor"]


def _round_up(e: np.ndarray, unit: npt.ArrayLike | None) -> np.ndarray:
    """``e`` rounded up to a multiple of ``unit`` where ``unit > 0``."""
    if unit is None:
        return e
    t = np.asarray(unit, dtype=float)
    safe = np.where(t > 0, t, 1.0)
    return np.asarray(np.where(t > 0, np.ceil(e / safe) * safe, e))


def affine_times(
    b: npt.ArrayLike,
    *,
    overhead_s: npt.ArrayLike,
    rate: npt.ArrayLike,
    knee: npt.ArrayLike,
    tile: npt.ArrayLike | None = None,
    wave: npt.ArrayLike | None = None,
    wave_share: npt.ArrayLike = 0.0,
) -> npt.NDArray[np.float64]:
    """Affine step time, optionally quantised to a tile staircase and to waves.

    Without a tile the time is ``overhead_s + max(b, knee) / rate``. With a tile ``T`` the
    effective batch is rounded up to a multiple of ``T``:
    ``overhead_s + ceil(max(b, knee) / T) * T / rate``. With a wave ``W`` and a share ``f``,
    the share ``f`` of the work runs in whole waves of ``W`` samples (a kernel whose blocks
    fill every SM costs the same whether the last wave is full or not):
    ``overhead_s + ((1 - f) * ceil_T(e) + f * ceil_W(e)) / rate`` with ``e = max(b, knee)``,
    a second, coarser staircase. All arguments broadcast together.

    Args:
        b: Micro-batch sizes (integers), any shape.
        overhead_s: Fixed seconds per step (>= 0); scalar or broadcastable with ``b``.
        rate: Samples per second above the knee (> 0); scalar or broadcastable with ``b``.
        knee: Integer batch below which the GPU is under-filled and time stays flat;
            scalar or broadcastable with ``b``.
        tile: Positive integer tile size, or an array of them (e.g. one per rank) in which
            entries ``<= 0`` mean "no tile"; ``None`` means no tile anywhere. For integer
            ``b`` and ``knee`` a tile of 1 is the same as no tile.
        wave: Samples per wave, like ``tile`` (entries ``<= 0`` or ``None``: no waves).
        wave_share: The share of the work that runs in waves, in ``[0, 1]``; scalar or
            broadcastable with ``b``.

    Returns:
        The step times in seconds, float array of the broadcast shape.
    """
    base = np.maximum(np.asarray(b, dtype=float), np.asarray(knee, dtype=float))
    eff = _round_up(base, tile)
    if wave is not None:
        f = np.where(np.asarray(wave) > 0, np.asarray(wave_share, dtype=float), 0.0)
        eff = (1.0 - f) * eff + f * _round_up(base, wave)
    out = np.asarray(overhead_s, dtype=float) + eff / np.asarray(rate, dtype=float)
    return np.asarray(out, dtype=np.float64)


class TableCurve:
    """A measured step-time curve from points ``[[b, seconds], ...]``.

    Between the points the curve is scipy's monotone piecewise-cubic (PCHIP) interpolant,
    which never overshoots the data: monotone data give a monotone curve and a flat stretch
    stays flat. Below the first point the curve is flat at the first point's time. Above
    the last point it is linear from the last two points, never below the smallest measured
    time.

    Args:
        points: At least two ``(b, seconds)`` pairs of finite numbers, ``b`` strictly
            increasing and ``>= 1``, times ``> 0``.

    Raises:
        ValueError: If ``points`` breaks any of the rules above; the message names which.
    """

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        pts = list(points)
        if len(pts) < 2:
            raise ValueError(f"a table curve needs at least 2 points, got {len(pts)}")
        bs: list[float] = []
        ts: list[float] = []
        for i, p in enumerate(pts):
            if (
                isinstance(p, (str, bytes))
                or not isinstance(p, Sequence | np.ndarray)
                or len(p) != 2
            ):
                raise ValueError(f"point {i} must be a pair [b, seconds], got {p!r}")
            if any(isinstance(v, bool) or not isinstance(v, Real) for v in p):
                raise ValueError(f"point {i} must be a pair of numbers, got {p!r}")
            b, t = float(p[0]), float(p[1])
            if not (math.isfinite(b) and b >= 1):
                raise ValueError(f"point {i}: b must be finite and >= 1, got {b:g}")
            if bs and b <= bs[-1]:
                raise ValueError(
                    f"point {i}: b values must be strictly increasing, got {b:g} after {bs[-1]:g}"
                )
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"point {i}: time must be finite and > 0 seconds, got {t:g}")
            bs.append(b)
            ts.append(t)
        self._b = np.array(bs)
        self._t = np.array(ts)
        self._pchip = PchipInterpolator(self._b, self._t, extrapolate=False)
        self._slope = (ts[-1] - ts[-2]) / (bs[-1] - bs[-2])
        self._floor = min(ts)

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        """The ``(b, seconds)`` points as plain floats, ready for JSON."""
        return tuple((float(b), float(t)) for b, t in zip(self._b, self._t))

    def __call__(self, b: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Step time for micro-batch sizes ``b``.

        Args:
            b: Micro-batch sizes, scalar or any shape.

        Returns:
            The step times in seconds, float array of the shape of ``b``.
        """
        x = np.asarray(b, dtype=float)
        inside = self._pchip(np.clip(x, self._b[0], self._b[-1]))
        above = np.maximum(self._t[-1] + self._slope * (x - self._b[-1]), self._floor)
        return np.asarray(np.where(x > self._b[-1], above, inside), dtype=np.float64)

    def __repr__(self) -> str:
        return f"TableCurve({[list(p) for p in self.points]!r})"


def memory_wall_factor(
    b: npt.ArrayLike,
    *,
    mem_cap: npt.ArrayLike,
    start: npt.ArrayLike = 0.8,
    factor: npt.ArrayLike = 2.0,
) -> npt.NDArray[np.float64]:
    """Step-time multiplier for a micro-batch nearing the memory capacity.

    The factor is 1 for ``b <= start * mem_cap``; above that it is
    ``1 + (factor - 1) * ((b / mem_cap - start) / (1 - start)) ** 2``, growing quadratically
    (faster than linearly) and reaching ``factor`` at ``b == mem_cap`` (and continuing on the
    same parabola beyond it). All arguments broadcast together.

    Args:
        b: Micro-batch sizes, any shape.
        mem_cap: The largest micro-batch that fits (>= 1); scalar or broadcastable.
        start: Fraction of ``mem_cap`` where the slowdown begins, ``0 < start < 1``.
        factor: The multiplier reached at ``mem_cap`` (>= 1).

    Returns:
        The multipliers (>= 1), float array of the broadcast shape.

    Raises:
        ValueError: If ``mem_cap``, ``start`` or ``factor`` is out of range (or NaN).
    """
    cap = np.asarray(mem_cap, dtype=float)
    s = np.asarray(start, dtype=float)
    f = np.asarray(factor, dtype=float)
    if not np.all(cap >= 1):
        raise ValueError(f"mem_cap must be >= 1, got {mem_cap!r}")
    if not np.all((s > 0) & (s < 1)):
        raise ValueError(f"start must be in (0, 1), got {start!r}")
    if not np.all(f >= 1):
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    u = np.maximum((np.asarray(b, dtype=float) / cap - s) / (1.0 - s), 0.0)
    return np.asarray(1.0 + (f - 1.0) * u**2, dtype=np.float64)
