"""Pollux's batch choice with rex's plan controller: the peer that isolates the batch choice.

``pollux-rex`` runs the Pollux agent of :mod:`~lightning_rex.sim.policies.pollux` unchanged
(its noise scale, its throughput model fitted to the measured times, a goodput-optimal batch
re-chosen every 30 s of training) and splits every batch it picks with the plan controller
rex trains with (:class:`~lightning_rex.core.decide.controller.Controller`, built by
:func:`~lightning_rex.core.build.build_decider` as training builds it). The controller
measures the ranks, re-splits the batch in force when its tests say so, and gives each new
batch the plan its rank model predicts best (:meth:`~lightning_rex.core.decide.controller.
Controller.predict_step_time`), as it gives rex's own new batches.

So rex and ``pollux-rex`` share the split and everything the split costs (learning the rank
times, new micro-batch shapes, plans extrapolated to sizes not yet run); they differ only in
how the global batch is chosen: rex's validated, priced BoTorch choice against Pollux's
model-optimal choice without a test. ``pollux-split`` (the oracle's split, given for free)
answers another question: how close Pollux's choice gets once the split is perfect.

The agent's choice reaches the loop as the controller's: at the first look after a period
ends with a new batch (the loop gathers every third of the controller's window, as for rex),
the controller moves to it (:meth:`~lightning_rex.core.decide.controller.Controller.
set_global_batch`, dropping any re-split in flight; a rollback the controller decides there
lands first, and the move waits a window) and the plan is applied at a step boundary on every
rank, like any plan. Pollux itself applies a choice at once; the wait for the window (a few
steps every 30 s) is what rex's own changes wait too. The new batch's plan is corrected as
rex corrects its own trials' (``ScalingDecider._trial_resplit``): at most once in the new
batch's first window (rex's trial length), at a look where the rank model, having taken the
new sizes, predicts the best plan for the batch ``min_gain`` faster than the extrapolated
one. A move the loop does not apply (``decline``) is undone, and the agent chooses again at
its next period.

What the agent's throughput model is fitted to is what it measures here: the steps of every
plan the controller ran at a batch, the first, extrapolated ones included (``pollux-split``
runs one plan per batch, the oracle's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.plan import Plan, even_plan
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.scaling.step_times import StepTimes
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window import Window
from lightning_rex.driver.protocols import Decider
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.builtin import RexPolicy
from lightning_rex.sim.policies.pollux import PolluxPolicy

__all__ = ["PolluxRexPolicy"]


class PolluxRexPolicy(PolluxPolicy):
    """Pollux's batch choice, each batch split by rex's plan controller (module docstring).

    Args:
        settings: The controller's decision parameters; the defaults training uses when None.
    """

    def __init__(self, settings: DecisionSettings | None = None) -> None:
        super().__init__(split=self._model_plan)
        self.name = "pollux-rex"
        self._rex = RexPolicy(settings=settings)
        self.pending: int | None = None

    def reset(self, info: PolicyInfo) -> None:
        """Build the controller as rex's (over the workload's batch range) and start Pollux.

        Args:
            info: The run; ``batch_range`` must be set.

        Raises:
            ValueError: Without a batch range.
        """
        if info.batch_range is None:
            raise ValueError("the pollux-rex policy needs a batch range (a workload scenario)")
        self._rex.reset(info)
        built = self._rex.decider()
        if not isinstance(built, ScalingDecider):
            raise TypeError(f"expected rex's scaling decider, got {type(built).__name__}")
        # the controller of rex's scaling decider: built for the whole batch range
        self.controller: Controller = built.controller
        self.min_gain = built.scaler.config.min_gain
        self.trial_steps = built.window_steps
        self.pending = None
        super().reset(info)
        self.start_plan = self._rex.start_plan

    def looks_for(self, window: int) -> int:
        """The controller's looks per window (the loop gathers as for rex).

        Args:
            window: Steps per window.

        Returns:
            Looks per window.
        """
        return self._rex.looks_for(window)

    def _model_plan(self, batch: int) -> Plan:
        """The controller's best plan for ``batch`` (the even plan before its first window)."""
        try:
            return self.controller.predict_step_time(int(batch))[0]
        except (RuntimeError, ValueError):
            return even_plan(int(batch), self.info.world_size)

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Record the step's times; a batch chosen at a period's end waits for the window.

        Args:
            step: The step just run.
            times: Every rank's compute time of the step.
            plan: The plan it ran under.

        Returns:
            None: the controller applies the batch (:meth:`decider`).
        """
        best = self.rechoose(times, plan)
        if best is not None:  # a period ended: the latest choice replaces an earlier one
            self.pending = None if best == self.controller.global_batch else best
        return None

    def _passes(self, batch: int) -> int:
        # the controller's plan for a batch changes as it learns: not cached
        caps = self.caps or ()
        plan = self.plan_for(batch)
        return max(-(-m // c) if c is not None else 1 for m, c in zip(plan, caps))

    def decider(self) -> Decider:
        """The controller, with the agent's batch moves, as the loop's decider.

        Returns:
            The decider.
        """
        return _PolluxRexDecider(self)


class _PolluxRexDecider:
    """The controller's decisions, and the agent's pending batch moved to at a window."""

    def __init__(self, policy: PolluxRexPolicy) -> None:
        self.policy = policy
        self.controller = policy.controller
        self.steps = StepTimes(policy.controller)
        # a move not yet measured: (the batch and plan before it), undone by a decline
        self._move: tuple[int, Plan] | None = None
        # the new batch's plan before its one re-split, while that re-split is pending
        self._resplit_from: Plan | None = None
        # steps measured at a new batch in which its plan may still be re-split (once)
        self._trial_left = 0

    def observe(self, window: Window) -> Decision:
        c = self.controller
        measured = float(window.medians.max())
        moving = self._move is not None or self._resplit_from is not None
        if sum(window.plan) != c.global_batch or (moving and window.plan != c.plan):
            return self._hold(window, "new global batch (or its re-split) not yet in force")
        self._resplit_from = None
        decision = c.observe(window)
        self.steps.forget()
        self.steps.measured(window)  # the overhead and straggler wait of the predictions
        self._move = None  # measured: the move landed
        if self._trial_left > 0:  # a new batch's trial (rex's length), on its first plan
            self._trial_left -= int(window.step_max.size)
            if decision.kind != "hold":
                # as in rex's trials: the controller's own re-split of the first plan (its
                # cold start's, on the guess) gives way to the one re-split below
                c.decline()
                decision = self._hold(window, f"{decision.reason}: declined in the trial")
            resplit = self._resplit(window, measured)
            if resplit is not None:
                self._trial_left = 0
                return resplit
            return decision
        want, old = self.policy.pending, c.global_batch
        if want is None or want == old or decision.kind == "rollback":
            return decision  # (a rollback lands first: the move waits a window)
        try:
            plan, predicted = c.predict_step_time(want)
        except (RuntimeError, ValueError):  # no window yet, or the bounds moved: later
            return decision
        old_plan = c.plan
        if decision.kind != "hold":
            c.decline()  # the batch comes first, with a split of its own
        try:
            c.set_global_batch(want, plan, guess=True)
        except ValueError as err:
            self.policy.pending = None  # the agent chooses again at its next period
            return self._hold(window, f"global batch {old} -> {want}: {err}")
        self.policy.pending = None
        self._move, self._trial_left = (old, old_plan), self.policy.trial_steps
        return Decision(
            "propose",
            plan,
            predicted,
            measured,
            None,
            f"global batch {old} -> {want}: Pollux's goodput-optimal batch"
            f" (noise scale {self.policy.phi:.4g})",
            window.step_end,
        )

    def _resplit(self, window: Window, measured: float) -> Decision | None:
        """The new batch's plan, re-split once on its first measured sizes (as rex's trials)."""
        batch = sum(window.plan)
        better = self.steps.better_split(window.plan, self.policy.min_gain)
        if better is None:
            return None
        plan, now, then = better
        self.controller.set_global_batch(batch, plan)
        self._resplit_from = window.plan
        return Decision(
            "propose",
            plan,
            then,
            measured,
            None,
            f"global batch {batch}: re-split on its first measured sizes (step predicted"
            f" x{now / then:.3f} faster)",
            window.step_end,
        )

    @staticmethod
    def _hold(window: Window, reason: str) -> Decision:
        measured = float(window.medians.max())
        return Decision("hold", None, None, measured, None, reason, window.step_end)

    def decline(self) -> None:
        """The last decision will not be applied: a move or its re-split is undone."""
        c = self.controller
        if self._resplit_from is not None:
            c.set_global_batch(c.global_batch, self._resplit_from)
            self._resplit_from = None
        elif self._move is not None:
            old, old_plan = self._move
            self._move, self._trial_left = None, 0
            c.set_global_batch(old, old_plan)
        else:
            c.decline()

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        self.controller.set_bounds(min_size, max_sizes)
        self.steps.forget()

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        self.controller.set_pass_caps(pass_caps)
        self.steps.forget()

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.controller.load_state_dict(d)

    def rank_model_summary(self) -> dict[str, list[float]]:
        return self.controller.rank_model_summary()

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        return self.controller.even_split_estimate()
