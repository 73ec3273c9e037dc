"""Fake collectives for the window driver: N ranks as threads of one process, no torch.

Every collective is a rendezvous on a barrier with a timeout, so a rank that issues a
different sequence of collectives than its peers shows up as a broken barrier, not a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class ThreadGroup:
    """The shared state of N fake ranks."""

    def __init__(self, n: int, timeout: float = 20.0) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.slots: list[Any] = [None] * n
        self.calls: list[list[str]] = [[] for _ in range(n)]

    def exchange(self, rank: int, what: str, value: Any) -> list[Any]:
        self.calls[rank].append(what)
        self.slots[rank] = (what, value)
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        kinds = {w for w, _ in got}
        assert len(kinds) == 1, f"ranks issued different collectives: {got}"
        return [v for _, v in got]


class ThreadCollectives:
    """One fake rank: implements the driver's Collectives protocol over a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self._rank = group, rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self.group.n

    @property
    def hosted(self) -> int:
        return 1

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        got = self.group.exchange(self._rank, "gather_rows", np.asarray(rows, dtype=float))
        return np.vstack(got)

    def broadcast_row(self, row: np.ndarray) -> np.ndarray:
        return np.asarray(self.group.exchange(self._rank, "broadcast_row", np.asarray(row))[0])

    def gather_objects(self, objs: Sequence[Any]) -> list[Any]:
        return [o[0] for o in self.group.exchange(self._rank, "gather_objects", list(objs))]


def run_threads(n: int, fn: Callable[[int, ThreadCollectives], Any]) -> list[Any]:
    """Run ``fn(rank, collectives)`` on n threads; each result is a value or the exception."""
    group = ThreadGroup(n)
    out: list[Any] = [None] * n

    def body(r: int) -> None:
        try:
            out[r] = fn(r, ThreadCollectives(group, r))
        except BaseException as err:  # returned to the test
            out[r] = err

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out
