"""The hang watchdog: a rank stuck outside lightning-rex ends the run instead of hanging it.

Every rank's main thread advances a progress counter at the points of each step it passes
(:meth:`HangWatchdog.advance`, called by the callback's hooks and around lightning-rex's own
collectives: an integer increment and a clock read). A daemon thread per rank publishes the
counter and its age (seconds since it last moved) in the process group's key-value store
(the ``TCPStore`` every ``torch.distributed`` run already has) once per poll, a tenth of the
limit (at most 30 s); rank 0's thread applies
:class:`~lightning_rex.driver.hang.HangDetector` to every rank's latest values and publishes
its verdict. When a rank is silent, every rank's thread acts:

1. it marks that it has read the verdict, then raises a
   :class:`~lightning_rex.driver.errors.RexRankError` naming the silent rank in its main
   thread (a signal whose handler raises it), which interrupts a rank stuck in
   ``time.sleep`` or any Python code; a rank blocked inside a collective raises it as soon
   as the collective returns, which it does when the silent rank's process ends (gloo
   notices the closed connection at once). The silent rank raises once every other rank
   has read the verdict (or a limit has passed), so that they name it rather than a bare
   "connection closed";
2. if the process is still running ``grace`` seconds later (a rank blocked in NCCL, or one
   whose main thread never returns to Python), it prints the error and exits with code 1,
   which tears the process group down for the others. Rank 0, whose process may host the
   store, first waits (up to a limit) until every rank has read the verdict.

When a fit ends on an exception, the watchdog goes on watching the exception's handlers
(``on_exception`` hooks and their collectives, such as ``OnExceptionCheckpoint``'s) until the
strategy has run them all (:meth:`HangWatchdog.stop`); a rank still inside them
``CLOSING_LIMITS`` limits later is ended. Rank 0 ages a publication that stops changing on
its own clock, so a rank whose process froze or died is found too. Other ranks also act when
rank 0's verdicts stop coming (its process froze) or its store stops answering (it died), for
as long as the limit. The cost is one store write per rank and one read (rank 0: one read of
every key) per poll.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_rex.driver.errors import RexRankError
from lightning_rex.driver.hang import Hang, HangDetector

__all__ = ["CLOSING_LIMITS", "GRACE_POLLS", "GRACE_S", "HangWatchdog", "default_store"]

_SIGNAL = getattr(signal, "SIGUSR2", None)
_ENDED, _ENDED_ON_ERROR = -1, -2  # rank 0's verdict sequence when its fit ended
GRACE_S, GRACE_POLLS = 10.0, 3
"""Seconds, or polls if longer, from raising the error to ending a process still running."""
CLOSING_LIMITS = 3
"""Limits a fit's exception handlers may run (a checkpoint write among them) before the
process is ended as stuck in them (a collective no peer joins)."""


def default_store() -> Any | None:
    """The default process group's key-value store, or None without one."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if not (dist.is_available() and dist.is_initialized()):
            return None
        store = distributed_c10d._get_default_store()
    except Exception:
        return None
    clone = getattr(store, "clone", None)  # a connection of its own, where torch offers one
    try:
        return store if clone is None else clone()
    except Exception:
        return store


