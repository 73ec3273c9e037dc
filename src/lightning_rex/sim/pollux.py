"""Pollux's job-level batch size choice, re-implemented from the paper for the simulator.

Source: A. Qiao, S. K. Choe, S. J. Subramanya, W. Neiswanger, Q. Ho, H. Zhang, G. R. Ganger,
E. P. Xing, *Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning*,
OSDI 2021 (sections 3 and 4.1). Written from the published algorithm, not from its code.
What a Pollux job (its PolluxAgent, on a fixed allocation) does, as simulated here:

* **Goodput** = system throughput x statistical efficiency. The efficiency of a global batch
  ``M`` relative to the initial ``M0`` is ``(phi + M0) / (phi + M)`` (eq. 4), with ``phi``
  the gradient noise scale, estimated every iteration from the replicas' local gradients
  against the all-reduced one and smoothed by exponential moving averages (sec. 3.1;
  :func:`~lightning_rex.core.scaling.noise_scale.noise_estimates` on the even plan is that
  estimator, with the same decay as rex's scaler, 0.99).
* **Throughput model** (sec. 3.2): ``T_iter(m) = T_grad(m) + T_sync`` with
  ``T_grad(m) = alpha + beta * m``, ``m`` the per-replica batch; the allocation is fixed,
  so the synchronisation time is a constant and is folded into ``alpha``. The parameters are
  fitted to the measured iteration times by minimising the root mean squared *log* error
  (the paper's fit), with ``alpha, beta >= 0``. Until two per-replica sizes have been
  measured the fit is under-determined; the one measured time is then split evenly between
  ``alpha`` and ``beta * m`` (our choice: the paper leaves this start open), which makes
  Pollux try a larger batch and learn the slope there.
* **Batch size** (sec. 4.1): the agent re-fits the model and re-chooses the batch that
  maximises predicted goodput every 30 seconds of training (its reporting period),
  from per-replica sizes in the configured range. Every replica gets the same micro-batch:
  Pollux models homogeneous replicas and has no notion of an uneven split, so on a mixed
  cluster it runs at the speed of the slowest GPU. No gradient accumulation is simulated.
* **Learning rate**: AdaScale (Pollux's default for SGD). The simulator's progress model
  (:mod:`lightning_rex.sim.workload`) already assumes a learning rate that follows the batch,
  so the rule changes no figure here.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.scaling.noise_scale import noise_estimates
from lightning_rex.core.window import Window
from lightning_rex.sim.policy import PolicyBase, PolicyInfo

__all__ = ["PolluxPolicy", "fit_throughput"]

_PERIOD_S = 30.0
"""Seconds of training between re-choices of the batch (the agent's reporting period)."""
_DECAY = 0.99
"""Per-step decay of the noise scale's moving averages."""


def fit_throughput(m: np.ndarray, t: np.ndarray, count: np.ndarray) -> tuple[float, float]:
    """Fit ``T(m) = alpha + beta * m`` by least squared log error (Pollux, sec. 3.2).

    Args:
        m: Distinct per-replica batch sizes measured.
        t: The mean iteration time at each, seconds.
        count: Iterations measured at each (the weights).

    Returns:
        ``(alpha, beta)``, both >= 0.
    """
    m, t, w = (np.asarray(x, dtype=np.float64) for x in (m, t, count))
    if m.size == 1:  # under-determined: half fixed, half per sample (module docstring)
        return float(t[0]) / 2.0, float(t[0]) / (2.0 * float(m[0]))
    scale = float(t.max())

    def loss(p: np.ndarray) -> float:
        pred = np.maximum(p[0] + p[1] * m, 1e-12)
        return float(np.sum(w * (np.log(pred) - np.log(t / scale)) ** 2) / w.sum())

    x0 = np.array([0.5 * t.min() / scale, 0.5 * t.min() / scale / m.min()])
    res = optimize.minimize(loss, x0, bounds=[(0.0, None), (0.0, None)], method="L-BFGS-B")
    return float(res.x[0]) * scale, float(res.x[1]) * scale


class PolluxPolicy(PolicyBase):
    """Pollux's goodput-optimal batch size, re-chosen every 30 s (module docstring)."""

    name = "pollux"

    def reset(self, info: PolicyInfo) -> None:
        """Start at the run's batch with no estimates.

        Args:
            info: The run; ``batch_range`` must be set.

        Raises:
            ValueError: Without a batch range.
        """
        if info.batch_range is None:
            raise ValueError("the pollux policy needs a batch range (a workload scenario)")
        self.info = info
        n = info.world_size
        lo, hi = info.batch_range
        caps = [c for c in info.max_sizes if c is not None]
        top = min(hi // n, min(caps) if caps else hi // n)
        self.sizes = np.arange(max(info.min_size, -(-lo // n)), max(top, 1) + 1)
        self._times: dict[int, list[float]] = {}  # iteration times by global batch
        self._g = self._s = self._w = 0.0
        self._clock = 0.0
        self._next = _PERIOD_S
        self.base = info.global_batch
        self.batch = info.global_batch
        self.rollbacks = 0

    @property
    def phi(self) -> float | None:
        """The smoothed noise scale, or None before the first estimate."""
        if self._w == 0.0:
            return None
        g = self._g / self._w
        return math.inf if g <= 0 else max(0.0, self._s / self._w) / g

    def observe_gradients(
        self, step: int, weighted_local_sq: float, global_sq: float, plan: Plan
    ) -> None:
        """Update the noise scale's moving averages with one step's norms.

        Args:
            step: The step just run.
            weighted_local_sq: ``sum_r (b_r / B) |g_r|^2``.
            global_sq: ``|g|^2``.
            plan: The plan it ran under.
        """
        g, s = noise_estimates(weighted_local_sq, global_sq, plan)
        if math.isfinite(g) and math.isfinite(s):
            self._g = _DECAY * self._g + (1 - _DECAY) * g
            self._s = _DECAY * self._s + (1 - _DECAY) * s
            self._w = _DECAY * self._w + (1 - _DECAY)

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Record the iteration time; every 30 s, re-choose the batch.

        Args:
            step: The step just run.
            times: Every rank's compute time of the step.
            plan: The plan it ran under.

        Returns:
            The even plan of the new batch, or None.
        """
        t = float(np.max(times)) + self.info.comm
        self._times.setdefault(sum(plan), []).append(t)
        self._clock += t
        if self._clock < self._next:
            return None
        self._next = self._clock + _PERIOD_S
        best = self.choose()
        if best is None or best == self.batch:
            return None
        self.batch = best
        return self.plan_for(best)

    def choose(self) -> int | None:
        """The batch of highest predicted goodput, or None without a noise estimate."""
        phi = self.phi
        if phi is None:
            return None
        n = self.info.world_size
        seen = sorted(self._times)
        t = np.array([np.mean(self._times[b]) for b in seen])
        c = np.array([len(self._times[b]) for b in seen])
        alpha, beta = fit_throughput(np.array(seen, dtype=np.float64) / n, t, c)
        batch = self.sizes * n
        time = alpha + beta * self.sizes
        eff = np.ones(batch.size) if not math.isfinite(phi) else (phi + self.base) / (phi + batch)
        goodput = np.where(time > 0, batch / np.maximum(time, 1e-12), 0.0) * eff
        if not math.isfinite(phi):  # all noise: the largest batch
            goodput = batch.astype(np.float64)
        return int(batch[int(np.argmax(goodput))])

    def plan_for(self, batch: int) -> Plan:
        """Every replica the same micro-batch (the remainder on the first ranks)."""
        n = self.info.world_size
        q, r = divmod(int(batch), n)
        return tuple(q + (1 if i < r else 0) for i in range(n))

    def observe(self, window: Window) -> Plan | None:
        """Pollux acts at its own period (:meth:`observe_step`), not at windows."""
        return None
