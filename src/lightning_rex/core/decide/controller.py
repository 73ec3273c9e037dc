"""The REX controller: a state machine that turns windows into plan decisions.

One :meth:`Controller.observe` call per window (docs/controller.md has the full account). A
whole window is weighed (:mod:`~lightning_rex.core.decide.evidence`: its imbalance test, and
what the :class:`~lightning_rex.core.model.time_model.RankTimeModel` learns from it); a
persistent imbalance (:func:`~lightning_rex.core.stats.persistence.triggered`) leads to a
**proposal**, which is **validated** (:mod:`~lightning_rex.core.decide.changes`): accept,
rollback, or one more window. A window under a plan the controller did not expect (a user's
own ``set_plan``) is **adopted**. The segments of a window are joined in
:class:`~lightning_rex.core.decide.looks.Looks`, and the working state lives in one
:class:`~lightning_rex.core.decide.controller_state.ControllerState`. Everything is
deterministic for a seed, and the state round-trips as JSON-able data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_rex.core.decide.changes import judge_trial, propose_change
from lightning_rex.core.decide.controller_state import BASELINE_WINDOWS, ControllerState, Phase
from lightning_rex.core.decide.evidence import WindowEvidence, weigh_window
from lightning_rex.core.decide.looks import Looks
from lightning_rex.core.decide.pricing import shape_price
from lightning_rex.core.decide.saved_state import check_controller_state
from lightning_rex.core.decision import Decision
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.minimax import resolve_bounds
from lightning_rex.core.plans.plan import Plan, even_plan, validate_plan
from lightning_rex.core.plans.proposal import (
    best_plan_for,
    plan_step_interval,
    refit_when_due,
)
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.saved import StateError
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.stats.persistence import triggered
from lightning_rex.core.stats.significance import WindowHistory
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec

__all__ = ["Controller", "Decision"]


class Controller:
    """Decide when to rescale and to what, from per-rank step-time windows.

    Args:
        global_batch: The global batch ``B``.
        world_size: The number of ranks ``N``.
        settings: The decision parameters (:class:`~lightning_rex.core.settings.
            DecisionSettings`); its defaults when None.
        min_size: The smallest micro-batch any rank may get.
        max_sizes: Per-rank hard caps on the micro-batch, None entries for no cap.
        initial_plan: The plan in force at the start; the even split when None.
        groups: Per-rank device labels (None entries for unlabelled ranks), or None. Ranks
            with the same label share one time curve until one of them changes speed (see
            :class:`~lightning_rex.core.model.time_model.RankTimeModel`).
        max_global_batch: The largest global batch the run may move to (global batch
            scaling, :meth:`set_global_batch`); None: ``global_batch`` stays.
        window: The window the loop gathers (the driver's own
            :class:`~lightning_rex.core.window_spec.WindowSpec`, which ``settings.window``
            then holds): with more than one look, :meth:`observe` takes its segments and acts
            before the window is whole when the evidence is already clear
            (:mod:`~lightning_rex.core.decide.looks`). None: whole windows of
            ``settings.window.steps``, one look each.
        pass_caps: Per-rank pass caps (the largest micro-batch a rank runs in one pass: its
            memory), None entries for none, or None: soft, a larger size runs as
            ``ceil(b / cap)`` accumulation passes (:func:`~lightning_rex.core.passes.passes`)
            and is priced so. The driver sets them from every window
            (:meth:`set_pass_caps`).
        **overrides: Fields of ``settings`` to replace (``alpha=0.05``, ``persistence=3``...).

    Raises:
        ValueError: Naming the argument, for a bad setting, plan or bound.
    """

    def __init__(
        self,
        global_batch: int,
        world_size: int,
        *,
        settings: DecisionSettings | None = None,
        min_size: int = 1,
        max_sizes: Sequence[int | None] | None = None,
        initial_plan: Sequence[int] | None = None,
        groups: Sequence[str | None] | None = None,
        max_global_batch: int | None = None,
        window: WindowSpec | None = None,
        pass_caps: Sequence[int | None] | None = None,
        **overrides: Any,
    ) -> None:
        settings = replace(settings or DecisionSettings(), **overrides)
        if window is None:  # whole windows, one look each
            window = replace(settings.window, looks=1)
        self.settings = replace(settings, window=window)  # the one window: settings.window
        self.world_size = int(world_size)
        self.bounds = SizeBounds(int(min_size)).with_caps(max_sizes)
        resolve_bounds(world_size, global_batch, min_size, max_sizes)  # raises for bad bounds
        plan = even_plan(global_batch, world_size) if initial_plan is None else initial_plan
        self._state = ControllerState(
            int(global_batch), validate_plan(plan, global_batch, world_size, name="initial_plan")
        )
        self.model = RankTimeModel(
            world_size,
            global_batch,
            max(global_batch, max_global_batch or 0) - (world_size - 1),
            num_basis=settings.num_basis,
            memory=settings.memory,
            seed=settings.seed,
            groups=groups,
            pass_caps=pass_caps,
        )
        self._history = WindowHistory()
        # long-run variance-inflation factors (one window, `persistence` windows) from the
        # windows before the latest: not the rollback floors the state keeps
        self._inflation = (1.0, 1.0)
        self._planned = False  # whether the decision being made ran the planner
        self._looks = Looks(window, settings.validation_confidence)

    # ------------------------------------------------------------------ API
    @property
    def plan(self) -> Plan:
        """The plan the controller believes is in force (or about to be)."""
        return self._state.plan

    @property
    def phase(self) -> Phase:
        """The phase: ``"steady"``, ``"validating"`` or ``"rolling_back"``."""
        return self._state.phase

    @property
    def global_batch(self) -> int:
        """The global batch ``B`` the plans sum to."""
        return self._state.global_batch

    @property
    def windows_seen(self) -> int:
        """Whole windows observed."""
        return self._state.windows_seen

    @property
    def shape_cost_s(self) -> float:
        """The seconds a step pays for new micro-batch sizes.

        ``settings.shape_change_s`` when set, else the cost measured at the plan changes so
        far (0 until measured).
        """
        return shape_price(self.settings, self._state)

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Change the size bounds (hard); the next proposal respects them.

        Args:
            min_size: The smallest micro-batch for every rank.
            max_sizes: Per-rank hard caps (None entries for no cap), or None.
        """
        resolve_bounds(self.world_size, self.global_batch, min_size, max_sizes)  # raises if bad
        self.bounds = SizeBounds(int(min_size)).with_caps(max_sizes)

    def _size_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-rank ``(lo, hi)`` of :attr:`bounds` for the global batch in force."""
        return resolve_bounds(
            self.world_size, self.global_batch, self.bounds.min_size, self.bounds.rank_caps
        )

    @property
    def pass_caps(self) -> list[int | None] | None:
        """Per-rank pass caps (None entries for none), or None when no rank has one."""
        return self.model.passes.as_list()

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        """Each rank's pass cap (soft): the next window ran under it, the next plan prices it.

        Args:
            pass_caps: Per-rank caps (samples per pass, None entries for none), or None.

        Raises:
            ValueError: For the wrong number of caps or a cap below 1.
        """
        self.model.passes.set(pass_caps)

    def predict_step_time(self, global_batch: int) -> tuple[Plan, float]:
        """The model's best plan for another global batch, and its predicted step time.

        Args:
            global_batch: The global batch (within the size bounds).

        Returns:
            ``(plan, seconds)`` (:func:`~lightning_rex.core.plans.proposal.best_plan_for`).

        Raises:
            RuntimeError: Before the first window.
        """
        if self.model.n_obs == 0:
            raise RuntimeError("predict_step_time needs at least one window")
        low, high = self.bounds.arrays(global_batch, self.world_size)
        return best_plan_for(self.model, low, high, global_batch)

    def set_global_batch(self, global_batch: int, plan: Sequence[int], guess: bool = False) -> None:
        """Move to another global batch with ``plan`` (a validated batch scaling change).

        The global batch's own validation (goodput) is the caller's; the controller takes
        ``plan`` as the plan in force, keeps what its model learnt (rank times depend on the
        sizes, not on ``B``) and monitors from the next window. A proposal or rollback in
        flight is dropped.

        Args:
            global_batch: The new ``B``.
            plan: Its plan, summing to ``global_batch`` within the bounds.
            guess: ``plan`` is the model's extrapolation to sizes it has not run (a new
                batch's first plan), not a measured state: as for the initial plan, its first
                window is judged as a cold start's (one window, or an early look, is enough
                to propose a split). False for a plan measured before (a rollback), and for a
                trial's re-split, planned on the sizes the trial has just run.

        Raises:
            ValueError: If the plan is malformed or breaks the bounds, or ``B`` exceeds the
                model's largest batch (``max_global_batch``).
        """
        limit = self.model.b_max + self.world_size - 1
        if global_batch > limit:
            raise ValueError(f"global_batch={global_batch} exceeds max_global_batch={limit}")
        new_plan = validate_plan(plan, global_batch, self.world_size, name="plan")
        if not self.bounds.holds(new_plan, global_batch):
            raise ValueError(f"plan {new_plan} breaks the size bounds")
        self.bounds.arrays(global_batch, self.world_size)  # raises if no plan fits
        self._restart(new_plan, int(global_batch), guess)

    def decline(self) -> None:
        """Tell the controller that its last plan will not be applied.

        Monitor-only use declines every proposal; training declines a decision that the end
        of training left unapplied. After a proposal the previous plan stays in force; after
        a rollback the rejected plan does. What the windows taught the model is kept, and the
        controller returns to the steady state. Does nothing when no plan is out.
        """
        self._looks.clear()
        self._state.decline()

    def rank_model_summary(self) -> dict[str, list[float]]:
        """Per-rank fitted overhead (``overhead_s``) and rate (``rate``, samples/s)."""
        return self.model.summary()

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        """What the even split of ``B`` would take per step, as the model predicts it now.

        The report sets it against the measured throughput: what rex gained over DDP's split
        on the same run (:func:`~lightning_rex.core.plans.proposal.plan_step_interval`).

        Returns:
            ``(mean, 2.5%, 97.5%)`` seconds of ``max_r t_r(B / N)``, or None before the
            first window.
        """
        if self.model.n_obs == 0:
            return None
        plan = even_plan(self.global_batch, self.world_size)
        return plan_step_interval(self.model, plan, self.settings.seed + self._state.windows_seen)

    def observe(self, window: Window) -> Decision:
        """Take one window (or, with ``looks > 1``, one segment of a window) and decide.

        Args:
            window: The window's samples and the plan they were measured under.

        Returns:
            The :class:`Decision`.

        Raises:
            ValueError: If the window has the wrong number of ranks.
        """
        if window.n_ranks != self.world_size:
            raise ValueError(f"window has {window.n_ranks} ranks, expected {self.world_size}")
        state = self._state
        state.back_in_force(window.plan)
        self._planned = False
        taken, partial = self._looks.take(
            state, window, self.settings, self._inflation, self.model.group
        )
        decision = self._observe(taken) if taken is not None else self._looks.hold(state, partial)
        if state.refit_wanted and not self._planned:
            # A proposal that found the residual scale's fit due planned with the scale it
            # had, and left the fit (a BoTorch fit, 0.3-0.5 s) to this decision, which does
            # not plan: a proposal never also waits for a fit. The next plan reads the scale.
            state.fitted_at = refit_when_due(self.model, state.fitted_at)
            state.refit_wanted = False
        return decision

    def _observe(self, window: Window) -> Decision:
        """The state machine on one whole (or early-closed) window."""
        settings, state = self.settings, self._state
        state.windows_seen += 1
        evidence = weigh_window(window, self.model, self._history, settings)
        self._inflation = evidence.inflation
        decide, imbalance = evidence.decision, evidence.imbalance
        assert imbalance is not None  # a weighed window is tested
        if state.phase == "validating":
            if window.plan == state.previous:
                return decide("hold", None, "new plan not yet in force", state.predicted)
            if window.plan != state.pending:
                return self._adopt(evidence)
            return judge_trial(
                self.model,
                state,
                settings,
                evidence,
                self._looks.whole_conf,
                self._propose,
            )
        if state.phase == "rolling_back" and window.plan == state.rejected:
            return decide("hold", None, "rollback not yet in force")
        state.back_in_force(window.plan)
        if window.plan != state.plan:
            return self._adopt(evidence)
        # The initial plan is a guess, not a measured state: at cold start one window counts.
        # So is a new global batch's plan, extrapolated to sizes the model has not run; this
        # window measures it, whatever is decided on it.
        cold = (state.reference is None and state.windows_seen == 1) or state.guess
        state.guess = False
        if self._violates_bounds(state.plan):
            return self._propose(evidence, "the plan in force breaks the size bounds", force=True)
        keep = settings.persistence + BASELINE_WINDOWS
        state.recent = [*state.recent, window.times.tolist()][-settings.persistence :]
        state.before = [*state.before, window.step_max.tolist()][-keep:]
        flagged, why = triggered(
            [np.asarray(w) for w in state.recent],
            imbalance,
            cold=cold,
            persistence=settings.persistence,
            alpha=settings.alpha,
            min_effect=settings.min_effect,
            consistency=settings.consistency,
            ending_alpha=settings.ending_alpha,
            floors=self._inflation,
            labels=self.model.group,
        )
        if not flagged:
            return decide("hold", None, why)
        if not cold:
            state.mark_changes(flagged, self.model, settings.min_effect)
        return self._propose(evidence, why, trigger=1 if cold else settings.persistence)

    # -------------------------------------------------------------- internals
    def _adopt(self, evidence: WindowEvidence) -> Decision:
        """Take a plan set outside the controller as the one in force, and keep monitoring.

        A plan of another global batch (the schedule moved ``B`` outside the controller)
        moves the controller's ``B`` with it.
        """
        window = evidence.window
        batch = sum(window.plan)
        if batch != self.global_batch:
            self.bounds.arrays(batch, self.world_size)  # raises if no plan fits
        self._restart(window.plan, batch)
        self._state.recent = [window.times.tolist()]
        self._state.before = [window.step_max.tolist()]
        return evidence.decision(
            "hold", None, "plan set outside the controller: adopted as the plan in force"
        )

    def _restart(self, plan: Plan, global_batch: int | None = None, guess: bool = False) -> None:
        """Put ``plan`` in force, steady, with no change in flight (the model keeps all)."""
        self._state.restart(plan, global_batch, guess)
        self._looks.clear()

    def _violates_bounds(self, plan: Plan) -> bool:
        low, high = self._size_arrays()
        sizes = np.asarray(plan)
        return bool(np.any(sizes < low) or np.any(sizes > high))

    def _propose(
        self,
        evidence: WindowEvidence,
        reason: str,
        force: bool = False,
        trigger: int = 1,
        plan: Plan | None = None,
    ) -> Decision:
        self._planned = self._planned or plan is None
        return propose_change(
            self.model,
            self._state,
            self.settings,
            self._size_arrays(),
            evidence,
            reason,
            force=force,
            trigger=trigger,
            plan=plan,
        )

    def try_plan(self, plan: Sequence[int]) -> None:
        """Apply a plan chosen outside the controller, validated like its own proposals.

        The next window under ``plan`` is tested for non-inferiority against the plan in
        force, and rolled back (a ``rollback`` decision) when it is not shown to be within
        the margin. The caller applies ``plan`` itself.

        Args:
            plan: The plan to try; it must sum to ``B``, respect the bounds and differ from
                the plan in force.

        Raises:
            RuntimeError: If a proposal or rollback is already out.
            ValueError: If the plan is malformed, breaks the bounds or is the plan in force.
        """
        state = self._state
        if state.phase != "steady":
            raise RuntimeError(f"cannot try a plan while {state.phase}")
        trial = validate_plan(plan, self.global_batch, self.world_size, name="plan")
        if self._violates_bounds(trial):
            raise ValueError(f"plan {trial} breaks the size bounds")
        if trial == state.plan:
            raise ValueError(f"plan {trial} is the plan in force: there is nothing to try")
        if self.model.n_obs == 0 or not state.before:
            raise RuntimeError("try_plan needs at least one window under the plan in force")
        last = Window(np.asarray(state.recent[-1]), state.plan, 0, 1)
        self._propose(
            WindowEvidence(last, None, self._inflation), "plan tried from outside", True, 0, trial
        )

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The full state as JSON-able data (configuration is not included)."""
        return {
            **self._state.to_dict(),
            "history": self._history.state_dict(),
            "segments": self._looks.state_dict(),
            "min_size": self.bounds.min_size,
            "max_sizes": None if self.bounds.rank_caps is None else list(self.bounds.rank_caps),
            "model": self.model.state_dict(),
        }

    #: Check saved state against the run's ``B`` and ``N`` without loading it (every rank can
    #: run it; only rank 0 holds a controller): see
    #: :func:`~lightning_rex.core.decide.saved_state.check_controller_state`.
    check_state = staticmethod(check_controller_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a controller built with the same arguments.

        Args:
            d: A dict from :meth:`state_dict` (possibly through a JSON round trip).

        Raises:
            StateError: Naming the field, when the state does not fit this controller
                (see :meth:`check_state`).
        """
        checked = check_controller_state(d, self.global_batch, self.world_size)
        self._state = ControllerState.from_checked(checked)
        try:
            self.set_bounds(checked["min_size"], checked["max_sizes"])
        except ValueError as err:
            raise StateError("controller.max_sizes", str(err)) from None
        self._history.load_state_dict(checked["history"])
        try:
            self._looks.load_state_dict(d.get("segments", []))
        except (KeyError, TypeError, ValueError) as err:
            raise StateError("controller.segments", str(err)) from None
        self.model.load_state_dict(checked["model"])
