"""The message of an exchange: rank 0's ready decisions, as one small tensor for every rank.

At an exchange step rank 0 sends ``[decisions?, imbalance, plan?, more pending?, plan...]``
(float64, ``N + 4`` values; integers up to 2**53 are exact) in one broadcast. Rank 0 keeps
the full decisions for its records; the other ranks need only the plan to apply, the summary
for the progress bar, and whether to poll again for a decision still being computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_rex.core.plan import Plan

__all__ = ["ExchangeMessage"]


@dataclass(frozen=True)
class ExchangeMessage:
    """What every rank learns at an exchange.

    Attributes:
        decided: Rank 0 had at least one decision ready.
        imbalance: The latest ready window's max/min median ratio minus one.
        plan: The plan to apply now, or None.
        more_pending: A decision is still being computed: poll again.
    """

    decided: bool = False
    imbalance: float = 0.0
    plan: Plan | None = None
    more_pending: bool = False

    def to_tensor(self, world_size: int) -> torch.Tensor:
        """Encode for the broadcast.

        Args:
            world_size: The number of ranks (the plan's length).

        Returns:
            A float64 tensor of ``world_size + 4`` values.
        """
        t = torch.zeros(world_size + 4, dtype=torch.float64)
        t[0], t[1], t[3] = float(self.decided), self.imbalance, float(self.more_pending)
        if self.plan is not None:
            t[2] = 1.0
            t[4:] = torch.tensor(self.plan, dtype=torch.float64)
        return t

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> ExchangeMessage:
        """Decode a broadcast tensor.

        Args:
            t: A tensor from :meth:`to_tensor`.

        Returns:
            The message.
        """
        values = t.tolist()
        plan = tuple(round(b) for b in values[4:]) if values[2] == 1.0 else None
        return cls(values[0] == 1.0, float(values[1]), plan, values[3] == 1.0)

    @classmethod
    def from_ready(
        cls, imbalances: Sequence[float], plans: Sequence[Plan | None], more_pending: bool
    ) -> ExchangeMessage:
        """Rank 0's message for the decisions ready now, oldest first.

        Between two plan changes lies a window measured under the first, so at most one of
        the ready decisions carries a plan.

        Args:
            imbalances: Each ready decision's window imbalance.
            plans: Each ready decision's plan to apply (None for none).
            more_pending: Whether a decision is still being computed.

        Returns:
            The message.
        """
        with_plan = [p for p in plans if p is not None]
        return cls(
            decided=bool(imbalances),
            imbalance=float(imbalances[-1]) if imbalances else 0.0,
            plan=tuple(with_plan[-1]) if with_plan else None,
            more_pending=more_pending,
        )
