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
    units = np.asarray(unit, dtype=float)
    safe = np.where(units > 0, units, 1.0)
    return np.asarray(np.where(units > 0, np.ceil(e / safe) * safe, e))


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
        share = np.where(np.asarray(wave) > 0, np.asarray(wave_share, dtype=float), 0.0)
        eff = (1.0 - share) * eff + share * _round_up(base, wave)
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
        sizes: list[float] = []
        times: list[float] = []
        for index, point in enumerate(pts):
            if (
                isinstance(point, (str, bytes))
                or not isinstance(point, Sequence | np.ndarray)
                or len(point) != 2
            ):
                raise ValueError(f"point {index} must be a pair [b, seconds], got {point!r}")
            if any(isinstance(v, bool) or not isinstance(v, Real) for v in point):
                raise ValueError(f"point {index} must be a pair of numbers, got {point!r}")
            size, seconds = float(point[0]), float(point[1])
            if not (math.isfinite(size) and size >= 1):
                raise ValueError(f"point {index}: b must be finite and >= 1, got {size:g}")
            if sizes and size <= sizes[-1]:
                raise ValueError(
                    f"point {index}: b values must be strictly increasing, "
                    f"got {size:g} after {sizes[-1]:g}"
                )
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(
                    f"point {index}: time must be finite and > 0 seconds, got {seconds:g}"
                )
            sizes.append(size)
            times.append(seconds)
        self._b = np.array(sizes)
        self._t = np.array(times)
        self._pchip = PchipInterpolator(self._b, self._t, extrapolate=False)
        self._slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        self._floor = min(times)

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
        sizes = np.asarray(b, dtype=float)
        inside = self._pchip(np.clip(sizes, self._b[0], self._b[-1]))
        above = np.maximum(self._t[-1] + self._slope * (sizes - self._b[-1]), self._floor)
        return np.asarray(np.where(sizes > self._b[-1], above, inside), dtype=np.float64)

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
    starts = np.asarray(start, dtype=float)
    factors = np.asarray(factor, dtype=float)
    if not np.all(cap >= 1):
        raise ValueError(f"mem_cap must be >= 1, got {mem_cap!r}")
    if not np.all((starts > 0) & (starts < 1)):
        raise ValueError(f"start must be in (0, 1), got {start!r}")
    if not np.all(factors >= 1):
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    excess = np.maximum((np.asarray(b, dtype=float) / cap - starts) / (1.0 - starts), 0.0)
    return np.asarray(1.0 + (factors - 1.0) * excess**2, dtype=np.float64)
