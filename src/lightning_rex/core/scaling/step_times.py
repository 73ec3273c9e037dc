"""What a step at a global batch takes, measured and predicted, as goodput sees it.

Goodput is samples per second of *wall clock*: a step lasts its slowest rank's compute plus
what every step spends outside it (the all-reduce, the loader, the optimizer), which does
not grow with the batch and so favours larger ones. The window loop gives each window's
wall-clock time (:attr:`~lightning_rex.core.window.Window.overhead_s`); the median of the
last 16 windows' overheads is added to the measured and the predicted step times alike.

Goodput is a rate: the one-off steps of a change (a new shape's autotuning, a step more
than twice its window's median) are left out of the measured step times
(:func:`steady_times`). A predicted step is the rank model's per-rank times with the wait
for the slowest noisy rank (:class:`~lightning_rex.core.scaling.straggler.StragglerWait`)
and the overhead; predictions are kept until the rank model next takes a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.plans.proposal import best_plans_for
from lightning_rex.core.saved import StateError, float_list, matrix
from lightning_rex.core.saved import field as state_field
from lightning_rex.core.scaling.straggler import StragglerWait
from lightning_rex.core.window import Window

__all__ = ["StepTimes", "steady_times"]

_OVERHEAD_WINDOWS = 16
"""Windows whose per-step overhead (wall clock minus compute) is kept."""
_ONE_OFF = 2.0
"""A step slower than this many times its window's median is a one-off (module docstring)."""


def steady_times(step_max: np.ndarray) -> np.ndarray:
    """A window's step times without its one-off steps.

    The first step at a new micro-batch size pays for the new shape once (cuDNN autotuning,
    recompiles: 0.5 s against a 0.04 s step), and a step of a plan change can take a data
    loader's refill: costs of the change, not the rate of the batch, which is what goodput
    compares. A step more than twice the window's median is left out (all of them when
    fewer than two would remain).

    Args:
        step_max: The window's per-step times of the slowest rank, seconds.
    """
    times = np.asarray(step_max, dtype=np.float64)
    keep = times[times <= _ONE_OFF * float(np.median(times))]
    return keep if keep.size >= 2 else times


class StepTimes:
    """A run's measured and predicted step times, for the global batch's goodput.

    Args:
        controller: The controller whose rank model and size bounds predict a plan's step.

    Attributes:
        wait: The wait for the slowest noisy rank, estimated from the windows' per-rank
            times and added to every prediction of a step.
    """

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.wait = StragglerWait()
        self._overheads: list[float] = []
        self._predicted: dict[int, float] = {}
        self._predicted_plans: dict[tuple[int, ...], float] = {}

    @property
    def overhead_s(self) -> float:
        """Seconds per step outside the ranks' compute: the median of the recent windows'."""
        return float(np.median(self._overheads)) if self._overheads else 0.0

    def measured(self, window: Window, first: bool = False) -> np.ndarray:
        """The window's synchronous step times as goodput sees them (module docstring).

        The window's overhead and per-rank times also update :attr:`overhead_s` and
        :attr:`wait`.

        Args:
            window: The window.
            first: It is a new batch's first window: its first step (the new shapes' one-off
                cost) is left out.
        """
        if window.overhead_s is not None:
            self._overheads = [*self._overheads, window.overhead_s][-_OVERHEAD_WINDOWS:]
        self.wait.observe(window.times)
        step_max = window.step_max
        steady = steady_times(step_max[1:] if first and step_max.size >= 3 else step_max)
        return steady + self.overhead_s

    def predict(self, batch: int) -> float:
        """The rank model's step time of the best plan for ``batch``, or inf to rule it out.

        Inf when the size bounds (memory caps measured at run time) cannot hold ``batch``.

        Args:
            batch: The global batch.
        """
        if batch not in self._predicted:
            self.predict_many([batch])
        return self._predicted[batch]

    def predict_plan(self, plan: Sequence[int]) -> float:
        """The rank model's step time of ``plan``, the straggler wait and overhead included.

        Args:
            plan: Per-rank micro-batch sizes.
        """
        key = tuple(int(size) for size in plan)
        if key not in self._predicted_plans:
            rank_s = self.controller.model.predict(key)
            self._predicted_plans[key] = self.wait.step_time(rank_s, self.overhead_s)
        return self._predicted_plans[key]

    def predict_many(self, batches: Sequence[int]) -> None:
        """Predict the step times of several batches on one posterior of the size grid.

        Args:
            batches: Global batches (those already predicted are skipped).
        """
        ctl = self.controller
        want, bounds = [], []
        for batch in dict.fromkeys(int(x) for x in batches):
            if batch in self._predicted:
                continue
            try:
                bounds.append(ctl.bounds.arrays(batch, ctl.world_size))
            except ValueError:
                self._predicted[batch] = math.inf
            else:
                want.append(batch)
        for batch, (_, rank_s) in zip(want, best_plans_for(ctl.model, bounds, want)):
            self._predicted[batch] = self.wait.step_time(rank_s, self.overhead_s)

    def better_split(
        self, plan: Sequence[int], min_gain: float
    ) -> tuple[tuple[int, ...], float, float] | None:
        """The model's best plan for ``plan``'s batch, when predicted ``min_gain`` faster.

        What corrects a new batch's extrapolated plan once the rank model has run its sizes
        (rex's trials, and the ``pollux-rex`` peer's batches).

        Args:
            plan: The plan in force.
            min_gain: The least predicted speedup of the step (0.02: 2%).

        Returns:
            ``(best plan, predicted step of plan, predicted step of best)``, or None when the
            best plan is ``plan``, is predicted less than ``min_gain`` faster, or the size
            bounds cannot hold the batch now.
        """
        try:
            best, _ = self.controller.predict_step_time(sum(plan))
        except ValueError:
            return None
        now, then = self.predict_plan(plan), self.predict_plan(best)
        if tuple(best) == tuple(plan) or now < then * (1.0 + min_gain):
            return None
        return tuple(best), now, then

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the recent windows' overheads and the straggler wait's scales."""
        return {"overheads": list(self._overheads), "wait": self.wait.state_dict()}

    @staticmethod
    def check_state(d: Any, world_size: int, name: str = "steps") -> dict[str, Any]:
        """Check a saved state without loading it.

        Args:
            d: A dictionary from :meth:`state_dict`.
            world_size: The number of ranks (the length of each noise-scale row).
            name: Its dotted name, for errors.

        Returns:
            The state, normalised.

        Raises:
            StateError: Naming the field: overheads that are not finite seconds >= 0, or
                noise scales that are not a finite number >= 0 per rank.
        """
        overheads = float_list(state_field(d, "overheads", name), f"{name}.overheads")
        if any(o < 0 for o in overheads):
            raise StateError(f"{name}.overheads", "must be seconds >= 0")
        wait = matrix(state_field(d, "wait", name), f"{name}.wait", None, world_size)
        if any(x < 0 for row in wait for x in row):
            raise StateError(f"{name}.wait", "must be noise scales >= 0")
        return {
            "overheads": overheads[-_OVERHEAD_WINDOWS:],
            "wait": wait,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, checked by :meth:`check_state`.

        Args:
            d: The checked state.
        """
        self._overheads = list(d["overheads"])
        self.wait.load_state_dict(d["wait"])
        self.forget()

    def forget(self) -> None:
        """The rank model took a window (or its bounds changed): the predictions are stale."""
        self._predicted, self._predicted_plans = {}, {}
