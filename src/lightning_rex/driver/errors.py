"""The error every rank raises when one rank's REX work failed.

A failure on one rank (the controller's thread on rank 0, a timing read, a bad local
configuration) must not be raised on that rank alone: its peers would wait in the next
collective, which on NCCL means until the process-group timeout. The window driver catches
such a failure, carries a flag through the next collective it issues on every rank anyway
(a window's gather or an exchange), then gathers the failing rank's message, and every rank
raises the same :class:`RexRankError`, naming the rank and the original error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

from lightning_rex.driver.protocols import Collectives

__all__ = ["Failures", "RexRankError"]


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
        suffix = f" (reported at {where})" if where else ""
        super().__init__(f"lightning-rex failed on rank {rank}{suffix}: {message}")
        self.rank = int(rank)
        self.original = message


class Failures:
    """One process's failure in REX's local work, and how every rank learns of it.

    Local work runs under :meth:`guard`: an exception is kept, not raised. The caller keeps
    issuing the collectives every rank issues, carrying :meth:`flags` in them, and calls
    :meth:`raise_if_any` with what it gathered: every rank then raises the same
    :class:`RexRankError` (the failing rank with its original error as the cause).
    """

    def __init__(self) -> None:
        self.failure: tuple[BaseException, str] | None = None

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run local work, keeping the first exception.

        Args:
            what: What the work is, for the error message.

        Yields:
            Nothing.
        """
        try:
            yield
        except Exception as err:
            if self.failure is None:
                self.failure = (err, f"{type(err).__name__}: {err} (while {what})")

    def flags(self, hosted: int) -> np.ndarray:
        """This process's failure flags, one per hosted rank (the first carries it)."""
        flags = np.zeros(hosted)
        flags[0] = float(self.failure is not None)
        return flags

    def raise_if_any(
        self, flags: np.ndarray, where: str, collectives: Collectives, close: Callable[[], None]
    ) -> bool:
        """Every rank: raise the first failing rank's error if any rank's flag is set.

        Args:
            flags: Every rank's flag, as gathered.
            where: What the collective was, for the message.
            collectives: The collectives (the failing rank's message is gathered).
            close: Called before raising (stops background work; no collective).

        Returns:
            False when no rank failed.

        Raises:
            RexRankError: On every rank, when a flag is set.
        """
        bad = np.flatnonzero(np.asarray(flags) > 0)
        if bad.size == 0:
            return False
        mine = None if self.failure is None else self.failure[1]
        texts = collectives.gather_objects(
            [mine if i == 0 else None for i in range(collectives.hosted)]
        )
        rank = int(bad[0])
        close()
        error = RexRankError(rank, str(texts[rank] or "(no message)"), where)
        if rank == collectives.rank and self.failure is not None:
            raise error from self.failure[0]
        raise error
