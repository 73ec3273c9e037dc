"""The report's headline: the run's measured throughput against the even split's estimate.

"Did rex help?" needs a baseline the run did not train. The controller's rank model gives
one: after every window it predicts the synchronous compute time of the even plan from
every rank's measured step times (``even_step_ms`` in the records: mean and 95% interval,
:meth:`~lightning_rex.core.decide.controller.Controller.even_split_estimate`). Each window
then takes, under the even split, its steps times that compute time plus the time the window
spent outside compute (the all-reduce, the optimizer, the loader: its wall time per step
minus its slowest rank's median compute), which does not depend on the split. The estimate
of the latest window at each global batch is used for every window at that global batch
(the model knows most there). The even split's throughput is the windows' samples over the
sum of those times; the speedup is the measured throughput over it, its interval from the
estimate's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Headline", "even_split_headline", "even_split_series"]


@dataclass(frozen=True)
class Headline:
    """The measured throughput, the even split's estimate, and their ratio.

    Attributes:
        measured: Samples per second over the windows with a wall time.
        even: The even split's estimated samples per second ``(mean, low, high)``.
        speedup: ``measured / even`` ``(mean, low, high)``.
        windows: The windows it covers.
    """

    measured: float
    even: tuple[float, float, float]
    speedup: tuple[float, float, float]
    windows: int

    def sentence(self) -> str:
        """The headline as one sentence."""
        rate, (ddp, low, high), (gain, slo, shi) = self.measured, self.even, self.speedup
        return (
            f"rex trained {rate:,.0f} samples/s; the even split (DDP's) would have trained "
            f"{ddp:,.0f} samples/s (95%: {low:,.0f}-{high:,.0f}) on the same ranks, estimated from "
            f"their measured step times: x{gain:.2f} (x{slo:.2f}-x{shi:.2f}) over {self.windows} "
            "windows"
        )


def _per_window(
    records: Sequence[Mapping[str, Any]],
) -> list[tuple[float, float, list[float]] | None]:
    """Each window's ``(samples, wall seconds, even-split seconds [mean, low, high])``."""
    latest: dict[int, list[float]] = {}
    for record in records:
        est = record.get("even_step_ms")
        if isinstance(est, list) and len(est) == 3:
            latest[sum(record["plan"])] = [float(v) / 1000.0 for v in est]
    out: list[tuple[float, float, list[float]] | None] = []
    for record in records:
        wall, samples = record.get("window_wall_s"), record.get("window_samples")
        est = latest.get(sum(record["plan"]))
        if not wall or not samples or est is None:
            out.append(None)
            continue
        steps = record["window"][1] - record["window"][0]
        outside = max(0.0, wall / steps - max(record["median_ms"]) / 1000.0)
        out.append((float(samples), float(wall), [steps * (t + outside) for t in est]))
    return out


def even_split_series(records: Sequence[Mapping[str, Any]]) -> list[list[float] | None]:
    """Each window's even-split throughput estimate, ``[mean, low, high]`` samples/s.

    Args:
        records: The run's window records, in order.

    Returns:
        One entry per record; None where it has no estimate or no wall time.
    """
    return [
        None if w is None else [w[0] / w[2][0], w[0] / w[2][2], w[0] / w[2][1]]
        for w in _per_window(records)
    ]


def even_split_headline(records: Sequence[Mapping[str, Any]]) -> Headline | None:
    """The headline of one run's records (see the module docstring).

    Args:
        records: The run's window records, in order.

    Returns:
        The headline, or None where the records carry no estimate or no wall times (the
        simulator's, or a log written before the estimate was recorded).
    """
    kept = [w for w in _per_window(records) if w is not None]
    samples = sum(w[0] for w in kept)
    measured_s = sum(w[1] for w in kept)
    even_s = [sum(w[2][i] for w in kept) for i in range(3)]
    if not kept or measured_s <= 0 or min(even_s) <= 0:
        return None
    measured = samples / measured_s
    even = (samples / even_s[0], samples / even_s[2], samples / even_s[1])  # slow end is low
    speedup = (measured / even[0], measured / even[2], measured / even[1])
    return Headline(measured, even, speedup, len(kept))
