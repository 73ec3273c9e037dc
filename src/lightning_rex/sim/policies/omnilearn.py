"""OmniLearn, re-implemented from its publication (see :class:`OmniLearnPolicy`)."""

from __future__ import annotations

import numpy as np

from lightning_rex.core.plans.minimax import repair_plan
from lightning_rex.core.plans.plan import Plan
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.peers import StepPolicy

__all__ = ["OmniLearnPolicy", "omnilearn_adjust"]


def omnilearn_adjust(
    sizes: np.ndarray,
    times: np.ndarray,
    total: int,
    lo: np.ndarray,
    hi: np.ndarray,
    threshold: float = 0.2,
) -> np.ndarray:
    """OmniLearn's once-per-epoch rule, raw: the result may overshoot ``total`` or go negative.

    With ``t_bar`` the mean of the per-worker mean step times, each worker with
    ``|t_r - t_bar| >= threshold * t_bar`` proposes ``b_r * t_bar / t_r`` (the proportional
    controller ``b_r - (b_r / t_r)(t_r - t_bar)``); the others keep ``b_r``. Proposals are
    clipped to the bounds and rounded up, then ``k = sum - total`` is spread additively,
    ``b_r <- ceil(b_r - k / N)``, which overshoots ``total`` by ``k mod N``. Authors over
    summary: the clipped proposals are rounded up *before* the spread too (the authors also
    share the clipped excess equally, which cancels exactly in the spread, so it is omitted).

    Args:
        sizes: The sizes the epoch ran, shape ``(N,)``.
        times: Per-worker mean compute times over the epoch (seconds), shape ``(N,)``.
        total: The global batch ``B``.
        lo: Per-worker minimum sizes.
        hi: Per-worker maximum sizes.
        threshold: The relative deviation that triggers a change (20%).

    Returns:
        The raw integer sizes, shape ``(N,)``.
    """
    b, t = np.asarray(sizes, dtype=np.float64), np.asarray(times, dtype=np.float64)
    t_bar = float(t.mean())
    proposal = np.where(np.abs(t - t_bar) >= threshold * t_bar, b * t_bar / t, b)
    rounded = np.ceil(np.clip(proposal, lo, hi)).astype(np.int64)
    k = int(rounded.sum()) - int(total)
    return rounded - k // len(rounded)  # == ceil(rounded - k / N), in exact integer arithmetic


class OmniLearnPolicy(StepPolicy):
    """OmniLearn: proportional batch adjustment once an epoch, with a 20% deadband.

    S. Tyagi and P. Sharma, "OmniLearn: A Framework for Distributed Deep Learning over
    Heterogeneous Clusters", IEEE Transactions on Parallel and Distributed Systems 36(6),
    1253-1267 (2025), doi:10.1109/TPDS.2025.3553066, arXiv:2503.17469 (code:
    github.com/sahiltyagi4/OmniLearn). After every ``epoch_steps`` steps the per-worker mean
    step times go through :func:`omnilearn_adjust`. The only departure from the published
    rule: its raw sizes, which may overshoot ``B`` or be negative, are made a valid plan for
    the fixed-``B`` simulator by :func:`repair_plan`; ``repairs`` counts how often that
    changed them (``last_raw`` keeps the latest raw sizes).

    Args:
        threshold: The deadband (20%).
        epoch_steps: Steps per epoch; None takes ``info.epoch_steps`` (300 if absent).
    """

    name = "omnilearn"

    def __init__(self, threshold: float = 0.2, epoch_steps: int | None = None) -> None:
        self.threshold, self._epoch_steps, self.repairs = float(threshold), epoch_steps, 0

    def _start(self, info: PolicyInfo) -> None:
        steps = self._epoch_steps or int(info.epoch_steps)
        self.epoch_steps, self.repairs = max(1, int(steps)), 0
        self._sum, self._count = np.zeros(info.world_size), 0
        self.last_raw: np.ndarray | None = None

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Accumulate one step; at the end of an epoch, adjust.

        Args:
            step: The step just run.
            times: Its per-rank compute times (seconds), shape ``(N,)``.
            plan: The plan it ran.

        Returns:
            The plan for ``step + 1``, or None to keep ``plan``.
        """
        self._sum = self._sum + np.asarray(times, dtype=np.float64)
        self._count += 1
        if self._count < self.epoch_steps:
            return None
        mean = self._sum / self._count
        self._sum, self._count = np.zeros_like(mean), 0
        if not np.all(mean > 0):
            return None
        sizes = np.asarray(plan, dtype=np.int64)
        raw = omnilearn_adjust(
            sizes, mean, self.info.global_batch, self.lo, self.hi, self.threshold
        )
        fixed = repair_plan(raw, self.info.global_batch, self.lo, self.hi)
        self.last_raw, self.repairs = raw, self.repairs + (not np.array_equal(fixed, raw))
        new = tuple(int(x) for x in fixed)
        return new if new != tuple(plan) else None
