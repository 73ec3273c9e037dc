"""What the two published peers share: the step-policy base and plan repair.

The peers are LBB (:mod:`~lightning_rex.sim.policies.lbb`) and OmniLearn
(:mod:`~lightning_rex.sim.policies.omnilearn`).

Both act after every step through ``observe_step(step, times, plan)`` (a plan returned
applies from ``step + 1``); the raw published rules are pure functions and the policies only
hold state and keep plans valid. The papers' method sections were not readable from here:
details were confirmed against the authors' public code (FLYING37520/LBB,
sahiltyagi4/OmniLearn; read, not copied). Docstrings mark where that overrides the
reviewer's summary (*authors*) and where we filled a gap (*our reading*).
"""

from __future__ import annotations

import numpy as np

from lightning_rex.core.plans.planner import resolve_bounds
from lightning_rex.sim.policies.base import PolicyBase, PolicyInfo

__all__ = ["StepPolicy", "repair_plan"]


def repair_plan(raw: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The smallest change that makes integer sizes a valid plan.

    Clip to ``[lo, hi]``, then take one sample at a time from the largest rank while the sum
    exceeds ``total``, or give one to the smallest while it falls short (ties: lowest rank).

    Args:
        raw: Integer sizes, shape ``(N,)``.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.

    Returns:
        Sizes within the bounds summing to ``total``.

    Raises:
        ValueError: If the bounds cannot hold ``total``.
    """
    if not int(np.sum(lo)) <= total <= int(np.sum(hi)):
        raise ValueError(f"bounds sum to [{int(np.sum(lo))}, {int(np.sum(hi))}], not {total}")
    b = np.clip(np.asarray(raw, dtype=np.int64), lo, hi)
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    while (diff := int(b.sum()) - total) != 0:
        if diff > 0:
            b[int(np.argmax(np.where(b > lo, b, small)))] -= 1
        else:
            b[int(np.argmin(np.where(b < hi, b, big)))] += 1
    return b


class StepPolicy(PolicyBase):
    """What both peers share: the bounds, no window hook, no rollbacks."""

    def reset(self, info: PolicyInfo) -> None:
        """Prepare for a run.

        Args:
            info: The run's global batch, world size and bounds (and, for OmniLearn, the
                epoch length ``epoch_steps``).
        """
        self.info, self.rollbacks = info, 0
        self.lo, self.hi = resolve_bounds(
            info.world_size, info.global_batch, info.min_size, info.max_sizes
        )
        self._start(info)

    def _start(self, info: PolicyInfo) -> None:
        """Reset the peer's own state."""
