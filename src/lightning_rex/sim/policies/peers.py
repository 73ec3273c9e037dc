"""What the two published peers share: the step-policy base.

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

from lightning_rex.core.plans.minimax import resolve_bounds
from lightning_rex.sim.policies.base import PolicyBase, PolicyInfo

__all__ = ["StepPolicy"]


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
