"""The message of an exchange: rank 0's ready decisions, as one small row for every rank.

At an exchange step rank 0 sends ``[decided, imbalance, has plan, more pending, failed,
plan...]`` (float64, ``N + 5`` values; integers up to 2**53 are exact) in one broadcast.
Rank 0 keeps the full decisions for its records; the other ranks need only the plan to
apply, the summary for the progress bar, whether to poll again for a decision still being
computed, and whether rank 0's decider failed (then every rank raises the same error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_rex.core.plans.plan import Plan

__all__ = ["ExchangeMessage"]

_HEAD = 5


@dataclass(frozen=True)
class ExchangeMessage:
    """What every rank learns at an exchange.

    Attributes:
        decided: Rank 0 had at least one decision ready.
        imbalance: The latest ready window's max/min median ratio minus one.
        plan: The plan to apply now, or None.
        more_pending: A decision is still being computed: poll again.
        failed: Rank 0's work failed (its decider, or any local work under the driver's
            guard); every rank raises that error next.
    """

    decided: bool = False
    imbalance: float = 0.0
    plan: Plan | None = None
    more_pending: bool = False
    failed: bool = False

    def to_row(self, world_size: int) -> np.ndarray:
        """Encode for the broadcast.

        Args:
            world_size: The number of ranks (the plan's length).

        Returns:
            A float64 row of ``world_size + 5`` values.
        """
        row = np.zeros(world_size + _HEAD, dtype=np.float64)
        row[:_HEAD] = (
            float(self.decided),
            self.imbalance,
            float(self.plan is not None),
            float(self.more_pending),
            float(self.failed),
        )
        if self.plan is not None:
            row[_HEAD:] = self.plan
        return row

    @classmethod
    def from_row(cls, row: np.ndarray) -> ExchangeMessage:
        """Decode a broadcast row.

        Args:
            row: A row from :meth:`to_row`.

        Returns:
            The message.
        """
        values = [float(x) for x in np.asarray(row).tolist()]
        plan = tuple(round(b) for b in values[_HEAD:]) if values[2] == 1.0 else None
        return cls(values[0] == 1.0, values[1], plan, values[3] == 1.0, values[4] == 1.0)

    @classmethod
    def from_ready(
        cls,
        imbalances: Sequence[float],
        plans: Sequence[Plan | None],
        more_pending: bool,
        failed: bool = False,
    ) -> ExchangeMessage:
        """Rank 0's message for the decisions ready now, oldest first.

        Between two plan changes lies a window measured under the first, so at most one of
        the ready decisions carries a plan.

        Args:
            imbalances: Each ready decision's window imbalance.
            plans: Each ready decision's plan to apply (None for none).
            more_pending: Whether a decision is still being computed.
            failed: Whether the decider raised.

        Returns:
            The message.
        """
        with_plan = [p for p in plans if p is not None]
        return cls(
            decided=bool(imbalances),
            imbalance=float(imbalances[-1]) if imbalances else 0.0,
            plan=tuple(with_plan[-1]) if with_plan and not failed else None,
            more_pending=more_pending and not failed,
            failed=failed,
        )