class HangWatchdog:
    """One rank's part of the hang watchdog (see the module docstring).

    Args:
        store: A ``torch.distributed.Store`` every rank shares.
        rank: This rank.
        world_size: The number of ranks.
        key: A prefix unique to this fit (the window loop's run id).
        floor_s: The shortest time a rank may stay behind the others (seconds).
        factor: ... or this many times the slowest rank's typical step time, if longer.
        grace_s: Seconds from raising the error to exiting the process, if it is still
            running; None: ``max(GRACE_S, GRACE_POLLS polls)`` (10 s, 3 polls), so that a
            silent rank reads the verdict and ends first.
        clock: Seconds, monotonic.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        key: str,
        floor_s: float,
        factor: float,
        grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.detector = HangDetector(world_size, floor_s, factor)
        self.poll_s = min(30.0, max(0.2, floor_s / 10.0))
        self.grace_s = (
            max(GRACE_S, GRACE_POLLS * self.poll_s) if grace_s is None else float(grace_s)
        )
        self.progress = 0
        self.error: RexRankError | None = None
        self._clock = clock
        self._moved = clock()
        self._prefix = f"rex/hang/{key}/"
        self._ends: deque[float] = deque(maxlen=33)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident
        self._old_handler: Any = None
        self._installed = self._raised = False
        self._closing_until: float | None = None
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[str, float]] = {}  # rank 0: each rank's publication, when
        self._published = 0

    # ------------------------------------------------------------------ main thread
    def advance(self, step_end: bool = False) -> None:
        """The main thread passed a point of a step (``step_end``: the step's last one).

        Args:
            step_end: Whether this point ends a step (its time measures the step).
        """
        # the time first: a reader (the thread) that sees the new count sees its new age
        self._moved = now = self._clock()
        self.progress += 1
        if step_end:
            self._ends.append(now)

    def age_s(self) -> float:
        """Seconds since this rank's progress last moved."""
        return self._clock() - self._moved

    def typical_step_s(self) -> float:
        """This rank's median step time of its last 32 steps (NaN before 2 steps)."""
        ends = np.asarray(self._ends)
        return float(np.median(np.diff(ends))) if ends.size >= 3 else math.nan

    def limit_s(self) -> float:
        """The limit on this rank's own typical step."""
        return self.detector.limit([self.typical_step_s()])

    def start(self) -> None:
        """Publish this rank and start the thread (main thread, every rank, together)."""
        self._publish()
        if self.rank == 0:
            self.store.set(self._prefix + "v", json.dumps({"seq": 0, "hang": None}))
        if (
            _SIGNAL is not None
            and threading.current_thread() is threading.main_thread()
            and self.world_size > 1
        ):
            self._old_handler = signal.signal(_SIGNAL, self._raise)
            self._installed = True
        self._thread = threading.Thread(target=self._run, name="rex-hang-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The fit is ending on an exception: watch its handlers until :meth:`stop`.

        The rule still holds (rex's own collectives in the handlers advance the progress),
        and a rank still inside the handlers ``CLOSING_LIMITS`` limits from now is ended; a
        store that stops answering is no longer taken for a hang (rank 0 may have finished
        its handlers and gone). After a verdict, the exit keeps its time: the peers are
        gone or stuck, so the handlers' collectives cannot complete.
        """
        self._closing_until = self._clock() + CLOSING_LIMITS * self.limit_s()

    def stop(self, on_error: bool = False) -> None:
        """Stop watching (the fit ended, or every exception handler has run).

        Args:
            on_error: The fit ended on an exception: rank 0 tells the others so, and they
                go on watching rank 0 (its process may be gone while they are stuck).
        """
        with self._lock:  # no signal is sent once the old handler is back
            self._stop.set()
            if self._installed and threading.current_thread() is threading.main_thread():
                signal.signal(_SIGNAL, self._old_handler)  # type: ignore[arg-type]
                self._installed = False
        if self.rank == 0 and self.error is None:
            # the other ranks stop too, rather than take rank 0's silence for a hang
            seq = _ENDED_ON_ERROR if on_error or self._closing_until is not None else _ENDED
            with contextlib.suppress(Exception):
                self.store.set(self._prefix + "v", json.dumps({"seq": seq, "hang": None}))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
            if not self._thread.is_alive():
                # the store's connection closes now, in this process: left to the garbage
                # collector, a process forked later (a DataLoader worker of the next fit)
                # would inherit it, and close it there
                self.store = None

    def _raise(self, signum: int, frame: Any) -> None:
        if self.error is not None and not self._raised:
            self._raised = True  # once: a later delivery must not break the handlers
            raise self.error
        if self.error is None and callable(self._old_handler):
            self._old_handler(signum, frame)  # a SIGUSR2 that is not ours: its own handler

    # ------------------------------------------------------------------ the thread
    def _publish(self) -> None:
        # the count is read before its age (advance() writes them the other way round)
        count = self.progress
        self._published += 1
        self.store.set(
            self._prefix + f"p{self.rank}",
            f"{count} {self.typical_step_s():.6g} {self.age_s():.6g} {self._published}",
        )

    def _run(self) -> None:
        seen_seq, seq_at = -3, self._clock()
        failing_since: float | None = None
        while not self._stop.wait(self.poll_s):
            now = self._clock()
            until = self._closing_until
            closing = until is not None
            if until is not None and now > until:
                self._exit(
                    f"its exception handlers ran for {CLOSING_LIMITS} limits (a collective in"
                    " them that no other rank joins)"
                )
                return
            hang = None
            try:
                self._publish()
                if self.rank == 0:
                    hang = self._look()
                else:
                    verdict = self._verdict()
                    if verdict is not None:
                        if verdict["seq"] == _ENDED:
                            return  # rank 0 ended its fit
                        if verdict["hang"] is not None:
                            hang = Hang(**verdict["hang"])
                        if verdict["seq"] != seen_seq:
                            seen_seq, seq_at = verdict["seq"], now
                    limit = self.limit_s()
                    if hang is None and now - seq_at > limit and not closing:
                        hang = Hang(0, now - seq_at, limit, (0,) * self.world_size)
                failing_since = None
            except Exception as err:  # the store: rank 0's process may be gone
                failing_since = now if failing_since is None else failing_since
                if closing or now - failing_since <= self.limit_s():
                    continue  # ending anyway: rank 0 may have finished and gone
                self._act(
                    0,
                    RexRankError(
                        0,
                        f"the process group's store stopped answering for {now - failing_since:.0f}"
                        f" s ({type(err).__name__}: {err}): rank 0 is gone or unreachable",
                        "the hang watchdog's check",
                    ),
                )
                return
            if hang is not None:
                self._act(
                    hang.rank, RexRankError(hang.rank, hang.message(), "the hang watchdog's check")
                )
                return

    def _look(self) -> Hang | None:
        """Rank 0: every rank's progress, the detector's verdict, published."""
        keys = [self._prefix + f"p{r}" for r in range(self.world_size)]
        raw = self.store.multi_get(keys) if hasattr(self.store, "multi_get") else None
        if raw is None:
            raw = [self.store.get(k) for k in keys]
        progress, steps, ages = [], [], []
        now = self._clock()
        for r, value in enumerate(raw):
            text = bytes(value).decode()
            count, step_s, age_s, _ = text.split()
            # a publication that has not changed since rank 0 first read it (a rank frozen,
            # killed or cut off) ages on rank 0's own clock from then on
            first = self._seen.get(r)
            if first is None or first[0] != text:
                self._seen[r] = first = (text, now)
            progress.append(int(count))
            steps.append(float(step_s))
            ages.append(float(age_s) + now - first[1])
        # its own, as they are now (the count before its age, as advance() writes them)
        progress[0] = self.progress
        ages[0] = self.age_s()
        hang = self.detector.observe(progress, steps, ages)
        seq = int(self._clock() * 1000) & 0x7FFFFFFF
        body = None if hang is None else dataclasses.asdict(hang)
        self.store.set(self._prefix + "v", json.dumps({"seq": seq, "hang": body}))
        return hang

    def _verdict(self) -> dict[str, Any] | None:
        key = self._prefix + "v"
        if not self.store.check([key]):
            return None
        verdict = json.loads(bytes(self.store.get(key)).decode())
        if verdict.get("hang") is not None:
            verdict["hang"]["progress"] = tuple(verdict["hang"]["progress"])
        return verdict

    def _wait_for_readers(self, ranks: list[int]) -> None:
        """Wait (a limit at most) until ``ranks`` have marked the verdict read."""
        keys = [self._prefix + f"a{r}" for r in ranks]
        until = self._clock() + self.limit_s()
        while keys and self._clock() < until and not self._stop.is_set():
            try:
                if self.store.check(keys):
                    return
            except Exception:
                return  # the store is gone: nobody can read it any more
            self._stop.wait(min(0.05, self.poll_s))

    def _act(self, silent: int, error: RexRankError) -> None:
        """Raise ``error`` in the main thread; end the process if it is still here later."""
        with contextlib.suppress(Exception):
            self.store.set(self._prefix + f"a{self.rank}", "1")
        others = [r for r in range(self.world_size) if r != self.rank]
        if silent == self.rank:
            self._wait_for_readers(others)
        self.error = error
        with self._lock:  # stop() cannot put the old handler back in between
            if self._installed and not self._stop.is_set() and self._main is not None:
                with contextlib.suppress(Exception):
                    signal.pthread_kill(self._main, _SIGNAL)  # type: ignore[arg-type]
        if self.rank == 0:
            self._wait_for_readers(others)  # its process may host the store
        exit_at = self._clock() + self.grace_s
        while not self._stop.is_set():
            left = exit_at - self._clock()
            if left <= 0:
                self._exit(f"{type(error).__name__}: {error}")
                return
            self._stop.wait(min(left, self.poll_s))

    def _exit(self, why: str) -> None:
        with self._lock:
            if self._stop.is_set():
                return  # stopped meanwhile: the fit ended after all
            sys.stderr.write(f"lightning-rex: ending rank {self.rank}'s process: {why}\n")
            sys.stderr.flush()
            os._exit(1)
