"""The controller with global batch scaling on top: one decider for the window loop.

:class:`ScalingDecider` is what the window loop drives when global batch scaling is on
(``RexCallback(global_batch=GlobalBatchScaling(...))``). Every window goes to the
:class:`~lightning_rex.core.decide.controller.Controller` first, which splits the batch in force.
While the controller is steady and has nothing to do, the window's step times are also
evidence for the :class:`~lightning_rex.core.scaling.batch_scaling.BatchScaler`. When that proposes
another global batch, the decision is a ``propose`` whose plan sums to the new batch: the
controller's model gives the plan, and the loop applies it like any plan, at a step boundary
on every rank. The next ``window_steps`` steps under the new batch are then validated for a
significant goodput gain (:meth:`~lightning_rex.core.scaling.batch_scaling.BatchScaler.validate`). A
gain is kept (``accept``). Anything else is rolled back to the old batch and plan
(``rollback``).

A re-split of the batch in force, just proposed or under validation, gives way to a large
predicted gain of the batch (``_LARGE_GAIN`` times the re-split's own predicted speedup):
the re-split is dropped, the new batch comes with a split of its own, and a rollback returns
to the plan before the re-split. At the start this is what matters: the controller's first
split of ``B0`` would otherwise hold the batch at ``B0`` through its whole validation. A
proposed re-split's predicted speedup is credited to the old batch's baseline, so that the
new batch is kept only if it beats the old one split as proposed.

A new batch starts on the plan the rank model extrapolates to its sizes, which can be well
off (10-24% slower than the best split on the simulator's 64-rank presets): a true gain of
the batch would then be measured as a loss and rolled back. Once per trial, after the rank
model has taken a window at the new sizes, the trial is re-split when the model predicts the
best plan for the new batch ``min_gain`` faster than the trial's plan (``propose``), and the
trial restarts on the new plan (:meth:`ScalingDecider._trial_resplit`). The new batch's plan
is handed to the controller as a guess (``set_global_batch(..., guess=True)``): as for the
initial plan, its first window (or a clear early look) is enough, so the rank model takes the
new sizes after 10-20 steps, not a whole window.

Per-step gradient norms reach the scaler through :meth:`ScalingDecider.add_gradient_norms`,
from the training thread, while windows may be decided in the loop's background thread. The
training thread only appends to a queue under its own short lock (it must never wait for a
decision); the decision takes the queue into the noise averages first.

The step times the scaler models and validates on (wall clock, without a change's one-off
steps, measured and predicted) come from :mod:`~lightning_rex.core.scaling.step_times`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.decide.pricing import trial_min_gain
from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.scaling.batch_scaling import BatchScaler
from lightning_rex.core.scaling.saved_state import check_scaling_state
from lightning_rex.core.scaling.step_times import StepTimes
from lightning_rex.core.window import Window

__all__ = ["ScalingDecider"]

_BASELINE_STEPS = 60
"""Steps at the old batch kept as a change's baseline."""


_LARGE_GAIN = 1.25
"""A predicted goodput gain large enough to propose on a third of a window of baseline."""
_LOOKS = 3
"""Looks at a new batch's trial: it may be kept after each third of a window."""


def _early_confidence(d: ScalingDecider) -> float:
    """The confidence of a look before the trial's whole window (Bonferroni over the looks)."""
    return 1.0 - (1.0 - d.scaler.config.confidence) / _LOOKS


def _split_credit(d: Decision, overhead_s: float) -> float:
    """A proposed re-split's predicted speedup of the whole step (1 when none is predicted).

    The compute the controller predicts and measures, plus the step's overhead outside it.
    """
    if d.predicted_step_s is None or d.measured_step_s is None:
        return 1.0
    return max(1.0, (d.measured_step_s + overhead_s) / (d.predicted_step_s + overhead_s))


