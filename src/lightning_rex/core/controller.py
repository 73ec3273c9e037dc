"""The REX controller: a state machine that turns windows into plan decisions.

One :meth:`Controller.observe` call per window (docs/controller.md has the full account):

* **steady**: the window's per-rank medians teach the
  :class:`~lightning_rex.core.model.RankTimeModel`; the imbalance test runs with the
  autocorrelation floor of the windows before (:class:`~lightning_rex.core.significance.
  WindowHistory`). When the imbalance is persistent
  (:func:`~lightning_rex.core.persistence.persistent_ranks`) the planner proposes the plan
  minimising the posterior's optimistic quantile of the step time: **propose** if it is
  predicted ``min_gain`` faster (twice that after a rollback), otherwise **hold**.
* **validating**: windows under the old plan only teach the model. Under the new plan, a
  non-inferiority test (:func:`~lightning_rex.core.validation.non_inferiority`) against the
  old plan's steady windows before the trigger: **accept** when the new plan is shown not
  slower than ``1 + margin``, **rollback** when it is not after two windows (or is shown
  slower after one), **hold** for a second window in between. An accepted change that
  helped and leaves a significant imbalance is *refined* at once (a ``validated`` propose).
* **rolling back**: windows under the rejected plan are ignored until the old one is back.
* **adopting**: a window under a plan the controller neither expects nor waits for (a user's
  own ``set_plan``) makes that plan the one in force; monitoring goes on from there.

Bounds can change at run time with :meth:`Controller.set_bounds`; :meth:`Controller.try_plan`
validates a plan chosen outside. Everything is deterministic for a seed, and
:meth:`Controller.state_dict` / :meth:`Controller.load_state_dict` round-trip the full state as
JSON-able data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_rex.core.controller_state import (
    check_controller_state,
    controller_state_dict,
    load_controller_state,
)
from lightning_rex.core.decision import Decision, DecisionKind
from lightning_rex.core.looks import SegmentBuffer, early_imbalance, validation_confidences
from lightning_rex.core.model import RankTimeModel
from lightning_rex.core.persistence import cold_start_ranks, persistent_ranks, pointing
from lightning_rex.core.plan import Plan, even_plan, validate_plan
from lightning_rex.core.planner import exploration_kappa, resolve_bounds
from lightning_rex.core.proposal import best_plan_for, propose_plan
from lightning_rex.core.significance import (
    ImbalanceResult,
    WindowHistory,
    imbalance_test,
)
from lightning_rex.core.validation import non_inferiority
from lightning_rex.core.window import Window

__all__ = ["Controller", "Decision"]

_BASELINE_WINDOWS = 4
"""The most steady windows before a trigger that form a change's baseline."""
_VALIDATION_LOOKS = 2
"""The most windows a new plan is measured for before it is kept or rolled back."""


