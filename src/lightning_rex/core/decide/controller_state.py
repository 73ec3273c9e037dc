"""The controller's working state: one object, its checks and its JSON round trip.

:class:`ControllerState` holds everything the controller's state machine moves between
windows (the plan in force, the phase, a change in flight, the windows kept as evidence);
its methods are the transitions that reset several fields at once, so no field is reset by
hand elsewhere. :func:`check_controller_state` checks a saved controller, field by field,
before anything is loaded (every rank runs it; only rank 0 holds a controller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.window import Window

__all__ = ["BASELINE_WINDOWS", "ControllerState", "Phase"]

BASELINE_WINDOWS = 4
"""The most steady windows before a trigger that form a change's baseline."""

Phase = Literal["steady", "validating", "rolling_back"]
"""The state machine's phase: monitoring, validating a new plan, or waiting for a rollback."""


@dataclass
class ControllerState:
    """What the controller's state machine carries from window to window.

    Attributes:
        global_batch: The global batch ``B`` the plans sum to.
        plan: The plan the controller believes is in force (or about to be).
        phase: ``"steady"``, ``"validating"`` or ``"rolling_back"``.
        pending: The plan being validated.
        previous: The plan before it (a rollback's target).
        rejected: A plan rolled back, until the old plan is back in force.
        predicted: The model's predicted step time of the plan being validated.
        baseline: The old plan's per-step times a new plan is validated against.
        recent: The last ``persistence`` steady windows' per-rank times, ``(N, K)`` each.
        before: Per-step synchronous times of the steady windows under the plan in force
            (oldest first): the next change's baseline.
        changed: A rank's speed changed (a change point) in the windows that triggered the
            proposal in flight.
        trial: Per-step times of the windows measured so far under the plan being validated.
        rolled_back: The last change was rolled back (gains must be twice as large).
        reference: The per-rank medians when the plan in force was accepted.
        fitted_at: The model's window count at the last hyperparameter fit (-1: never).
        refit_wanted: A proposal found a fit due: it runs in the next decision that does not
            plan.
        windows_seen: Whole windows observed.
        shape_cost_s: The measured seconds a step pays for new sizes (0 until measured).
        floors: ``[rank, size, seconds]`` from rolled-back plans: the rank (or one of its
            device group) took about that long there, so the planner predicts it no faster
            from that size up (until its speed changes).
        guess: The plan in force is a guess no window has measured (a new global batch's
            plan, extrapolated by the rank model to sizes it has not run): as the initial
            plan's, its first window is judged as a cold start's.
    """

    global_batch: int
    plan: Plan
    phase: Phase = "steady"
    pending: Plan | None = None
    previous: Plan | None = None
    rejected: Plan | None = None
    predicted: float | None = None
    baseline: list[float] | None = None
    recent: list[list[list[float]]] = field(default_factory=list)
    before: list[list[float]] = field(default_factory=list)
    changed: bool = False
    trial: list[list[float]] = field(default_factory=list)
    rolled_back: bool = False
    reference: list[float] | None = None
    fitted_at: int = -1
    refit_wanted: bool = False
    windows_seen: int = 0
    shape_cost_s: float = 0.0
    floors: list[list[float]] = field(default_factory=list)
    guess: bool = False

    # ------------------------------------------------------------------ transitions
    def restart(self, plan: Plan, global_batch: int | None = None, guess: bool = False) -> None:
        """Put ``plan`` in force, steady, with no change in flight; the evidence is dropped.

        Args:
            plan: The plan now in force.
            global_batch: Its global batch, when it moves (global batch scaling).
            guess: The plan is a guess no window has measured (:attr:`guess`).
        """
        if global_batch is not None:
            self.global_batch = int(global_batch)
        self.plan, self.phase = plan, "steady"
        self.pending = self.previous = self.rejected = None
        self.predicted, self.baseline, self.reference = None, None, None
        self.trial, self.changed, self.rolled_back = [], False, False
        self.recent, self.before = [], []
        self.guess = guess

    def propose(self, plan: Plan, predicted: float, baseline: list[float]) -> None:
        """A new plan goes out: validate it against ``baseline``."""
        self.baseline = baseline
        self.previous, self.pending, self.plan = self.plan, plan, plan
        self.predicted = predicted
        self.phase = "validating"
        self.guess = False
        self.recent, self.before, self.changed, self.trial = [], [], False, []

    def roll_back(self) -> Plan:
        """The plan under validation failed: the previous one goes back out.

        Returns:
            The previous plan.
        """
        assert self.previous is not None
        back = self.previous
        self.rejected = self.pending
        self.plan, self.pending, self.previous = back, None, None
        self.phase = "rolling_back"
        self.baseline, self.trial = None, []
        self.recent, self.before = [], []
        self.rolled_back = True
        return back

    def accept(
        self, medians: list[float], trial: list[list[float]], last: list[list[float]]
    ) -> None:
        """The plan under validation is kept.

        Args:
            medians: The last window's per-rank medians (the new reference).
            trial: The windows measured under it (the next change's baseline).
            last: The last window's per-rank times.
        """
        self.pending, self.previous = None, None
        self.phase = "steady"
        self.rolled_back = False
        self.baseline = None
        self.before, self.trial = trial, []
        self.recent = [last]
        self.reference = medians

    def mark_changes(self, flagged: list[int], model: RankTimeModel, min_effect: float) -> None:
        """Ranks whose curve changed get their older observations discounted.

        A rank changed when its recent median sits more than ``min_effect`` from what the model
        predicts at its current size, or from its median when the plan was accepted, beyond
        three standard errors of the difference (a window median is noisy, and a false change
        point makes a rank forget what it has measured). Once a flagged rank changed, every
        rank that changed as far forgets, flagged or not; those not flagged are looked for
        among all ranks, so their margins are widened to the Bonferroni bound over the ranks
        (the three-sigma tail shared among them: at 4096 ranks a few would pass on noise).

        Args:
            flagged: The ranks a persistent imbalance flagged.
            model: The rank time model (it forgets the changed ranks' older windows).
            min_effect: The practical effect threshold.
        """
        recent = np.median(np.concatenate([np.asarray(w) for w in self.recent], axis=1), axis=1)
        thr = math.log1p(min_effect)
        # a window median's relative standard error: the recent windows' median has its
        # share of it, which counts against the gap (noise is not a change)
        rel_se = math.sqrt(float(model.rel_var[-1])) if model.rel_var else 0.0
        model_gap = np.abs(np.log(recent / model.predict(self.plan)))
        ref_gap = (
            np.abs(np.log(recent / np.asarray(self.reference)))
            if self.reference is not None
            else None
        )

        def gap(widen: float) -> np.ndarray:
            # the model's gap less its noise margin, or the reference's (one window's
            # medians: its own noise counts against the gap), whichever is larger
            out = model_gap - widen * 1.5 * rel_se / math.sqrt(max(1, len(self.recent)))
            if ref_gap is not None:
                out = np.maximum(out, ref_gap - widen * 3.0 * math.sqrt(2) * rel_se)
            return out

        moved = [r for r in flagged if gap(1.0)[r] > thr]
        if moved:
            # the cluster changed: every rank whose curve moved as far forgets, flagged or
            # not (two ranks that slowed together, one of them not flagged yet, would keep
            # the other's fast history, and the plan would give it more work)
            n_ranks = len(recent)
            wide = gap(float(stats.norm.isf(stats.norm.sf(3.0) / n_ranks)) / 3.0)
            moved = sorted({*moved, *(r for r in range(n_ranks) if wide[r] > thr)})
        self.changed = bool(moved)
        if moved:  # measurements changed: what a rollback taught about these ranks is stale
            gone = set(moved)
            self.floors = [f for f in self.floors if int(f[0]) not in gone]
            self.rolled_back = False  # a new cluster: gains are worth proposing again
            model.forget(moved, keep_last=len(self.recent))

    def measure_shape_cost(self, window: Window, previous: Plan) -> None:
        """Learn what a step pays for new sizes, from a new plan's first window.

        Its first step is the plan's first: the ranks whose size changed pay for the new
        shape there. The step's cost is the largest such rank's first time above the
        median of its others; a running mean of those is kept.

        Args:
            window: The first window under the new plan (starting at its first step).
            previous: The plan before it.
        """
        if window.n_steps < 3:
            return
        times = window.times
        changed = [r for r, (a, b) in enumerate(zip(window.plan, previous)) if a != b]
        if not changed:
            return
        extra = max(float(times[r, 0] - np.median(times[r, 1:])) for r in changed)
        cost = max(0.0, extra)
        self.shape_cost_s = cost if self.shape_cost_s == 0.0 else 0.5 * (self.shape_cost_s + cost)

    def back_in_force(self, plan: Plan) -> None:
        """A window under ``plan``: if it is the plan a rollback went back to, steady again."""
        if self.phase == "rolling_back" and plan == self.plan:
            self.phase, self.rejected = "steady", None

    def decline(self) -> None:
        """The last plan out will not be applied (see ``Controller.decline``)."""
        if self.phase == "validating" and self.previous is not None:
            self.plan = self.previous
            self.pending, self.previous, self.baseline = None, None, None
            self.phase = "steady"
            self.recent, self.before, self.trial = [], [], []
            self.changed = False
        elif self.phase == "rolling_back" and self.rejected is not None:
            self.plan, self.rejected = self.rejected, None
            self.phase = "steady"
            self.recent, self.before = [], []

    def baseline_for(self, last: list[float], trigger: int, margin: float) -> list[float]:
        """The old plan's per-step times that a new plan is validated against.

        The windows that triggered the proposal were selected for looking imbalanced, and
        regression to the mean would flatter any change measured against them. So the
        baseline is the (up to ``BASELINE_WINDOWS``) steady windows under the old plan
        *before* the trigger. Exceptions, where those windows do not measure the cluster the
        new plan runs on: a rank's speed changed (a change point was marked), the step time
        under the old plan moved by more than the margin between them and the trigger (a
        drift too slow for a change point), or there are none (cold start, a refinement
        right after a validation). Then the trigger windows are the baseline.

        Args:
            last: The last window's per-step times (the baseline when nothing else is).
            trigger: The windows that triggered the proposal (the last of ``before``).
            margin: The non-inferiority margin.

        Returns:
            Per-step synchronous times.
        """
        before = self.before[: max(0, len(self.before) - trigger)][-BASELINE_WINDOWS:]
        trig = self.before[-trigger:] if trigger > 0 else []
        flat_trig = [t for w in trig for t in w] or last
        if not before or self.changed:
            return flat_trig
        flat = [t for w in before for t in w]
        moved = abs(float(np.mean(np.log(flat_trig)) - np.mean(np.log(flat))))
        return flat_trig if moved > math.log1p(margin) else flat

    # ------------------------------------------------------------------ round trip
    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields, under the names checkpoints have always used."""
        return {
            "global_batch": self.global_batch,
            "plan": list(self.plan),
            "state": self.phase,
            "pending": None if self.pending is None else list(self.pending),
            "previous": None if self.previous is None else list(self.previous),
            "rejected": None if self.rejected is None else list(self.rejected),
            "predicted": self.predicted,
            "baseline": self.baseline,
            "recent": self.recent,
            "fitted_at": self.fitted_at,
            "refit_wanted": self.refit_wanted,
            "reference": self.reference,
            "windows_seen": self.windows_seen,
            "before": self.before,
            "trial": self.trial,
            "rolled_back": self.rolled_back,
            "changed": self.changed,
            "shape_cost_s": self.shape_cost_s,
            "floors": self.floors,
            "guess": self.guess,
        }

    @classmethod
    def from_checked(cls, s: dict[str, Any]) -> ControllerState:
        """Build from :func:`check_controller_state` output.

        Args:
            s: The checked state.

        Returns:
            The state.
        """
        return cls(
            global_batch=sum(s["plan"]),
            plan=s["plan"],
            phase=s["state"],
            pending=s["pending"],
            previous=s["previous"],
            rejected=s["rejected"],
            predicted=s["predicted"],
            baseline=s["baseline"],
            recent=s["recent"],
            before=s["before"],
            changed=s["changed"],
            trial=s["trial"],
            rolled_back=s["rolled_back"],
            reference=s["reference"],
            fitted_at=s["fitted_at"],
            refit_wanted=s["refit_wanted"],
            windows_seen=s["windows_seen"],
            shape_cost_s=s["shape_cost_s"],
            floors=s["floors"],
            guess=s["guess"],
        )