class ScalingDecider:
    """A controller and a global batch scaler behind one ``observe``.

    Args:
        controller: The controller (built with ``max_global_batch``).
        scaler: The global batch scaler.
        window_steps: Steps under a new global batch before it is validated.

    Attributes:
        steps: The measured and predicted step times
            (:class:`~lightning_rex.core.scaling.step_times.StepTimes`).
    """

    def __init__(self, controller: Controller, scaler: BatchScaler, window_steps: int) -> None:
        self.controller = controller
        self.scaler = scaler
        self.window_steps = int(window_steps)
        self._lock = threading.Lock()
        self._norms_lock = threading.Lock()
        self._norms: list[tuple[float, float, tuple[int, ...]]] = []
        self._recent: list[float] = []
        # (old batch, old plan, baseline times) while a new batch is validated, and its times
        self._change: tuple[int, Plan, list[float]] | None = None
        self._trial: list[float] = []
        # the trial was re-split (once per trial), and the trial plan it left while pending
        self._resplit = False
        self._resplit_from: Plan | None = None
        self.steps = StepTimes(controller)
        self._elapsed_s = 0.0
        self._done: float | None = None

    @property
    def plan(self) -> Plan:
        """The plan in force (or about to be)."""
        return self.controller.plan

    @property
    def global_batch(self) -> int:
        """The global batch in force (or about to be)."""
        return self.controller.global_batch

    def add_gradient_norms(
        self, weighted_local_sq: float, global_sq: float, sizes: Sequence[int]
    ) -> bool:
        """One step's gradient norms for the noise scale (``NoiseScale.update``).

        Args:
            weighted_local_sq: ``sum_r (b_r / B) |g_r|^2`` of the mean gradients.
            global_sq: ``|g|^2`` of the global mean gradient.
            sizes: The step's plan.

        Returns:
            False when the step will be skipped (non-finite norms).
        """
        finite = math.isfinite(weighted_local_sq) and math.isfinite(global_sq)
        with self._norms_lock:
            self._norms.append((weighted_local_sq, global_sq, tuple(sizes)))
        return finite

    def _take_norms(self) -> None:
        with self._norms_lock:
            norms, self._norms = self._norms, []
        for local_sq, global_sq, sizes in norms:
            self.scaler.noise.update(local_sq, global_sq, sizes)

    def observe(self, window: Window) -> Decision:
        """Take one window (or segment) and decide.

        Args:
            window: The window.

        Returns:
            The :class:`~lightning_rex.core.decision.Decision`.
        """
        with self._lock:
            self._take_norms()
            return self._observe(window)

    def _observe(self, window: Window) -> Decision:
        batch = sum(window.plan)
        self._elapsed_s += (
            float(window.wall_s) if window.wall_s is not None else float(window.step_max.sum())
        )
        measured = float(window.medians.max())

        def hold(reason: str) -> Decision:
            return Decision("hold", None, None, measured, None, reason, window.step_end)

        if self._change is not None:
            old, old_plan, base = self._change
            if batch == old or window.plan != self.controller.plan:
                return hold("new global batch (or its re-split) not yet in force")
            self._resplit_from = None
            # the new batch's windows teach both models: the rank times at the new sizes (a
            # re-split the controller would propose now is declined: the batch comes first)
            # and the goodput residual at the new batch
            decided = self.controller.observe(window)
            self.steps.forget()
            if decided.kind != "hold":
                self.controller.decline()
            # the first step at the new batch pays its new shapes once (cuDNN autotuning,
            # recompiles): a one-off, not the new batch's rate, so it is left out; the trial's
            # times carry the per-step overhead as the baseline's and the predictions do
            times = self.steps.measured(window, first=not self._trial)
            if self.controller.model.n_obs > 0:
                self.scaler.record(batch, times, self.steps.predict_plan(window.plan), window.plan)
            trial_split = self._trial_resplit(window, old, measured)
            if trial_split is not None:
                return trial_split
            self._trial += times.tolist()
            if len(self._trial) < self.window_steps:
                # a sequential look: a gain already shown at a stricter confidence is kept
                # now; anything else is measured on to the whole window
                early = self.scaler.validate(
                    old, batch, np.asarray(base), np.asarray(self._trial), _early_confidence(self)
                )
                if not (early.keep and len(self._trial) >= max(2, self.window_steps // 3)):
                    return hold(
                        f"global batch {old} -> {batch}: measuring ({len(self._trial)} of"
                        f" {self.window_steps} steps)"
                    )
            verdict = self.scaler.validate(old, batch, np.asarray(base), np.asarray(self._trial))
            self._change, self._trial, self._recent, self._resplit = None, [], [], False
            what = (
                f"global batch {old} -> {batch}: goodput x{verdict.gain:.3f}"
                f" (lower bound x{verdict.lower:.3f})"
            )
            if verdict.frozen:
                what += (
                    f"; the noise estimate is frozen ({self.scaler.noise.stale} steps without"
                    " finite gradient norms)"
                )
            if not verdict.keep:
                try:
                    self.controller.set_global_batch(old, old_plan)
                except ValueError as err:  # memory caps measured since no longer hold it
                    what += f"; kept: the old batch no longer fits ({err})"
                else:
                    return Decision(
                        "rollback", old_plan, None, measured, None, what, window.step_end
                    )
            return Decision(
                "accept", None, None, measured, None, what, window.step_end, validated=True
            )
        was_steady = self.controller.phase == "steady" and window.plan == self.controller.plan
        decision = self.controller.observe(window)
        self.steps.forget()
        in_force = window.plan == self.controller.plan
        steady = self.controller.phase == "steady" and in_force
        # A re-split of the batch in force, just proposed from a steady plan or under
        # validation, gives way to a large gain of the batch (below): at the start, the
        # controller's first split would otherwise hold the batch at B0 through its whole
        # validation, and the new batch comes with a split of its own.
        proposed = (
            decision.kind == "propose"
            and was_steady
            and decision.plan is not None
            and sum(decision.plan) == batch
        )
        trying = decision.kind == "hold" and self.controller.phase == "validating" and in_force
        resplit = proposed or trying
        if (
            not (resplit or (decision.kind == "hold" and steady))
            or self.controller.model.n_obs == 0
        ):
            return decision  # (the rank model has no window yet: a partial first window)
        times = self.steps.measured(window)
        self._recent = (self._recent + times.tolist())[-_BASELINE_STEPS:]
        enough = len(self._recent) >= max(2, self.window_steps // 3)
        if enough:  # (the candidates include batch: one grid posterior and one sort for all)
            self.steps.predict_many(self.scaler.candidates(batch).tolist())
        self.scaler.record(batch, times, self.steps.predict_plan(window.plan), window.plan)
        if not enough:
            return decision
        self.scaler.refresh(self.steps.predict_plan)  # the residual of the rank model as it is now
        proposal = self.scaler.best(batch, self.steps.predict)
        if proposal is None or proposal[1] < 1.0 + self.scaler.config.min_gain:
            return decision
        new, gain = proposal
        least = self.trial_min_gain()
        if gain < 1.0 + least:  # worth a trial in a longer run, not in what remains of this
            if decision.kind != "hold":
                return decision
            needs = "no gain can pay" if math.isinf(least) else f"x{1.0 + least:.3f} needed"
            return replace(
                decision,
                reason=f"{decision.reason}; global batch {batch} -> {new}: goodput predicted"
                f" x{gain:.3f}, not worth a trial in the run that remains ({needs})",
            )
        # a proposed re-split's predicted speedup is credited to the old batch (one under
        # validation is in the baseline's times already)
        credit = _split_credit(decision, self.steps.overhead_s) if proposed else 1.0
        if (resplit or len(self._recent) < self.window_steps) and gain < _LARGE_GAIN * credit:
            return decision  # a small gain is shown on a whole window of baseline only
        try:
            plan, pred_new = self.controller.predict_step_time(new)
        except ValueError:  # the bounds changed under the proposal: not this time
            return decision
        if resplit:  # dropped: the plan before it is the one to return to
            self.controller.decline()
        old_plan = self.controller.plan
        try:
            self.controller.set_global_batch(new, plan, guess=True)
        except ValueError:
            return hold(f"global batch {batch} -> {new}: out of bounds") if resplit else decision
        # (so that the new batch is kept only if it beats the old one split as proposed)
        self._change = (batch, old_plan, [t / credit for t in self._recent])
        self._resplit = False
        self.scaler.changed()
        return Decision(
            "propose",
            plan,
            pred_new,
            measured,
            decision.significance,
            f"global batch {batch} -> {new}: goodput predicted x{gain:.3f} (noise scale"
            f" {self.scaler.phi:.4g}, efficiency x{self.scaler.efficiency(new):.3f})",
            window.step_end,
        )

    def trial_min_gain(self) -> float:
        """The smallest predicted goodput gain worth a trial of a new batch now.

        ``min_gain`` early in a run or in a long one; more as the run that remains shrinks,
        so that a trial pays back twice its new shapes' cost
        (:func:`~lightning_rex.core.decide.pricing.trial_min_gain`, from
        :meth:`set_progress`).
        """
        return trial_min_gain(
            self.scaler.config.min_gain, self.controller.shape_cost_s, self._elapsed_s, self._done
        )

    def _trial_resplit(self, window: Window, old: int, measured: float) -> Decision | None:
        """Re-split a new batch's trial once, when its plan is predicted well off the best.

        The trial's plan was extrapolated before the rank model had seen the new sizes; after
        its first window at them, the model's best plan for the batch is predicted against
        the trial's (both with the straggler wait and the overhead). A predicted speedup of
        at least ``min_gain`` re-splits the trial: the new plan is proposed, the trial's times
        so far are dropped, and the trial restarts when the new plan is in force.

        Args:
            window: The trial's window just taken by the rank model.
            old: The batch before the change.
            measured: The window's slowest rank median (for the decision).

        Returns:
            The ``propose`` decision, or None to measure the trial on.
        """
        batch = sum(window.plan)
        if self._resplit or self.controller.model.n_obs == 0:
            return None
        # (None too when the bounds cannot hold the batch now: the verdict will tell)
        better = self.steps.better_split(window.plan, self.scaler.config.min_gain)
        if better is None:
            return None
        plan, now, then = better
        self.controller.set_global_batch(batch, plan)
        self._resplit, self._resplit_from, self._trial = True, window.plan, []
        return Decision(
            "propose",
            plan,
            then,
            measured,
            None,
            f"global batch {old} -> {batch}: the trial re-split on its first measured sizes"
            f" (step predicted x{now / then:.3f} faster)",
            window.step_end,
        )

    @property
    def progress(self) -> float | None:
        """The fraction of the run done, as last set (:meth:`set_progress`), or None."""
        return self._done

    def set_progress(self, done: float | None) -> None:
        """How much of the run is done, for pricing a trial against the run that remains.

        Called from the training thread (a plain assignment: it never waits for a decision).

        Args:
            done: The fraction done, in ``[0, 1]`` (steps of ``max_steps``, epochs of
                ``max_epochs``, a target's progress), or None when unknown.

        Raises:
            ValueError: For a fraction outside ``[0, 1]``.
        """
        if done is not None and not (math.isfinite(done) and 0.0 <= done <= 1.0):
            raise ValueError(f"done must be a fraction in [0, 1] or None, got {done!r}")
        self._done = None if done is None else float(done)

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Size bounds measured at run time (the controller's).

        Args:
            min_size: The smallest micro-batch.
            max_sizes: Per-rank caps (None entries for none), or None.
        """
        with self._lock:
            self.controller.set_bounds(min_size, max_sizes)
            self.steps.forget()

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        """Each rank's pass cap measured at run time (the controller's).

        Args:
            pass_caps: Per-rank caps (samples per pass, None entries for none), or None.
        """
        with self._lock:
            if pass_caps != self.controller.pass_caps:
                self.controller.set_pass_caps(pass_caps)
                self.steps.forget()

    def rank_model_summary(self) -> dict[str, list[float]]:
        """The controller's per-rank fitted rates and overheads."""
        with self._lock:
            return self.controller.rank_model_summary()

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        """The controller's estimate of the even split's step at the global batch in force."""
        with self._lock:
            return self.controller.even_split_estimate()

    def decline(self) -> None:
        """The last decision will not be applied: a new global batch is undone."""
        with self._lock:
            if self._change is not None and self._resplit_from is not None:
                # the trial's re-split: the trial goes on with the plan it had
                self.controller.set_global_batch(self.global_batch, self._resplit_from)
                self._resplit_from = None
            elif self._change is not None:
                old, old_plan, _ = self._change
                self._change, self._trial = None, []
                self.controller.set_global_batch(old, old_plan)
            else:
                self.controller.decline()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the controller's, the scaler's and a change in validation."""
        with self._lock:
            self._take_norms()
            change = None
            if self._change is not None:
                old, old_plan, base = self._change
                change = {
                    "batch": old,
                    "plan": list(old_plan),
                    "baseline": base,
                    "resplit": self._resplit,
                }
            return {
                "controller": self.controller.state_dict(),
                "scaler": self.scaler.state_dict(),
                "change": change,
                "trial": list(self._trial),
                "recent": list(self._recent),
                "elapsed_s": self._elapsed_s,
                "steps": self.steps.state_dict(),
            }

    #: Check a saved state without loading it (every rank runs it before a resume): see
    #: :func:`~lightning_rex.core.scaling.saved_state.check_scaling_state`.
    check_state = staticmethod(check_scaling_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, after checking it.

        Args:
            d: The saved state.

        Raises:
            StateError: Naming the field (see :meth:`check_state`).
        """
        state = self.check_state(
            d, self.scaler.base_batch, self.controller.world_size, self.scaler.config
        )
        with self._lock:
            self.controller.load_state_dict(d["controller"])
            self.steps.forget()
            self.scaler.load_state_dict(d["scaler"])
            change = state["change"]
            self._change = (
                None if change is None else (change["batch"], change["plan"], change["baseline"])
            )
            self._resplit = change is not None and change["resplit"]
            self._resplit_from = None
            self._trial = list(state["trial"])
            self._recent = list(state["recent"])
            self._elapsed_s = state["elapsed_s"]
            self.steps.load_state_dict(state["steps"])
