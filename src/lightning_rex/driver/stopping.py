"""A request to stop (a preemption signal) carried to every rank through the next exchange.

A signal reaches one rank, or all of them at different moments, and a signal handler must
not issue a collective (the ranks would pair it with the wrong one: Lightning's own handlers
deadlock that way). So a handler only records the request here; every exchange of the
window loop gathers each rank's request with the failure flags and free steps it gathers
anyway, and from that exchange on every rank holds the same :class:`AgreedStop`: the kind
(the strongest asked for), the exchange's step and the ranks that asked. The caller (the
Lightning layer) then checkpoints every rank at one step and ends the fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

__all__ = ["AgreedStop", "StopKind", "StopRequests"]


class StopKind(IntEnum):
    """What a rank asked for, in increasing strength (the agreed kind is the maximum)."""

    NONE = 0
    STOP = 1
    """Checkpoint and end the fit (SIGTERM)."""
    REQUEUE = 2
    """Checkpoint, requeue the job, and end the fit (SLURM's requeue signal)."""


@dataclass(frozen=True)
class AgreedStop:
    """A stop every rank learned at the same exchange.

    Attributes:
        kind: The strongest kind any rank asked for.
        step: The step of the exchange where it was agreed.
        ranks: The ranks that had asked by then.
    """

    kind: StopKind
    step: int
    ranks: tuple[int, ...]


class StopRequests:
    """This process's request, and the stop agreed at an exchange (module docstring)."""

    def __init__(self) -> None:
        self.local = StopKind.NONE
        self.agreed: AgreedStop | None = None

    def request(self, kind: StopKind) -> None:
        """Record a request (safe in a signal handler: no lock, no collective, no I/O).

        Args:
            kind: What was asked for; after a stronger request a weaker one changes nothing.
        """
        self.local = StopKind(max(int(self.local), int(kind)))

    def column(self, hosted: int) -> np.ndarray:
        """This process's request, one entry per hosted rank, for the exchange's gather."""
        return np.full(hosted, float(self.local))

    def agree(self, gathered: np.ndarray, step: int) -> AgreedStop | None:
        """Every rank: the stop the gathered requests agree on (kept from the first one).

        Args:
            gathered: Every rank's entry of :meth:`column`.
            step: The exchange's step.

        Returns:
            The agreed stop, or None while no rank has asked.
        """
        values = np.asarray(gathered, dtype=np.float64)
        if self.agreed is None and values.size and float(values.max()) > 0:
            ranks = tuple(int(r) for r in np.flatnonzero(values > 0))
            self.agreed = AgreedStop(StopKind(int(values.max())), int(step), ranks)
        return self.agreed
