"""The error every rank raises when one rank's REX work failed.

A failure on one rank (the controller's thread on rank 0, a timing read, a bad local
configuration) must not be raised on that rank alone: its peers would wait in the next
collective, which on NCCL means until the process-group timeout. The window driver catches
such a failure, carries a flag through the next collective it issues on every rank anyway
(a window's gather or an exchange), then gathers the failing rank's message, and every rank
raises the same :class:`RexRankError`, naming the rank and the original error.
"""

from __future__ import annotations

__all__ = ["RexRankError"]


class RexRankError(RuntimeError):
    """REX work failed on one rank; raised on every rank at the same collective.

    Args:
        rank: The (lowest) global rank whose work failed.
        message: That rank's original error, as ``"Type: message"``.
        where: What the driver was doing when it learned of the failure.

    Attributes:
        rank: The failing rank.
        original: The original error's text.
    """

    def __init__(self, rank: int, message: str, where: str = "") -> None:
        at = f" (reported at {where})" if where else ""
        super().__init__(f"lightning-rex failed on rank {rank}{at}: {message}")
        self.rank = int(rank)
        self.original = message