class Controller:
    """Decide when to rescale and to what, from per-rank step-time windows.

    Args:
        global_batch: The global batch ``B`` (fixed).
        world_size: The number of ranks ``N``.
        alpha: Family-wise significance level of the imbalance test.
        min_effect: Practical effect threshold on the median ratio (default 5%).
        persistence: Consecutive windows an imbalance must hold before a rescale (``m``).
        min_size: The smallest micro-batch any rank may get.
        max_sizes: Per-rank caps (memory), None entries for no cap.
        seed: Seed for everything random (hyperparameter-fit subsets).
        initial_plan: The plan in force at the start; the even split when None.
        consistency: Raw one-sided p-value each of the ``persistence`` windows must reach on
            its own for the flagged rank.
        ending_alpha: Level of the veto that calls an imbalance transient when it ends (or
            starts) inside the latest window (see ``ending_p_value``).
        min_gain: Smallest predicted relative step-time gain worth a proposal; twice this
            after a rollback, until a plan is accepted (a gain the validation could not
            confirm is not proposed again and again).
        margin: Non-inferiority margin: a new plan is kept only when the data show, at
            ``validation_confidence``, that it is not slower than the old by more than this
            fraction (:func:`~lightning_rex.core.validation.non_inferiority`).
        validation_confidence: One-sided confidence of the non-inferiority bound.
        tolerance: A new plan is also rolled back when its measured step time exceeds the
            prediction by more than this fraction (plus a noise allowance).
        explore: Exploration width: the planner uses ``mean - explore / sqrt(n) * sd``.
        explore_slack: The exploring plan is used only while its posterior-mean step time is
            within this fraction of the best posterior-mean plan's; otherwise the latter.
        num_basis: Spline basis functions of the rank time model.
        memory: Age in windows at which old observations' weight has dropped by ``e``.
        groups: Per-rank device labels (None entries for unlabelled ranks), or None. Ranks
            with the same label share one time curve until one of them changes speed (see
            :class:`~lightning_rex.core.model.RankTimeModel`).
        max_global_batch: The largest global batch the run may move to (global batch
            scaling, :meth:`set_global_batch`); None: ``global_batch`` stays.
        looks: Looks per window: with more than one, :meth:`observe` takes segments of a
            window (``window_steps / looks`` steps each) and acts before the window is whole
            when the evidence is already clear (:mod:`~lightning_rex.core.looks`).
        window_steps: Steps of a whole window; required when ``looks > 1``.
    """

    def __init__(
        self,
        global_batch: int,
        world_size: int,
        *,
        alpha: float = 0.01,
        min_effect: float = 0.05,
        persistence: int = 2,
        min_size: int = 1,
        max_sizes: Sequence[int | None] | None = None,
        seed: int = 0,
        initial_plan: Sequence[int] | None = None,
        consistency: float = 0.01,
        ending_alpha: float = 0.05,
        min_gain: float = 0.02,
        margin: float = 0.02,
        validation_confidence: float = 0.95,
        tolerance: float = 0.10,
        explore: float = 0.5,
        explore_slack: float = 0.03,
        num_basis: int = 16,
        memory: float = 12.0,
        groups: Sequence[str | None] | None = None,
        looks: int = 1,
        window_steps: int | None = None,
        max_global_batch: int | None = None,
    ) -> None:
        if int(looks) != looks or looks < 1:
            raise ValueError(f"looks must be an integer >= 1, got {looks}")
        if looks > 1 and window_steps is None:
            raise ValueError("window_steps is required when looks > 1")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if persistence < 1:
            raise ValueError(f"persistence must be >= 1, got {persistence}")
        self.global_batch = int(global_batch)
        self.world_size = int(world_size)
        self.alpha = float(alpha)
        self.min_effect = float(min_effect)
        self.persistence = int(persistence)
        self.seed = int(seed)
        self.consistency = float(consistency)
        self.ending_alpha = float(ending_alpha)
        self.min_gain = float(min_gain)
        self.margin = float(margin)
        if not 0.0 < validation_confidence < 1.0:
            raise ValueError(
                f"validation_confidence must be in (0, 1), got {validation_confidence}"
            )
        self.validation_confidence = float(validation_confidence)
        self.tolerance = float(tolerance)
        self.explore = float(explore)
        self.explore_slack = float(explore_slack)
        self.min_size = int(min_size)
        self.max_sizes: list[int | None] | None = None
        self._lo, self._hi = resolve_bounds(world_size, global_batch, min_size, max_sizes)
        self.max_sizes = None if max_sizes is None else list(max_sizes)
        plan = even_plan(global_batch, world_size) if initial_plan is None else initial_plan
        self._plan: Plan = validate_plan(plan, global_batch, world_size, name="initial_plan")
        self.model = RankTimeModel(
            world_size,
            global_batch,
            max(global_batch, max_global_batch or 0) - (world_size - 1),
            num_basis=num_basis,
            memory=memory,
            seed=seed,
            groups=groups,
        )
        self._state: str = "steady"
        self._pending: Plan | None = None
        self._previous: Plan | None = None
        self._rejected: Plan | None = None
        self._predicted: float | None = None
        self._baseline: list[float] | None = None
        self._recent: list[list[list[float]]] = []
        # per-step synchronous times of the steady windows under the plan in force (oldest
        # first), for the baseline of the next change
        self._before: list[list[float]] = []
        self._changed = False
        # per-step times of the windows measured so far under a plan being validated
        self._trial: list[list[float]] = []
        self._rolled_back = False
        self._reference: list[float] | None = None
        self._fitted_at = -1
        self._history = WindowHistory()
        self._floors = (1.0, 1.0)
        self.windows_seen = 0
        self.looks = int(looks)
        # a whole window is `looks` segments of `window_steps // looks` steps, as the loop
        # gathers them
        whole = self.looks * (int(window_steps or 0) // self.looks)
        self._segments = None if looks == 1 else SegmentBuffer(whole)
        self._early_conf, self._whole_conf = validation_confidences(
            validation_confidence, self.looks, _VALIDATION_LOOKS
        )

    # ------------------------------------------------------------------ API
    @property
    def plan(self) -> Plan:
        """The plan the controller believes is in force (or about to be)."""
        return self._plan

    @property
    def state(self) -> str:
        """``"steady"``, ``"validating"`` or ``"rolling_back"``."""
        return self._state

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Change the size bounds; the next proposal respects them.

        Args:
            min_size: The smallest micro-batch for every rank.
            max_sizes: Per-rank caps (None entries for no cap), or None.
        """
        self._lo, self._hi = resolve_bounds(self.world_size, self.global_batch, min_size, max_sizes)
        self.min_size = int(min_size)
        self.max_sizes = None if max_sizes is None else list(max_sizes)

    def predict_step_time(self, global_batch: int) -> tuple[Plan, float]:
        """The model's best plan for another global batch, and its predicted step time.

        Args:
            global_batch: The global batch (within the size bounds).

        Returns:
            ``(plan, seconds)`` (:func:`~lightning_rex.core.proposal.best_plan_for`).

        Raises:
            RuntimeError: Before the first window.
        """
        if self.model.n_obs == 0:
            raise RuntimeError("predict_step_time needs at least one window")
        lo, hi = resolve_bounds(self.world_size, global_batch, self.min_size, self.max_sizes)
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
        lo, hi = resolve_bounds(self.world_size, global_batch, self.min_size, self.max_sizes)
        if bool(np.any(np.asarray(p) < lo) or np.any(np.asarray(p) > hi)):
            raise ValueError(f"plan {p} breaks the size bounds")
        self.global_batch = int(global_batch)
        self._lo, self._hi = lo, hi
        self._restart(p)

    def decline(self) -> None:
        """Tell the controller that its last plan will not be applied.

        Monitor-only use declines every proposal; training declines a decision that the end
        of training left unapplied. After a proposal the previous plan stays in force; after
        a rollback the rejected plan does. What the windows taught the model is kept, and the
        controller returns to the steady state. Does nothing when no plan is out.
        """
        if self._segments is not None:
            self._segments.clear()
        if self._state == "validating" and self._previous is not None:
            self._plan = self._previous
            self._pending, self._previous, self._baseline = None, None, None
            self._state = "steady"
            self._recent, self._before, self._trial = [], [], []
            self._changed = False
        elif self._state == "rolling_back" and self._rejected is not None:
            self._plan, self._rejected = self._rejected, None
            self._state = "steady"
            self._recent, self._before = [], []

    def rank_model_summary(self) -> dict[str, list[float]]:
        """Per-rank fitted overhead (``overhead_s``) and rate (``rate``, samples/s)."""
        return self.model.summary()

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
        if self._segments is None:
            return self._observe(window)
        if self._state == "rolling_back" and window.plan == self._plan:
            self._state, self._rejected = "steady", None  # the old plan is back
        measuring = self._pending if self._state == "validating" else self._plan
        if self._state == "rolling_back" or window.plan != measuring:
            # not a plan being measured (a rollback or proposal not yet in force, a plan set
            # outside): the state machine takes it as it is
            self._segments.clear()
            return self._observe(window)
        partial = self._segments.add(window)
        if partial.n_steps >= self._segments.window_steps or self._early(partial):
            self._segments.clear()
            return self._observe(partial)
        return Decision(
            "hold",
            None,
            self._predicted if self._state == "validating" else None,
            float(partial.medians.max()),
            None,
            f"look after {partial.n_steps} of {self._segments.window_steps} steps:"
            " not yet conclusive",
            window.step_end,
        )

    def _early(self, partial: Window) -> bool:
        """Whether a partial window's evidence is clear enough to close the window now."""
        assert self._segments is not None
        if self._state == "validating":
            if self._baseline is None or partial.n_steps < 2 or len(self._baseline) < 2:
                return False
            trial = [t for w in self._trial for t in w] + partial.step_max.tolist()
            ni = non_inferiority(
                np.asarray(trial),
                np.asarray(self._baseline),
                margin=self.margin,
                confidence=self._early_conf,
            )
            return ni.non_inferior or ni.lower > ni.bound
        cold = self._reference is None and self.windows_seen == 0
        need = 1 if cold else self.persistence
        # with more than one window needed, half a window first: a straggler shorter than
        # about (persistence - 1/2) windows is never acted on early
        if need > 1 and (
            len(self._recent) < need - 1 or 2 * partial.n_steps < self._segments.window_steps
        ):
            return False
        wins = [np.asarray(w) for w in self._recent[len(self._recent) - need + 1 :]]
        return bool(
            early_imbalance(
                [*wins, partial.times],
                cold=cold,
                alpha=self.alpha,
                min_effect=self.min_effect,
                consistency=self.consistency,
                ending_alpha=self.ending_alpha,
                floors=self._floors,
            )
        )

    def _observe(self, window: Window) -> Decision:
        """The state machine on one whole (or early-closed) window."""
        self.windows_seen += 1
        # The long-run variance factors come from the windows before this one (batch means
        # across windows): slow autocorrelation that a single window cannot see.
        f_one = self._history.factor(1)
        self._floors = (f_one, max(f_one, self._history.factor(self.persistence)))
        sig = imbalance_test(
            window.times, alpha=self.alpha, min_effect=self.min_effect, min_inflation=f_one
        )
        self._history.add(sig.z, window.plan, window.n_steps)
        k = window.n_steps
        logs = np.log(window.times)
        rel_var = float(np.median(logs.var(axis=1))) * (math.pi / 2) * sig.inflation / k
        self.model.add(window.plan, window.medians, rel_var)
        measured = float(window.medians.max())

        summary = sig.to_dict()

        def decide(
            kind: DecisionKind, plan: Plan | None, reason: str, pred: float | None = None
        ) -> Decision:
            return Decision(kind, plan, pred, measured, summary, reason, window.step_end)

        if self._state == "validating":
            if window.plan == self._previous:
                return decide("hold", None, "new plan not yet in force", self._predicted)
            if window.plan != self._pending:
                return self._adopt(window, decide)
            return self._validate(window, sig, measured, decide)
        if self._state == "rolling_back":
            if window.plan == self._rejected:
                return decide("hold", None, "rollback not yet in force")
            if window.plan == self._plan:
                self._state, self._rejected = "steady", None
        if window.plan != self._plan:
            return self._adopt(window, decide)
        if self._violates_bounds(self._plan):
            return self._propose(
                window, "the plan in force breaks the size bounds", decide, force=True
            )
        self._recent.append(window.times.tolist())
        self._recent = self._recent[-self.persistence :]
        self._before.append(window.step_max.tolist())
        self._before = self._before[-(self.persistence + _BASELINE_WINDOWS) :]
        # The initial plan is a guess, not a measured state: at cold start one window counts.
        cold = self._reference is None and self.windows_seen == 1
        need = 1 if cold else self.persistence
        if len(self._recent) < need:
            return decide("hold", None, "imbalanced" if sig.imbalanced else "balanced")
        # _persistent flags a rank only if every window, this one included, points at it on
        # its own: when this window points at no rank, skip the pooled tests (same result,
        # and most windows of a balanced run end here cheaply)
        points = pointing(sig, self.consistency, self.min_effect)
        if not bool(points.any()):
            return decide("hold", None, "transient imbalance" if sig.imbalanced else "balanced")
        if cold:  # see cold_start_ranks
            flagged = cold_start_ranks(sig, self.alpha, self.min_effect)
            if not flagged:
                return decide("hold", None, "balanced at cold start")
            return self._propose(
                window, f"imbalance at cold start on ranks {flagged[:8]}", decide, trigger=1
            )
        flagged = self._persistent(need)
        if not flagged:
            why = "transient imbalance" if sig.imbalanced else "balanced"
            return decide("hold", None, why)
        self._mark_changes(flagged, window)
        return self._propose(
            window, f"persistent imbalance on ranks {flagged[:8]}", decide, trigger=need
        )

    # -------------------------------------------------------------- internals
    def _adopt(self, window: Window, decide: Any) -> Decision:
        """Take a plan set outside the controller as the one in force, and keep monitoring."""
        self._restart(window.plan)
        self._recent = [window.times.tolist()]
        self._before = [window.step_max.tolist()]
        return decide("hold", None, "plan set outside the controller: adopted as the plan in force")

    def _restart(self, plan: Plan) -> None:
        """Put ``plan`` in force, steady, with no change in flight.

        The windows held for changes are dropped; what the model learnt stays.
        """
        self._plan, self._state = plan, "steady"
        self._pending = self._previous = self._rejected = None
        self._predicted, self._baseline, self._reference = None, None, None
        self._trial, self._changed, self._rolled_back = [], False, False
        self._recent, self._before = [], []
        if self._segments is not None:
            self._segments.clear()

    def _violates_bounds(self, plan: Plan) -> bool:
        b = np.asarray(plan)
        return bool(np.any(b < self._lo) or np.any(b > self._hi))

    def _mark_changes(self, flagged: list[int], window: Window) -> None:
        """Flagged ranks whose curve changed get their older observations discounted.

        A rank changed when its recent median moved by more than ``min_effect`` since the plan
        was accepted, or sits that far from what the model predicts at its current size.
        """
        recent = np.median(np.concatenate([np.asarray(w) for w in self._recent], axis=1), axis=1)
        thr = math.log1p(self.min_effect)
        gap = np.abs(np.log(recent / self.model.predict(self._plan)))
        if self._reference is not None:
            gap = np.maximum(gap, np.abs(np.log(recent / np.asarray(self._reference))))
        moved = [r for r in flagged if gap[r] > thr]
        self._changed = bool(moved)
        if moved:
            self._rolled_back = False  # a new cluster: gains are worth proposing again
            self.model.forget(moved, keep_last=len(self._recent))

    def _persistent(self, need: int) -> list[int]:
        return persistent_ranks(
            [np.asarray(w) for w in self._recent[-need:]],
            alpha=self.alpha,
            min_effect=self.min_effect,
            consistency=self.consistency,
            ending_alpha=self.ending_alpha,
            floors=self._floors,
        )

    def _best_plan(self) -> tuple[Plan, float, float]:
        # Refit the hyperparameters only once there is data to fit them to (6 windows held)
        # and then when the windows seen since have doubled, or grown by 20: they move
        # slowly, and a BoTorch fit (a few hundred ms of CPU) dominates a proposal's cost.
        added, f = self.model.n_added, self._fitted_at
        if self.model.n_obs >= 6 and (f < 0 or added >= min(2 * f, f + 20)):
            fits = self.model.n_fits
            self.model.fit_hyperparameters()
            if self.model.n_fits != fits:  # it ran (it skips data with one size per rank)
                self._fitted_at = added
        return propose_plan(
            self.model,
            self._plan,
            self._lo,
            self._hi,
            self.global_batch,
            kappa=exploration_kappa(self.explore, self.model.n_obs),
            explore_slack=self.explore_slack,
            in_bounds=not self._violates_bounds(self._plan),
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
        if plan is None:
            plan, pred_new, pred_cur = self._best_plan()
            gain = self.min_gain * (2.0 if self._rolled_back else 1.0)
            if not force and (plan == self._plan or pred_new > pred_cur * (1.0 - gain)):
                why = f"{reason}; no plan predicted {gain:.0%} faster"
                self._changed = False
                return decide("hold", None, why)
        else:
            pred_new = float(self.model.predict(plan).max())
        self._baseline = self._baseline_for(window, trigger)
        self._previous, self._pending = self._plan, plan
        self._plan = plan
        self._predicted = pred_new
        self._state = "validating"
        self._recent, self._before, self._changed, self._trial = [], [], False, []
        return decide("propose", plan, reason, pred_new)

    def _baseline_for(self, window: Window, trigger: int) -> list[float]:
        """The old plan's per-step times that a new plan is validated against.

        The windows that triggered the proposal were selected for looking imbalanced, and
        regression to the mean would flatter any change measured against them. So the
        baseline is the (up to ``_BASELINE_WINDOWS``) steady windows under the old plan
        *before* the trigger. Exceptions, where those windows do not measure the cluster the
        new plan runs on: a rank's speed changed (a change point was marked), the step time
        under the old plan moved by more than the margin between them and the trigger (a
        drift too slow for a change point), or there are none (cold start, a refinement
        right after a validation). Then the trigger windows are the baseline.
        """
        before = self._before[: max(0, len(self._before) - trigger)][-_BASELINE_WINDOWS:]
        trig = self._before[-trigger:] if trigger > 0 else []
        flat_trig = [t for w in trig for t in w] or window.step_max.tolist()
        if not before or self._changed:
            return flat_trig
        flat = [t for w in before for t in w]
        moved = abs(float(np.mean(np.log(flat_trig)) - np.mean(np.log(flat))))
        return flat_trig if moved > math.log1p(self.margin) else flat

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
        if self._state != "steady":
            raise RuntimeError(f"cannot try a plan while {self._state}")
        p = validate_plan(plan, self.global_batch, self.world_size, name="plan")
        if self._violates_bounds(p):
            raise ValueError(f"plan {p} breaks the size bounds")
        if p == self._plan:
            raise ValueError(f"plan {p} is the plan in force: there is nothing to try")
        if self.model.n_obs == 0 or not self._before:
            raise RuntimeError("try_plan needs at least one window under the plan in force")
        last = Window(np.asarray(self._recent[-1]), self._plan, 0, 1)
        self._propose(last, "plan tried from outside", lambda *a, **k: None, True, 0, p)

    def _validate(
        self, window: Window, sig: ImbalanceResult, measured: float, decide: Any
    ) -> Decision:
        assert self._baseline is not None and self._previous is not None
        if window.n_steps < 2 or len(self._baseline) < 2:
            # too short to compare (a window cut by dropped steps): not a look, measure on
            return decide("hold", None, "validation window too short: not counted", self._predicted)
        self._trial.append(window.step_max.tolist())
        looks = len(self._trial)
        # Two whole-window looks at most, each at half the error rate left by the early looks
        # (Bonferroni), so that accepting a plan truly slower than the margin stays below
        # 1 - confidence over all of them.
        ni = non_inferiority(
            np.asarray([t for w in self._trial for t in w]),
            np.asarray(self._baseline),
            margin=self.margin,
            confidence=self._whole_conf,
        )
        pred = float(self.model.predict(window.plan).max())
        allowance = 3.0 * math.sqrt(
            self.model.rel_var[-1] * 2.0 * math.log(max(self.world_size, 2))
        )
        off_model = measured > pred * (1.0 + self.tolerance + allowance)
        ratio = ni.ratio
        slower = not ni.non_inferior
        if slower and not off_model and looks < _VALIDATION_LOOKS and ni.lower <= ni.bound:
            # neither shown within the margin nor shown worse: measure one more window
            return decide(
                "hold",
                None,
                f"validation inconclusive after {looks} window (x{ratio:.3f}, upper bound"
                f" x{ni.upper:.3f}): extended",
                self._predicted,
            )
        predicted = self._predicted
        self._baseline = None
        self._before, self._trial = self._trial, []
        self._recent = [window.times.tolist()]
        if slower or off_model:
            why = (
                f"new plan not shown within {self.margin:.0%} of the old (x{ratio:.3f},"
                f" upper bound x{ni.upper:.3f})"
                if slower
                else f"new plan slower than predicted ({measured:.4g}s vs {pred:.4g}s)"
            )
            back = self._previous
            self._rejected = self._pending
            self._plan, self._pending, self._previous = back, None, None
            self._state = "rolling_back"
            self._recent, self._before = [], []
            self._rolled_back = True
            return decide("rollback", back, why, predicted)
        self._pending, self._previous = None, None
        self._state = "steady"
        self._rolled_back = False
        self._reference = window.medians.tolist()
        accepted = f"non-inferior (x{ratio:.3f} vs before)"
        if sig.imbalanced and ratio < 1.0:
            # The change helped, and the plan just validated is still significantly
            # imbalanced. Right after a change the likeliest cause is the model's error at
            # the new sizes, which this window's observations have just corrected, not a
            # transient straggler: refine now rather than after `persistence` more windows
            # (cold start identifies the affine part only once a second size is measured).
            # A change that did not help ends the chain: no drift through plans that are
            # each within the non-inferiority margin of the one before.
            refined = self._propose(window, f"{accepted}; still imbalanced: refined", decide)
            if refined.kind == "propose":
                return replace(refined, validated=True)
        return replace(decide("accept", None, accepted, predicted), validated=True)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The full state as JSON-able data (configuration is not included)."""
        return controller_state_dict(self)

    #: Check saved state against the run's ``B`` and ``N`` without loading it (every rank can
    #: run it; only rank 0 holds a controller): see
    #: :func:`~lightning_rex.core.controller_state.check_controller_state`.
    check_state = staticmethod(check_controller_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a controller built with the same arguments.

        Args:
            d: A dict from :meth:`state_dict` (possibly through a JSON round trip).

        Raises:
            StateError: Naming the field, when the state does not fit this controller
                (see :meth:`check_state`).
        """
        load_controller_state(self, d)
