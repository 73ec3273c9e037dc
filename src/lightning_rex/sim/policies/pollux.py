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
* **Throughput model** (sec. 3.2). Per replica, at micro-batch ``m`` with ``s`` gradient
  accumulation steps::

      T_grad(m) = alpha_grad + beta_grad * m
      T_iter(m, s) = s * T_grad(m) + (T_grad(m)^gamma + T_sync^gamma)^(1 / gamma)

  ``T_sync`` is the all-reduce (a constant here: the allocation is fixed, so the paper's
  dependence on the number of nodes and replicas is one value), and ``gamma >= 1`` models how
  much of it overlaps the backward pass (1: none; large: all). The parameters are fitted to
  the measured ``T_grad`` and ``T_iter`` by least squared *log* error (the paper's fit), with
  every parameter ``>= 0``. The agent measures both times apart, as Pollux's agent profiles
  the compute and the synchronising step apart (:class:`Throughput`). *Its start* is ours:
  until two micro-batch sizes have been measured, the ``T_grad`` fit is under-determined, and
  the one measured time is split evenly between ``alpha_grad`` and ``beta_grad * m``, which
  makes Pollux try a larger batch and learn the slope there; ``gamma`` starts at 1 and moves
  only when times at several sizes call for it.
* **Batch size** (sec. 4.1): the agent re-fits the model and re-chooses the batch that
  maximises predicted goodput every 30 seconds of training (its reporting period), over
  the global batches of the configured range (in steps of ``N``). On a scenario whose memory
  is soft (pass caps, :mod:`lightning_rex.sim.scenarios.memory`), a batch larger than the replicas'
  memory takes the fewest accumulation steps that fit its split, as Pollux does; hard caps
  (``mem_cap``) bound the batch instead, since the simulator cannot run past them.
* **The split.** ``pollux`` gives every replica the same micro-batch: Pollux models
  homogeneous replicas and has no notion of an uneven split, so on a mixed cluster it runs
  at the speed of the slowest GPU. ``pollux-split`` (``PolluxPolicy(split=...)``) is our
  variant that separates the two gains rex makes: Pollux's batch choice, unchanged, with
  each chosen batch split by the given rule (the simulator passes the oracle's minimax
  plan, :func:`~lightning_rex.sim.policies.builtin.oracle_plan`). Its throughput model then sees the
  split's iteration times, as a function of the mean micro-batch ``B / N``.
* **Learning rate**: AdaScale (Pollux's default for SGD). The simulator's progress model
  (:mod:`lightning_rex.sim.scenarios.workload`) already assumes a learning rate that follows
  the batch, so the rule changes no figure here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.scaling.noise_scale import noise_estimates
from lightning_rex.core.window import Window
from lightning_rex.sim.policies.base import PolicyBase, PolicyInfo

__all__ = ["PolluxPolicy", "Throughput", "fit_grad_time", "fit_throughput"]

_PERIOD_S = 30.0
"""Seconds of training between re-choices of the batch (the agent's reporting period)."""
_DECAY = 0.99
"""Per-step decay of the noise scale's moving averages."""
_GAMMA_MAX = 10.0
"""The largest overlap exponent fitted (beyond it the two terms are a maximum)."""


@dataclass(frozen=True)
class Throughput:
    """Pollux's fitted throughput model of one job on its allocation (module docstring).

    Attributes:
        alpha_grad: Seconds of a replica's compute that do not grow with its micro-batch.
        beta_grad: Seconds per sample of a replica's compute.
        t_sync: Seconds of the gradient all-reduce.
        gamma: The overlap exponent, ``>= 1``.
    """

    alpha_grad: float
    beta_grad: float
    t_sync: float
    gamma: float = 1.0

    def grad_time(self, m: np.ndarray) -> np.ndarray:
        """``T_grad(m) = alpha_grad + beta_grad * m``, seconds."""
        return self.alpha_grad + self.beta_grad * np.asarray(m, dtype=np.float64)

    def iteration_time(self, m: np.ndarray, s: np.ndarray | int = 0) -> np.ndarray:
        """``T_iter(m, s) = s T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)``, seconds.

        Args:
            m: Per-replica micro-batch sizes.
            s: Gradient accumulation steps before the synchronising one (0: none).

        Returns:
            Seconds per iteration, the shape of ``m``.
        """
        t_grad = self.grad_time(m)
        gamma = self.gamma
        both = (t_grad**gamma + self.t_sync**gamma) ** (1.0 / gamma)
        return np.asarray(s, dtype=np.float64) * t_grad + both


def fit_grad_time(m: np.ndarray, t: np.ndarray, count: np.ndarray) -> tuple[float, float]:
    """Fit ``T_grad(m) = alpha + beta * m`` by least squared log error (Pollux, sec. 3.2).

    Args:
        m: Distinct per-replica batch sizes measured.
        t: The mean compute time at each, seconds.
        count: Iterations measured at each (the weights).

    Returns:
        ``(alpha, beta)``, both >= 0; with one size, half of its time each (our start).
    """
    sizes, times, weights = (np.asarray(x, dtype=np.float64) for x in (m, t, count))
    if sizes.size == 1:  # under-determined: half fixed, half per sample (module docstring)
        return float(times[0]) / 2.0, float(times[0]) / (2.0 * float(sizes[0]))
    scale = float(times.max())

    def loss(p: np.ndarray) -> float:
        pred = np.maximum(p[0] + p[1] * sizes, 1e-12)
        return float(np.sum(weights * (np.log(pred) - np.log(times / scale)) ** 2) / weights.sum())

    start = np.array([0.5 * times.min() / scale, 0.5 * times.min() / scale / sizes.min()])
    res = optimize.minimize(loss, start, bounds=[(0.0, None), (0.0, None)], method="L-BFGS-B")
    return float(res.x[0]) * scale, float(res.x[1]) * scale


def fit_throughput(
    m: np.ndarray,
    t_grad: np.ndarray,
    t_iter: np.ndarray,
    count: np.ndarray,
    accumulation: np.ndarray | None = None,
) -> Throughput:
    """Fit Pollux's throughput model to measured compute and iteration times.

    ``T_grad`` comes from :func:`fit_grad_time`; ``T_sync`` and ``gamma`` then minimise the
    squared log error of the predicted iteration times, from ``gamma = 1`` and the measured
    difference ``T_iter - T_grad`` as the start (``gamma`` in ``[1, 10]``).

    Args:
        m: Distinct per-replica batch sizes measured.
        t_grad: The mean compute time of one pass at each (the slowest replica's), seconds.
        t_iter: The mean iteration time at each, seconds.
        count: Iterations measured at each (the weights).
        accumulation: The accumulation steps at each; None: none.

    Returns:
        The fitted :class:`Throughput`.
    """
    sizes, grad_times, iter_times, weights = (
        np.asarray(x, dtype=np.float64) for x in (m, t_grad, t_iter, count)
    )
    acc = np.zeros(sizes.shape) if accumulation is None else np.asarray(accumulation, np.float64)
    alpha, beta = fit_grad_time(sizes, grad_times, weights)
    sync0 = max(float(np.sum(weights * (iter_times - (acc + 1) * grad_times)) / weights.sum()), 0.0)
    if sizes.size < 2 or sync0 == 0.0:  # nothing to tell the overlap apart
        return Throughput(alpha, beta, sync0, 1.0)
    scale = float(iter_times.max())
    pred_g = (alpha + beta * sizes) / scale

    def loss(p: np.ndarray) -> float:
        both = acc * pred_g + (pred_g ** p[1] + p[0] ** p[1]) ** (1.0 / p[1])
        return float(
            np.sum(weights * (np.log(np.maximum(both, 1e-12)) - np.log(iter_times / scale)) ** 2)
        )

    res = optimize.minimize(
        loss,
        np.array([sync0 / scale, 1.0]),
        bounds=[(0.0, None), (1.0, _GAMMA_MAX)],
        method="L-BFGS-B",
    )
    return Throughput(alpha, beta, float(res.x[0]) * scale, float(res.x[1]))


class PolluxPolicy(PolicyBase):
    """Pollux's goodput-optimal batch size, re-chosen every 30 s (module docstring).

    Args:
        split: How a chosen global batch is split over the ranks; None: evenly, as Pollux
            does (``pollux``). Given: ``pollux-split``, Pollux's choice under that split.
    """

    def __init__(self, split: Callable[[int], Plan] | None = None) -> None:
        self.split = split
        self.name = "pollux" if split is None else "pollux-split"

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
        world_size = info.world_size
        low, high = info.batch_range
        # soft memory (pass caps): a larger micro-batch accumulates; hard caps bound the batch
        self.caps = tuple(info.pass_caps) if info.pass_caps is not None else None
        hard = [c for c in info.max_sizes if c is not None]
        if hard and self.split is None:  # every replica the same: the smallest cap bounds it
            high = min(high, world_size * min(hard))
        elif hard and len(hard) == world_size:  # split: up to every cap full
            high = min(high, sum(hard))
        self.batches = np.arange(max(low, world_size * info.min_size), high + 1, world_size)
        # measured (slowest compute, iteration) times by global batch
        self._times: dict[int, list[tuple[float, float]]] = {}
        self._g = self._s = self._w = 0.0
        self._clock = 0.0
        self._next = _PERIOD_S
        self.base = info.global_batch
        self.batch = info.global_batch
        self.rollbacks = 0
        self.model: Throughput | None = None
        self._pass_memo: dict[int, int] = {}
        self.start_plan = None if self.split is None else self.split(info.global_batch)

    @property
    def phi(self) -> float | None:
        """The smoothed noise scale, or None before the first estimate."""
        if self._w == 0.0:
            return None
        grad_sqr = self._g / self._w
        return math.inf if grad_sqr <= 0 else max(0.0, self._s / self._w) / grad_sqr

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
        grad_sqr, grad_var = noise_estimates(weighted_local_sq, global_sq, plan)
        if math.isfinite(grad_sqr) and math.isfinite(grad_var):
            self._g = _DECAY * self._g + (1 - _DECAY) * grad_sqr
            self._s = _DECAY * self._s + (1 - _DECAY) * grad_var
            self._w = _DECAY * self._w + (1 - _DECAY)

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Record the step's times; every 30 s, re-choose the batch.

        Args:
            step: The step just run.
            times: Every rank's compute time of the step.
            plan: The plan it ran under.

        Returns:
            The plan of the new batch, or None.
        """
        best = self.rechoose(times, plan)
        if best is None or best == self.batch:
            return None
        self.batch = best
        return self.plan_for(best)

    def rechoose(self, times: np.ndarray, plan: Plan) -> int | None:
        """Record a step's times; at the end of a period, the batch of best goodput.

        Args:
            times: Every rank's compute time of the step.
            plan: The plan it ran under.

        Returns:
            :meth:`choose`'s batch when the step ends a period (it may be the batch in
            force), else None.
        """
        grad = float(np.max(times))
        iter_time = grad + self.info.comm
        self._times.setdefault(sum(plan), []).append((grad, iter_time))
        self._clock += iter_time
        if self._clock < self._next:
            return None
        self._next = self._clock + _PERIOD_S
        return self.choose()

    def accumulation(self, batch: np.ndarray) -> np.ndarray:
        """The accumulation steps of each global batch: its split's most passes, less one.

        Args:
            batch: Global batches.

        Returns:
            The steps before the synchronising one (0: the batch fits in one pass), the
            shape of ``batch``.
        """
        batch = np.asarray(batch, dtype=np.int64)
        if self.caps is None or all(c is None for c in self.caps):
            return np.zeros(batch.shape, dtype=np.int64)
        return np.array([self._passes(int(b)) - 1 for b in batch.reshape(-1)]).reshape(batch.shape)

    def _passes(self, batch: int) -> int:
        if batch not in self._pass_memo:
            caps = self.caps or ()
            self._pass_memo[batch] = max(
                -(-m // c) if c is not None else 1 for m, c in zip(self.plan_for(batch), caps)
            )
        return self._pass_memo[batch]

    def choose(self) -> int | None:
        """The batch of highest predicted goodput, or None without a noise estimate."""
        phi = self.phi
        if phi is None:
            return None
        world_size = self.info.world_size
        seen = sorted(self._times)
        rows = [np.asarray(self._times[b]) for b in seen]
        acc = self.accumulation(np.array(seen))
        self.model = fit_throughput(
            np.array(seen, dtype=np.float64) / (world_size * (acc + 1)),
            np.array([r[:, 0].mean() for r in rows]) / (acc + 1),
            np.array([r[:, 1].mean() for r in rows]),
            np.array([len(r) for r in rows]),
            acc,
        )
        batch = self.batches
        accum_steps = self.accumulation(batch)
        time = self.model.iteration_time(batch / (world_size * (accum_steps + 1)), accum_steps)
        if not math.isfinite(phi):  # all noise: the largest batch
            return int(batch[-1])
        eff = (phi + self.base) / (phi + batch)
        goodput = batch / np.maximum(time, 1e-12) * eff
        return int(batch[int(np.argmax(goodput))])

    def plan_for(self, batch: int) -> Plan:
        """The split of ``batch``: ``split``'s, or every replica the same (remainder first)."""
        if self.split is not None:
            return self.split(int(batch))
        world_size = self.info.world_size
        base, remainder = divmod(int(batch), world_size)
        return tuple(base + (1 if i < remainder else 0) for i in range(world_size))

    def observe(self, window: Window) -> Plan | None:
        """Pollux acts at its own period (:meth:`observe_step`), not at windows."""
        return None
