"""Goodput-guided choice of the global batch, validated like a plan (REX_METHOD.md, sec. 5).

**Objective.** Goodput(B) = throughput(B) x statistical efficiency(B) (Pollux, Qiao et al.,
OSDI 2021): samples per second times the progress per sample relative to the base batch
``B0`` (:func:`~lightning_rex.core.scaling.noise_scale.statistical_efficiency`, from the smoothed
gradient noise scale). Its logarithm is

    log B + log E(B) - log t(B),

with ``t(B)`` the synchronous step time of the best plan for ``B``.

**Model (1-D Bayesian optimisation).** The prior mean of ``log t(B)`` comes from the rank time
model: the water-filled plan for ``B`` and its predicted step time (``predict``, supplied by
the caller; :meth:`~lightning_rex.core.decide.controller.Controller.predict_step_time`). The
residual ``log t_measured(B) - log t_predicted(B)`` of every window measured at some ``B`` is
modelled by a BoTorch ``SingleTaskGP`` whose kernel is the same spline kernel as the rank
model's (:class:`~lightning_rex.core.model.kernels.SplineKernel` on ``log B`` over
``[min_global_batch, max_global_batch]``), with each window's noise variance fixed from its
own steps and every window's prediction remade with the rank model as it is now
(:meth:`BatchScaler.refresh`; :mod:`~lightning_rex.core.scaling.residual`). The next ``B``
maximises the upper confidence bound of log goodput (BoTorch's ``UpperConfidenceBound`` of
the residual, plus the known terms) over a geometric grid of candidates; it is proposed
only when its posterior-mean goodput beats the current one by ``min_gain``.

**Validation.** After a change the new batch's window is compared with the windows before it
at the old batch: the goodput ratio is ``k t_old / t_new`` with ``k = B' E(B') / (B E(B))``,
and the time ratio's confidence bounds come from the non-inferiority machinery (difference of
mean log step times, Newey-West). The change is kept when the gain is significant (the
lower confidence bound of the goodput ratio is above 1); otherwise it is rolled back.
``min_gain`` is the proposal's hysteresis, not the verdict's: a trial shown better than the
batch before it is kept even when its measured gain is below ``min_gain``, since a rollback
would return to a batch shown worse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_rex.core.saved import StateError, whole
from lightning_rex.core.saved import field as state_field
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.scaling.noise_scale import (
    NoiseScale,
    lr_factor,
    statistical_efficiency,
)
from lightning_rex.core.scaling.residual import (
    GoodputObservation,
    check_observation,
    log_batch_input,
    refresh_predictions,
    residual_gp,
    residual_posterior,
)
from lightning_rex.core.stats.noninferiority import long_run_variance, non_inferiority

__all__ = [
    "EARLY_STEPS",
    "FAR_GAIN",
    "STEP_LIMIT",
    "BatchScaler",
    "BatchVerdict",
]


_MAX_OBS = 64
"""Windows of goodput evidence kept: past it, the oldest window of the batch with the most
windows is dropped, so that a batch tried once (and rolled back) stays known."""


def _log_time(seconds: float) -> float:
    """``log`` of a predicted step time, +inf (no goodput) where it is not positive.

    An affine fit far below the sizes it has seen can extrapolate to a negative time.
    """
    return math.log(seconds) if seconds > 0 and math.isfinite(seconds) else math.inf


STEP_LIMIT = 2.0
"""The most one change multiplies or divides the global batch by, unless the posterior mean
promises :data:`FAR_GAIN` beyond it."""
FAR_GAIN = 1.5
"""The predicted goodput gain that lets a change leave the trust region of :data:`STEP_LIMIT`."""
EARLY_STEPS = 10
"""The fewest steps of noise estimates a change may rest on (a sequential test's start)."""


@dataclass(frozen=True)
class BatchVerdict:
    """The validation of a change of the global batch.

    Attributes:
        keep: Keep the new batch (else roll back).
        gain: The measured goodput ratio, new over old.
        lower: Its lower confidence bound.
        efficiency_ratio: ``k = B' E(B') / (B E(B))``, the progress-per-step ratio.
        frozen: The noise estimate stopped moving during the trial (the last steps had no
            finite gradient norms): the efficiency is unknown, so the change is not kept.
    """

    keep: bool
    gain: float
    lower: float
    efficiency_ratio: float
    frozen: bool = False


@dataclass
class BatchScaler:
    """The global batch's Bayesian optimisation and its noise scale (module docstring).

    Args:
        config: The settings.
        base_batch: ``B0``, the batch the learning rate was tuned for (the run's first).
        world_size: The number of ranks (the smallest possible batch).

    Attributes:
        noise: The gradient noise scale's moving averages.
    """

    config: GlobalBatchScaling
    base_batch: int
    world_size: int
    noise: NoiseScale = field(init=False)
    _obs: list[GoodputObservation] = field(default_factory=list, init=False)
    _since: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.config.min_global_batch < self.world_size:
            raise ValueError(
                f"min_global_batch={self.config.min_global_batch} is below the world size "
                f"{self.world_size}: every rank needs a sample"
            )
        if not self.config.min_global_batch <= self.base_batch <= self.config.max_global_batch:
            raise ValueError(
                f"the run's global batch {self.base_batch} is outside [min_global_batch, "
                f"max_global_batch] = [{self.config.min_global_batch}, "
                f"{self.config.max_global_batch}]"
            )
        self.noise = NoiseScale(self.config.decay)

    # ------------------------------------------------------------------ evidence
    @property
    def phi(self) -> float | None:
        """The noise scale the scaler plans with, or None while there is none to plan with.

        The estimate (:attr:`NoiseScale.phi`); while its ``|G|^2`` is not yet positive (the
        estimate is infinite: at a small ``B0`` the gradient's signal hides in its noise), the
        lower confidence bound of the recent estimates
        (:meth:`NoiseScale.interval`), when that is finite: a larger batch is then judged on
        the least noise the evidence allows, not held back until the signal shows.
        """
        phi = self.noise.phi
        if phi is None or math.isfinite(phi):
            return phi
        bounds = self.noise.interval(self.config.confidence, EARLY_STEPS)
        return bounds[0] if bounds is not None and math.isfinite(bounds[0]) else None

    def efficiency(self, batch: float) -> float:
        """Statistical efficiency of ``batch`` relative to ``B0`` at the noise scale :attr:`phi`."""
        phi = self.phi
        return 1.0 if phi is None else statistical_efficiency(batch, self.base_batch, phi)

    def lr_factor(self, batch: int) -> float:
        """The learning-rate factor at ``batch`` under the configured rule."""
        grad_sq = 1.0 if self.noise.grad_sq is None else self.noise.grad_sq
        noise = 0.0 if self.noise.noise is None else self.noise.noise
        return lr_factor(self.config.lr_rule, batch, self.base_batch, grad_sq, noise)

    def record(
        self,
        batch: int,
        step_times: np.ndarray,
        predicted_s: float,
        plan: tuple[int, ...] | None = None,
    ) -> None:
        """Take one window's synchronous step times measured at ``batch``.

        Args:
            batch: The global batch the window ran at.
            step_times: Per-step synchronous times in seconds, shape ``(K,)``, ``K >= 2``.
            predicted_s: The rank model's step time of the plan it ran, when it was taken.
            plan: That plan, for :meth:`refresh` to predict it again; None keeps the
                prediction as made.
        """
        log_times = np.log(np.asarray(step_times, dtype=np.float64))
        if (
            log_times.size < 2
            or not np.all(np.isfinite(log_times))
            or not 0 < predicted_s < math.inf
        ):
            return
        var = max(long_run_variance(log_times) / log_times.size, 1e-6)
        self._obs.append(
            GoodputObservation(
                int(batch),
                float(log_times.mean()),
                var,
                math.log(predicted_s),
                None if plan is None else tuple(int(size) for size in plan),
            )
        )
        if len(self._obs) > _MAX_OBS:
            counts: dict[int, int] = {}
            for observation in self._obs:
                counts[observation.batch] = counts.get(observation.batch, 0) + 1
            most = max(counts, key=lambda b: counts[b])
            self._obs.pop(next(i for i, o in enumerate(self._obs) if o.batch == most))
        self._since += 1

    def refresh(self, predict_plan: Callable[[tuple[int, ...]], float]) -> None:
        """Remake every window's prediction with the rank model as it is now.

        Args:
            predict_plan: The rank model's step time (seconds) of a plan.
        """
        refresh_predictions(self._obs, predict_plan)

    @property
    def ready(self) -> bool:
        """Whether enough evidence has accumulated to consider a change now."""
        return (
            self.noise.steps >= min(self.config.min_noise_steps, EARLY_STEPS)
            and self._since >= self._windows_needed
            and not self.noise.frozen  # no B changes on an estimate that stopped moving
            and self.phi is not None
        )

    @property
    def _windows_needed(self) -> int:
        """Windows at the batch in force before a change of it.

        ``windows_between`` once a window has run at another batch (a trial's windows are
        in ``_obs``); one while every window so far ran at ``B0``, when the noise scale's
        sequential test is the evidence (a declined proposal, say in monitor-only mode, is
        then proposed again after one window).
        """
        first = all(o.batch == self.base_batch for o in self._obs)
        return 1 if first else int(self.config.windows_between)

    # ------------------------------------------------------------------ proposal
    def candidates(self, current: int) -> np.ndarray:
        """The geometric grid of batches the acquisition is evaluated on (with ``current``)."""
        config = self.config
        grid = np.geomspace(config.min_global_batch, config.max_global_batch, config.candidates)
        return np.unique(np.r_[np.round(grid).astype(np.int64), int(current)])

    def log_goodput(
        self, batches: np.ndarray, predict: Callable[[int], float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of log goodput at ``batches``.

        Args:
            batches: Global batch sizes.
            predict: The rank model's step time (seconds) of the best plan for a batch.

        Returns:
            ``(mean, sd)`` arrays.
        """
        batch_sizes = np.asarray(batches, dtype=np.int64)
        prior = np.array([_log_time(predict(int(x))) for x in batch_sizes])
        eff = np.log([self.efficiency(float(x)) for x in batch_sizes])
        resid_mean, resid_sd = residual_posterior(self._obs, self.config, batch_sizes)
        mean = np.log(batch_sizes) + eff - (prior + resid_mean)
        return mean, resid_sd

    def propose(
        self, current: int, predict: Callable[[int], float], min_gain: float | None = None
    ) -> tuple[int, float] | None:
        """The next global batch, or None when none is predicted ``min_gain`` better.

        Args:
            current: The global batch in force.
            predict: The rank model's step time (seconds) of the best plan for a batch.
            min_gain: The smallest predicted gain worth a trial now; None for the
                configured ``min_gain`` (a caller that prices the trial passes more).

        Returns:
            ``(batch, predicted goodput ratio over current)``, or None.
        """
        best = self.best(current, predict)
        least = self.config.min_gain if min_gain is None else min_gain
        return None if best is None or best[1] < 1.0 + least else best

    def best(self, current: int, predict: Callable[[int], float]) -> tuple[int, float] | None:
        """The batch the acquisition picks and its predicted gain, whatever the gain.

        Args:
            current: The global batch in force.
            predict: The rank model's step time (seconds) of the best plan for a batch.

        Returns:
            ``(batch, predicted goodput ratio over current)``, or None while the scaler is
            not :attr:`ready`, when the pick is ``current``, or when it is a smaller batch
            argued for by a signal still hidden in the noise.
        """
        import torch

        if not self.ready:
            return None
        grid = self.candidates(current)
        mean, std = self.log_goodput(grid, predict)
        # log goodput = known(B) - r(B), r the residual GP: its UCB is known(B) plus BoTorch's
        # UpperConfidenceBound of r for minimisation, -(mean_r - sqrt(beta) sd_r). Every
        # candidate of the small grid is evaluated (what optimize_acqf_discrete would do).
        known = np.log(grid) + np.log([self.efficiency(float(x)) for x in grid])
        known -= np.array([_log_time(predict(int(x))) for x in grid])
        if self.noise.steps < self.config.min_noise_steps:  # early: the sequential test
            pessimistic = self._pessimistic_efficiency(grid, current)
            if pessimistic is None:
                return None
            mean, known = mean + pessimistic, known + pessimistic
        if self._obs:
            from botorch.acquisition import UpperConfidenceBound

            model = residual_gp(self._obs, self.config)
            acq = UpperConfidenceBound(model, beta=self.config.beta**2, maximize=False)
            with torch.no_grad():
                ucb = known + acq(log_batch_input(grid, self.config).unsqueeze(1)).numpy()
        else:
            ucb = mean + self.config.beta * std
        # a trust region: the rank model extrapolates poorly far from the sizes it has run,
        # and a far trial that fails costs a whole window at a bad batch; a batch beyond it
        # is taken only when its posterior mean promises FAR_GAIN (a far optimum is reached
        # in one change, not in a climb of one validated doubling at a time)
        cur = int(np.flatnonzero(grid == current)[0])
        near = (grid <= current * STEP_LIMIT) & (grid * STEP_LIMIT >= current)
        far = int(np.argmax(mean))
        if (
            not near[far]
            and math.isfinite(mean[far])
            and mean[far] - mean[cur] >= math.log(FAR_GAIN)
        ):
            near = np.ones_like(near)
        best = int(np.argmax(np.where(near, ucb, -np.inf)))
        if not (math.isfinite(mean[best]) and math.isfinite(mean[cur])):
            return None
        gain = math.exp(mean[best] - mean[cur])
        if grid[best] == current:
            return None
        if grid[best] < current and self.phi != self.noise.phi:
            return None  # a signal still hidden in the noise never argues for a smaller batch
        return int(grid[best]), gain

    def _pessimistic_efficiency(self, grid: np.ndarray, current: int) -> np.ndarray | None:
        """Early, what each candidate's log efficiency loses at the pessimistic noise scale.

        Before ``min_noise_steps`` a change is judged on the end of the noise scale's
        one-sided ``confidence`` interval that argues against it: the lower bound for a
        larger batch, the upper for a smaller one (a sequential test). The target is chosen
        on it too, not only vetoed: an early estimate can be many times the true noise scale,
        and its optimum then lies at the largest batch.

        Returns:
            ``log E(B; pessimistic) - log E(B)`` per candidate (0 at ``current``), or None
            while the interval has fewer than :data:`EARLY_STEPS` estimates.
        """
        bounds = self.noise.interval(self.config.confidence, EARLY_STEPS)
        if bounds is None:
            return None
        base = self.base_batch
        out = np.zeros(grid.size)
        for i, batch in enumerate(grid.tolist()):
            phi = bounds[0] if batch > current else bounds[1]
            if batch == current or not math.isfinite(phi):
                continue
            worst = statistical_efficiency(batch, base, phi) / statistical_efficiency(
                current, base, phi
            )
            out[i] = math.log(worst) - math.log(self.efficiency(batch) / self.efficiency(current))
        return out

    def changed(self) -> None:
        """Tell the scaler a change was made (the window count restarts)."""
        self._since = 0

    # ------------------------------------------------------------------ validation
    def validate(
        self,
        old: int,
        new: int,
        old_times: np.ndarray,
        new_times: np.ndarray,
        confidence: float | None = None,
    ) -> BatchVerdict:
        """Keep a change of the global batch only when its goodput gain is shown.

        Args:
            old: The batch before.
            new: The batch after.
            old_times: Per-step synchronous times at ``old`` (the baseline), seconds.
            new_times: Per-step synchronous times at ``new``, seconds.
            confidence: The one-sided confidence of the gain; None for the configured one.

        Returns:
            The :class:`BatchVerdict`.
        """
        k = new * self.efficiency(new) / (old * self.efficiency(old))
        noninf = non_inferiority(
            np.asarray(new_times),
            np.asarray(old_times),
            margin=0.0,
            confidence=self.config.confidence if confidence is None else confidence,
        )
        gain, lower = k / noninf.ratio, k / noninf.upper
        frozen = self.noise.frozen or not math.isfinite(k)
        keep = not frozen and lower > 1.0
        return BatchVerdict(bool(keep), float(gain), float(lower), float(k), frozen)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "base_batch": self.base_batch,
            "noise": self.noise.state_dict(),
            "obs": [
                [o.batch, o.log_t, o.var, o.pred, None if o.plan is None else list(o.plan)]
                for o in self._obs
            ],
            "since": self._since,
        }

    @staticmethod
    def check_state(
        d: Any, config: GlobalBatchScaling, base_batch: int, name: str = "scaler"
    ) -> dict[str, Any]:
        """Check a saved state against this run without loading it.

        Args:
            d: A dictionary from :meth:`state_dict`.
            config: This run's scaling settings.
            base_batch: This run's first global batch ``B0``.
            name: Its dotted name, for errors.

        Returns:
            The state, normalised.

        Raises:
            StateError: Naming the field: another base batch, a noise state that is not
                finite, or an observation at a batch outside the range or with a time,
                variance or prediction that is not a finite number (a positive one for the
                variance), or a plan that does not sum to its batch.
        """
        low, high = config.min_global_batch, config.max_global_batch
        base = whole(state_field(d, "base_batch", name), f"{name}.base_batch", 1)
        if base != base_batch:
            raise StateError(
                f"{name}.base_batch",
                f"is {base}, but this run's first global batch is {base_batch}",
            )
        obs_v = state_field(d, "obs", name)
        if not isinstance(obs_v, list) or len(obs_v) > _MAX_OBS:
            raise StateError(f"{name}.obs", f"must be a list of at most {_MAX_OBS} observations")
        obs = [
            check_observation(entry, f"{name}.obs[{index}]", low, high)
            for index, entry in enumerate(obs_v)
        ]
        return {
            "base_batch": base,
            "noise": NoiseScale.check_state(state_field(d, "noise", name), f"{name}.noise"),
            "obs": obs,
            "since": whole(state_field(d, "since", name), f"{name}.since", 0),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, after checking it.

        Args:
            d: The saved state.

        Raises:
            StateError: Naming the field (see :meth:`check_state`).
        """
        state = self.check_state(d, self.config, self.base_batch)
        self.noise.load_state_dict(d["noise"])
        self._obs = list(state["obs"])
        self._since = state["since"]
