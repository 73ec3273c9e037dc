"""A scenario's per-rank step times: curves, events, noise and the cost of a new shape.

:class:`ScenarioTimes` is what the engine calls once per step, in step order: every rank's
noise-free curve at its micro-batch (:meth:`Scenario.base_times
<lightning_rex.sim.scenarios.scenario.Scenario.base_times>`), times the active event factors, times
the noise factor (drawn ``window`` steps at a time from the seed's own generator, so the
noise of a seed does not depend on the policy), plus ``shape_change_s`` on a rank whose
micro-batch size is not among the last ``shape_cache`` distinct sizes it ran
(:class:`ShapeCache`). Profiling steps a policy asks for before training
(:meth:`ScenarioTimes.profile`) draw their noise from a second stream of the same seed, so
they do not shift the training noise either, and they share the shape cache: a size a
policy profiled is warm when training reaches it.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = ["ScenarioTimes", "ShapeCache"]


class ShapeCache:
    """Each rank's last ``size`` distinct micro-batch sizes (least recently used dropped).

    Args:
        initial: The sizes every rank starts warm with (the initial plan).
        size: How many distinct sizes a rank keeps (>= 1).
    """

    def __init__(self, initial: Sequence[int], size: int) -> None:
        if size < 1:
            raise ValueError(f"shape_cache must be >= 1, got {size}")
        self.size = int(size)
        self._last = np.asarray(initial, dtype=np.int64).copy()
        self._seen: list[OrderedDict[int, None]] = [OrderedDict({int(b): None}) for b in initial]

    def misses(self, plan: np.ndarray) -> np.ndarray:
        """Run one step under ``plan``: which ranks ran a size they no longer had cached.

        Args:
            plan: Per-rank sizes of this step, shape ``(N,)``.

        Returns:
            A boolean mask, shape ``(N,)``; the cache is updated.
        """
        plan = np.asarray(plan, dtype=np.int64)
        miss = np.zeros(plan.shape, dtype=bool)
        for rank in np.flatnonzero(plan != self._last):
            size, seen = int(plan[rank]), self._seen[rank]
            if size in seen:
                seen.move_to_end(size)
            else:
                miss[rank] = True
                seen[size] = None
                if len(seen) > self.size:
                    seen.popitem(last=False)
        self._last = plan.copy()
        return miss


class ScenarioTimes:
    """A scenario's noisy per-rank step times, asked for once per step, in order.

    Args:
        scenario: The scenario.
        seed: The noise seed.
        initial_plan: The plan in force before the first step (its sizes are warm).
    """

    def __init__(self, scenario: Scenario, seed: int, initial_plan: Sequence[int]) -> None:
        scen = self.s = scenario
        self.noise = scen.noise.process(scen.world_size, np.random.default_rng(int(seed)))
        self._profile_rng = np.random.default_rng([int(seed), 1])
        self.shapes = ShapeCache(initial_plan, scen.shape_cache)
        self.shape_change_s_total = 0.0
        self.shape_changes = 0
        self._chunk = -1
        self._factors_now = np.ones((scen.world_size, 1))
        self._events: dict[int, np.ndarray] = {}
        self._bounds = sorted({e.start for e in scen.events} | {e.end for e in scen.events})

    def _event_factors(self, step: int) -> np.ndarray:
        # events change factors only at their boundaries: cache per boundary interval
        key = bisect.bisect_right(self._bounds, step)
        if key not in self._events:
            self._events[key] = self.s.factors(step)
        return self._events[key]

    def _shape_cost(self, plan: np.ndarray) -> np.ndarray | float:
        miss = self.shapes.misses(plan)
        if not miss.any() or self.s.shape_change_s == 0.0:
            return 0.0
        self.shape_changes += int(miss.sum())
        self.shape_change_s_total += float(miss.sum()) * self.s.shape_change_s
        return np.where(miss, self.s.shape_change_s, 0.0)

    def __call__(self, step: int, plan: np.ndarray) -> np.ndarray:
        """Every rank's compute time at ``step`` under ``plan``.

        Args:
            step: The step (steps must come in order).
            plan: Per-rank sizes, shape ``(N,)``.

        Returns:
            Seconds, shape ``(N,)``.
        """
        window = self.s.window
        if step // window != self._chunk:
            self._chunk = step // window
            self._factors_now = self.noise.next_chunk(
                min(window, self.s.steps - self._chunk * window)
            )
        base = self.s.base_times(plan) * self._event_factors(step)
        return base * self._factors_now[:, step % window] + self._shape_cost(plan)

    def profile(self, sizes: np.ndarray) -> np.ndarray:
        """The times of profiling steps run before step 0 (events of step 0 apply).

        Args:
            sizes: Per-rank sizes of each profiling step, shape ``(P, N)``; they need not
                sum to the global batch.

        Returns:
            Seconds, shape ``(P, N)``.
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.size == 0:
            return np.zeros(sizes.shape)
        noise = self.s.noise.process(self.s.world_size, self._profile_rng)
        factors = noise.next_chunk(sizes.shape[0]).T
        out = np.empty(sizes.shape)
        for index, row in enumerate(sizes):
            out[index] = self.s.base_times(row) * self._event_factors(0) * factors[index]
            out[index] += self._shape_cost(row)
        return out
