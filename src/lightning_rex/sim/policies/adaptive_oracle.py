"""The adaptive oracle: the limit of the goodput problem, for workload scenarios.

A global batch policy that knows what no real policy can: the workload's true gradient
statistics at the current progress, and the scenario's noise-free step-time curves. At every
step it scores a geometric grid of global batches over the workload's range (and ``B0``) by
their goodput, progress per second::

    goodput(B) = B * E(B) / T(B),   E(B) = (phi + b0) / (phi + B),
    T(B) = max_r t_r(plan*(B)_r) + comm,

where ``phi`` is the true noise scale at the progress reached and ``plan*(B)`` is the oracle's
minimax plan for ``B`` (:class:`~lightning_rex.sim.policies.builtin.OraclePolicy`) on the curves at
step 0 (the workload presets have no events; a scenario's events are not re-planned for).
It moves to the best batch when that pays for the shape change it costs: when the seconds
it saves over the rest of the run at today's rates, ``P_left * (1 / goodput(B_now) -
1 / goodput(B*))``, exceed the scenario's ``shape_change_s``. The remaining progress is known
exactly; the rates ahead are taken as today's, so the rule is greedy, not a proof of the
optimum. Its grid holds the hindsight scan's (:data:`GRID`), so no fixed batch scores
better at the start. It is the strongest policy the simulator has, a limit in practice for
any batch policy on the scenario: it knows the true statistics and curves, where a real
policy estimates them from noisy steps.
"""

from __future__ import annotations

import numpy as np

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.window import Window
from lightning_rex.sim.policies.base import PolicyBase, PolicyInfo
from lightning_rex.sim.policies.builtin import oracle_plan, oracle_step_s
from lightning_rex.sim.scenarios.scenario import Scenario
from lightning_rex.sim.scenarios.workload import Workload

__all__ = ["GRID", "AdaptiveOraclePolicy"]

GRID = 94
"""Global batches the oracle scores, geometric over the workload's range (with ``B0``):
``3 x 31 + 1``, so that every third is a point of the hindsight scan's 32
(:func:`~lightning_rex.sim.engine.goodput.hindsight_batch`)."""


class AdaptiveOraclePolicy(PolicyBase):
    """The goodput-optimal batch and the minimax plan for it, at every step (module docstring).

    Args:
        scenario: The workload scenario being run.
        grid: How many global batches to score.

    Raises:
        ValueError: For a scenario without a workload, or a grid of fewer than 2 batches.
    """

    name = "adaptive-oracle"

    def __init__(self, scenario: Scenario, grid: int = GRID) -> None:
        if scenario.workload is None:
            raise ValueError(
                f"scenario {scenario.name!r} has no workload: the adaptive oracle needs one"
            )
        if grid < 2:
            raise ValueError(f"grid must be >= 2, got {grid}")
        self.scenario = scenario
        self.workload: Workload = scenario.workload
        self.grid = int(grid)

    def reset(self, info: PolicyInfo) -> None:
        """Tabulate every grid batch's minimax plan and step time; pick the first batch.

        Args:
            info: The run (its ``global_batch`` is ``B0``).
        """
        self.info = info
        scenario, workload = self.scenario, self.workload
        low, high = workload.batch_range
        grid = np.geomspace(low, high, self.grid).round().astype(np.int64)
        self.batches = np.unique(np.r_[grid, info.global_batch])
        self.plans: list[Plan] = [oracle_plan(scenario, int(b)) for b in self.batches]
        self.step_s = oracle_step_s(scenario, self.plans)
        self.progress = 0.0
        self.rollbacks = 0
        self.current = self._best()
        self.start_plan = self.plans[self.current]

    def goodput(self, progress: float) -> np.ndarray:
        """Every grid batch's progress per second at ``progress`` (module docstring).

        Args:
            progress: The progress reached.

        Returns:
            Shape ``(len(batches),)``.
        """
        return self.workload.goodput(self.batches, self.step_s, progress)

    def _best(self) -> int:
        return int(np.argmax(self.goodput(self.progress)))

    @property
    def batch(self) -> int:
        """The global batch in force."""
        return int(self.batches[self.current])

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Count the step's true progress; move to the best batch when it pays.

        Args:
            step: The step just run.
            times: Every rank's compute time of the step (unused: the oracle knows the curves).
            plan: The plan it ran under.

        Returns:
            The plan of the new batch, or None.
        """
        self.progress += self.workload.step_progress(sum(plan), self.progress)
        rate = self.goodput(self.progress)
        best = int(np.argmax(rate))
        left = max(self.workload.target_progress - self.progress, 0.0)
        saved = left * (1.0 / rate[self.current] - 1.0 / rate[best])
        if best == self.current or saved <= self.scenario.shape_change_s:
            return None
        self.current = best
        return self.plans[best]

    def observe(self, window: Window) -> Plan | None:
        """The oracle acts between steps (:meth:`observe_step`), not at windows."""
        return None
