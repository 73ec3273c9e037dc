"""The REX controller: a state machine that turns windows into plan decisions.

One :meth:`Controller.observe` call per window (docs/controller.md has the full account):
**steady** windows teach the :class:`~lightning_rex.core.model.time_model.RankTimeModel`
and are tested for an imbalance; a persistent one
(:func:`~lightning_rex.core.stats.persistence.triggered`) makes the planner **propose**
the plan minimising the posterior's optimistic quantile of the step time, if it is
predicted ``min_gain`` faster. A new plan is **validated**
(:mod:`~lightning_rex.core.decide.validating`): **accept**, **rollback**, or one more
window; an accepted change that helped and leaves a significant imbalance is refined at
once. A window under a plan the controller did not expect (a user's own ``set_plan``) is
**adopted**.

The parameters come from a :class:`~lightning_rex.core.settings.DecisionSettings`, the working
state lives in one :class:`~lightning_rex.core.decide.controller_state.ControllerState`, and the
sequential looks in :class:`~lightning_rex.core.decide.looks.Looks`. Bounds can change at run time
(:meth:`Controller.set_bounds`), and so can each rank's pass cap
(:meth:`Controller.set_pass_caps`): the largest micro-batch it runs in one pass, beyond which
a size runs as accumulation passes that the model prices
(:mod:`~lightning_rex.core.model.accumulation`); a pass cap never forbids a size.
:meth:`Controller.try_plan` validates a plan chosen outside.
Everything is deterministic for a seed, and the state round-trips as JSON-able data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_rex.core.decide.controller_state import (
    BASELINE_WINDOWS,
    ControllerState,
    Phase,
    check_controller_state,
)
from lightning_rex.core.decide.looks import Looks
from lightning_rex.core.decide.pricing import rollback_floors, unpaid_shapes
from lightning_rex.core.decide.validating import measure_trial
from lightning_rex.core.decision import Decision, DecisionKind
from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import Plan, even_plan, validate_plan
from lightning_rex.core.plans.planner import exploration_kappa, resolve_bounds
from lightning_rex.core.plans.proposal import (
    best_plan_for,
    plan_step_interval,
    propose_plan,
    refit_due,
    refit_when_due,
)
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.saved import StateError
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.stats.persistence import triggered
from lightning_rex.core.stats.significance import ImbalanceResult, WindowHistory, imbalance_test
from lightning_rex.core.window import Window

__all__ = ["Controller", "Decision"]

_MAX_FLOORS = 256
"""The most floors from rolled-back plans kept, or 4 per rank if more (the oldest go first)."""


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
        looks: Looks per window: with more than one, :meth:`observe` takes segments of a
            window (``window_steps / looks`` steps each) and acts before the window is whole
            when the evidence is already clear (:mod:`~lightning_rex.core.decide.looks`).
        window_steps: Steps of a whole window; required when ``looks > 1``.
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
        looks: int = 1,
        window_steps: int | None = None,
        pass_caps: Sequence[int | None] | None = None,
        **overrides: Any,
    ) -> None:
        s = replace(settings or DecisionSettings(), **overrides)
        self.settings = s
        self.world_size = int(world_size)
        self.bounds = SizeBounds(int(min_size)).with_caps(max_sizes)
        self._lo, self._hi = resolve_bounds(world_size, global_batch, min_size, max_sizes)
        plan = even_plan(global_batch, world_size) if initial_plan is None else initial_plan
        self._s = ControllerState(
            int(global_batch), validate_plan(plan, global_batch, world_size, name="initial_plan")
        )
        self.model = RankTimeModel(
            world_size,
            global_batch,
            max(global_batch, max_global_batch or 0) - (world_size - 1),
            num_basis=s.num_basis,
            memory=s.memory,
            seed=s.seed,
            groups=groups,
            pass_caps=pass_caps,
        )
        self._history = WindowHistory()
        self._floors = (1.0, 1.0)
        self._planned = False  # whether the decision being made ran the planner
        self._looks = Looks(looks, window_steps, s.validation_confidence)
        self.looks = self._looks.looks

    # ------------------------------------------------------------------ API
    @property
    def plan(self) -> Plan:
        """The plan the controller believes is in force (or about to be)."""
        return self._s.plan

    @property
    def state(self) -> Phase:
        """The phase: ``"steady"``, ``"validating"`` or ``"rolling_back"``."""
        return self._s.phase

    @property
    def global_batch(self) -> int:
        """The global batch ``B`` the plans sum to."""
        return self._s.global_batch

    @property
    def windows_seen(self) -> int:
        """Whole windows observed."""
        return self._s.windows_seen

    @property
    def persistence(self) -> int:
        """Consecutive imbalanced windows before a rescale (``settings.persistence``)."""
        return self.settings.persistence

    @property
    def min_size(self) -> int:
        """The smallest micro-batch any rank may get."""
        return self.bounds.min_size

    @property
    def max_sizes(self) -> list[int | None] | None:
        """Per-rank caps (None entries for none), or None."""
        return None if self.bounds.rank_caps is None else list(self.bounds.rank_caps)

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Change the size bounds (hard); the next proposal respects them.

        Args:
            min_size: The smallest micro-batch for every rank.
            max_sizes: Per-rank hard caps (None entries for no cap), or None.
        """
        self._lo, self._hi = resolve_bounds(self.world_size, self.global_batch, min_size, max_sizes)
        self.bounds = SizeBounds(int(min_size)).with_caps(max_sizes)

    @property
    def pass_caps(self) -> list[int | None] | None:
        """Per-rank pass caps (None entries for none), or None when no rank has one."""
        return self.model.pass_cap_list

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        """Each rank's pass cap (soft): the next window ran under it, the next plan prices it.

        Args:
            pass_caps: Per-rank caps (samples per pass, None entries for none), or None.

        Raises:
            ValueError: For the wrong number of caps or a cap below 1.
        """
        self.model.set_pass_caps(pass_caps)

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
        lo, hi = self.bounds.arrays(global_batch, self.world_size)
        return best_plan_for(self.model, lo, hi, global_batch)

    def set_global_batch(self, global_batch: int, plan: Sequence[int]) -> None:
        """Move to another global batch with ``plan`` (a validated batch scaling change).

        The global batch's own validation (goodput) is the caller's; the controller takes
        ``plan`` as the plan in force, keeps what its model learnt (rank times depend on the
        sizes, not on ``B``) and monitors from the next window. A proposal or rollback in
        flight is dropped.

        Args:
            global_batch: The new ``B``.
            plan: Its plan, summing to ``global_batch`` within the bounds.

        Raises:
            ValueError: If the plan is malformed or breaks the bounds, or ``B`` exceeds the
                model's largest batch (``max_global_batch``).
        """
        limit = self.model.b_max + self.world_size - 1
        if global_batch > limit:
            raise ValueError(f"global_batch={global_batch} exceeds max_global_batch={limit}")
        p = validate_plan(plan, global_batch, self.world_size, name="plan")
        if not self.bounds.holds(p, global_batch):
            raise ValueError(f"plan {p} breaks the size bounds")
        self._lo, self._hi = self.bounds.arrays(global_batch, self.world_size)
        self._restart(p, int(global_batch))

    def decline(self) -> None:
        """Tell the controller that its last plan will not be applied.

        Monitor-only use declines every proposal; training declines a decision that the end
        of training left unapplied. After a proposal the previous plan stays in force; after
        a rollback the rejected plan does. What the windows taught the model is kept, and the
        controller returns to the steady state. Does nothing when no plan is out.
        """
        self._looks.clear()
        self._s.decline()

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
        return plan_step_interval(self.model, plan, self.settings.seed + self._s.windows_seen)

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
        st = self._s
        st.back_in_force(window.plan)
        self._planned = False
        taken, partial = self._looks.take(st, window, self.settings, self._floors, self.model.group)
        if taken is not None:
            d = self._observe(taken)
        else:
            d = Decision(
                "hold",
                None,
                st.predicted if st.phase == "validating" else None,
                float(partial.medians.max()),
                None,
                f"look after {partial.n_steps} of {self._looks.window_steps} steps:"
                " not yet conclusive",
                window.step_end,
            )
        if st.refit_wanted and not self._planned:
            # A proposal that found the residual scale's fit due planned with the scale it
            # had, and left the fit (a BoTorch fit, 0.3-0.5 s) to this decision, which does
            # not plan: a proposal never also waits for a fit. The next plan reads the scale.
            st.fitted_at = refit_when_due(self.model, st.fitted_at)
            st.refit_wanted = False
        return d

    def _observe(self, window: Window) -> Decision:
        """The state machine on one whole (or early-closed) window."""
        s, st = self.settings, self._s
        st.windows_seen += 1
        # The long-run variance factors come from the windows before this one (batch means
        # across windows): slow autocorrelation that a single window cannot see.
        f_one = self._history.factor(1)
        self._floors = (f_one, max(f_one, self._history.factor(s.persistence)))
        sig = imbalance_test(
            window.times, alpha=s.alpha, min_effect=s.min_effect, min_inflation=f_one
        )
        self._history.add(sig.z, window.plan, window.n_steps)
        logs = np.log(window.times)
        # a robust spread (MAD): a new shape's first step or a stall must not make a window
        # look noisy, or its medians would teach the model nothing
        mad = np.median(np.abs(logs - np.median(logs, axis=1, keepdims=True)), axis=1)
        rel_var = float(np.median((1.4826 * mad) ** 2)) * (math.pi / 2) * sig.inflation
        self.model.add(window.plan, window.medians, rel_var / window.n_steps)
        measured = float(window.medians.max())
        summary = sig.to_dict()

        def decide(
            kind: DecisionKind, plan: Plan | None, reason: str, pred: float | None = None
        ) -> Decision:
            return Decision(kind, plan, pred, measured, summary, reason, window.step_end)

        if st.phase == "validating":
            if window.plan == st.previous:
                return decide("hold", None, "new plan not yet in force", st.predicted)
            if window.plan != st.pending:
                return self._adopt(window, decide)
            return self._validate(window, sig, measured, decide)
        if st.phase == "rolling_back" and window.plan == st.rejected:
            return decide("hold", None, "rollback not yet in force")
        st.back_in_force(window.plan)
        if window.plan != st.plan:
            return self._adopt(window, decide)
        if self._violates_bounds(st.plan):
            return self._propose(
                window, "the plan in force breaks the size bounds", decide, force=True
            )
        st.recent = [*st.recent, window.times.tolist()][-s.persistence :]
        st.before = [*st.before, window.step_max.tolist()][-(s.persistence + BASELINE_WINDOWS) :]
        # The initial plan is a guess, not a measured state: at cold start one window counts.
        cold = st.reference is None and st.windows_seen == 1
        flagged, why = triggered(
            [np.asarray(w) for w in st.recent],
            sig,
            cold=cold,
            persistence=s.persistence,
            alpha=s.alpha,
            min_effect=s.min_effect,
            consistency=s.consistency,
            ending_alpha=s.ending_alpha,
            floors=self._floors,
            labels=self.model.group,
        )
        if not flagged:
            return decide("hold", None, why)
        if not cold:
            st.mark_changes(flagged, self.model, s.min_effect)
        return self._propose(window, why, decide, trigger=1 if cold else s.persistence)

    # -------------------------------------------------------------- internals
    def _adopt(self, window: Window, decide: Any) -> Decision:
        """Take a plan set outside the controller as the one in force, and keep monitoring.

        A plan of another global batch (the schedule moved ``B`` outside the controller)
        moves the controller's ``B`` with it.
        """
        batch = sum(window.plan)
        if batch != self.global_batch:
            self._lo, self._hi = self.bounds.arrays(batch, self.world_size)
        self._restart(window.plan, batch)
        self._s.recent = [window.times.tolist()]
        self._s.before = [window.step_max.tolist()]
        return decide("hold", None, "plan set outside the controller: adopted as the plan in force")

    def _restart(self, plan: Plan, global_batch: int | None = None) -> None:
        """Put ``plan`` in force, steady, with no change in flight (the model keeps all)."""
        self._s.restart(plan, global_batch)
        self._looks.clear()

    def _violates_bounds(self, plan: Plan) -> bool:
        b = np.asarray(plan)
        return bool(np.any(b < self._lo) or np.any(b > self._hi))

    def _best_plan(self) -> tuple[Plan, float, float]:
        st = self._s
        self._planned = True
        st.refit_wanted = st.refit_wanted or refit_due(self.model, st.fitted_at)
        return propose_plan(
            self.model,
            st.plan,
            self._lo,
            self._hi,
            self.global_batch,
            kappa=exploration_kappa(self.settings.explore, self.model.n_obs),
            explore_slack=self.settings.explore_slack,
            in_bounds=not self._violates_bounds(st.plan),
            floors=st.floors,
        )

    def _propose(
        self,
        window: Window,
        reason: str,
        decide: Any,
        force: bool = False,
        trigger: int = 1,
        plan: Plan | None = None,
    ) -> Decision:
        st = self._s
        if plan is None:
            plan, pred_new, pred_cur = self._best_plan()
            gain = self.settings.min_gain * (2.0 if st.rolled_back else 1.0)
            if not force and (plan == st.plan or pred_new > pred_cur * (1.0 - gain)):
                st.changed = False
                return decide("hold", None, f"{reason}; no plan predicted {gain:.0%} faster")
            unpaid = unpaid_shapes(self.settings, self._s, self.model, plan, pred_cur - pred_new)
            if not force and unpaid:
                st.changed = False
                return decide("hold", None, f"{reason}; {unpaid}")
        else:
            pred_new = float(self.model.predict(plan).max())
        base = st.baseline_for(window.step_max.tolist(), trigger, self.settings.margin)
        st.propose(plan, pred_new, base)
        return decide("propose", plan, reason, pred_new)

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
        st = self._s
        if st.phase != "steady":
            raise RuntimeError(f"cannot try a plan while {st.phase}")
        p = validate_plan(plan, self.global_batch, self.world_size, name="plan")
        if self._violates_bounds(p):
            raise ValueError(f"plan {p} breaks the size bounds")
        if p == st.plan:
            raise ValueError(f"plan {p} is the plan in force: there is nothing to try")
        if self.model.n_obs == 0 or not st.before:
            raise RuntimeError("try_plan needs at least one window under the plan in force")
        last = Window(np.asarray(st.recent[-1]), st.plan, 0, 1)
        self._propose(last, "plan tried from outside", lambda *a, **k: None, True, 0, p)

    def _validate(
        self, window: Window, sig: ImbalanceResult, measured: float, decide: Any
    ) -> Decision:
        st, predicted = self._s, self._s.predicted
        if not st.trial and st.previous is not None:
            st.measure_shape_cost(window, st.previous)
        j = measure_trial(st, window, self.model, self.settings, measured, self._looks.whole_conf)
        if j is None:  # too short to compare (a window cut by dropped steps): not a look
            return decide("hold", None, "validation window too short: not counted", predicted)
        if j.outcome == "extend":
            return decide("hold", None, j.reason, predicted)
        if j.outcome == "rollback":
            back = st.previous
            assert back is not None
            keep = max(_MAX_FLOORS, 4 * self.world_size)
            st.floors = (st.floors + rollback_floors(self.model, st, window, back))[-keep:]
            return decide("rollback", st.roll_back(), j.reason, predicted)
        st.accept(window.medians.tolist(), st.trial, window.times.tolist())
        if sig.imbalanced and j.ratio < 1.0:
            # The change helped, and the plan just validated is still significantly
            # imbalanced: most likely the model's error at the new sizes, which this window
            # has just corrected, not a transient straggler. Refine now rather than after
            # `persistence` more windows. A change that did not help ends the chain: no
            # drift through plans each within the margin of the one before.
            refined = self._propose(window, f"{j.reason}; still imbalanced: refined", decide)
            if refined.kind == "propose":
                return replace(refined, validated=True)
        return replace(decide("accept", None, j.reason, predicted), validated=True)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The full state as JSON-able data (configuration is not included)."""
        return {
            **self._s.to_dict(),
            "history": self._history.state_dict(),
            "segments": self._looks.state_dict(),
            "min_size": self.min_size,
            "max_sizes": self.max_sizes,
            "model": self.model.state_dict(),
        }

    #: Check saved state against the run's ``B`` and ``N`` without loading it (every rank can
    #: run it; only rank 0 holds a controller): see
    #: :func:`~lightning_rex.core.decide.controller_state.check_controller_state`.
    check_state = staticmethod(check_controller_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a controller built with the same arguments.

        Args:
            d: A dict from :meth:`state_dict` (possibly through a JSON round trip).

        Raises:
            StateError: Naming the field, when the state does not fit this controller
                (see :meth:`check_state`).
        """
        c = check_controller_state(d, self.global_batch, self.world_size)
        self._s = ControllerState.from_checked(c)
        try:
            self.set_bounds(c["min_size"], c["max_sizes"])
        except ValueError as err:
            raise StateError("controller.max_sizes", str(err)) from None
        self._history.load_state_dict(c["history"])
        try:
            self._looks.load_state_dict(d.get("segments", []))
        except (KeyError, TypeError, ValueError) as err:
            raise StateError("controller.segments", str(err)) from None
        self.model.load_state_dict(c["model"])
