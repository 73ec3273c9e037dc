"""The hang watchdog lets go of its store when it stops (in-process, a stand-in store)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from lightning_rex.lightning.watchdog import HangWatchdog


class _Store:
    """A dict with the store calls the watchdog makes."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


def test_a_stopped_watchdog_releases_its_store_in_this_process() -> None:
    # a store left to the garbage collector would be inherited by a process forked later
    # (the next fit's DataLoader workers) and closed there
    store = _Store()
    ref = weakref.ref(store)
    dog = HangWatchdog(store, 1, 2, "run", floor_s=2.0, factor=3.0)
    dog.start()
    assert dog._thread is not None and dog._thread.is_alive()
    del store
    dog.stop()
    assert not dog._thread.is_alive()
    assert dog.store is None
    gc.disable()  # freed by its last reference, not by a collection
    try:
        assert ref() is None
    finally:
        gc.enable()


def _wait_for(cond: Any, seconds: float = 30.0) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def _dog(store: _Store, rank: int, exits: list[str], **kw: Any) -> HangWatchdog:
    dog = HangWatchdog(store, rank, 2, "run", floor_s=60.0, factor=1.0, **kw)
    dog._exit = exits.append  # type: ignore[method-assign]
    return dog


def test_the_silent_rank_raises_only_once_every_other_rank_has_read_the_verdict() -> None:
    # so that they name it when its process ends, and rank 0 (which may host the store) is
    # still there when it reads the verdict
    import threading

    from lightning_rex.driver.errors import RexRankError

    store, exits = _Store(), []
    silent = _dog(store, 1, exits, grace_s=0.05)
    worker = threading.Thread(target=silent._act, args=(1, RexRankError(1, "stuck")))
    worker.start()
    assert not _wait_for(lambda: silent.error is not None, 0.5)  # rank 0 has not read it
    store.set("rex/hang/run/a0", "1")  # rank 0 marks it read
    assert _wait_for(lambda: silent.error is not None)
    worker.join(30)
    assert store.data["rex/hang/run/a1"] == b"1" and len(exits) == 1 and "stuck" in exits[0]


def test_rank_0_stays_until_the_silent_rank_has_read_the_verdict_then_ends() -> None:
    import threading

    from lightning_rex.driver.errors import RexRankError

    store, exits = _Store(), []
    judge = _dog(store, 0, exits, grace_s=0.05)
    worker = threading.Thread(target=judge._act, args=(1, RexRankError(1, "stuck")))
    worker.start()
    assert _wait_for(lambda: judge.error is not None)  # raised in its main thread at once
    assert not _wait_for(lambda: bool(exits), 0.5)  # but its process waits for rank 1
    store.set("rex/hang/run/a1", "1")
    worker.join(30)
    assert len(exits) == 1


def test_a_rank_stopped_before_its_exit_is_not_ended() -> None:
    # the verdict was raised into the main thread, which handled it and stopped the watchdog
    import threading

    from lightning_rex.driver.errors import RexRankError

    store, exits = _Store(), []
    store.set("rex/hang/run/a1", "1")
    dog = _dog(store, 0, exits, grace_s=5.0)
    worker = threading.Thread(target=dog._act, args=(1, RexRankError(1, "stuck")))
    worker.start()
    assert _wait_for(lambda: dog.error is not None)
    dog.stop()
    worker.join(30)
    assert not worker.is_alive() and exits == []


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_rank_whose_publication_stops_changing_ages_on_rank_0s_clock() -> None:
    # a rank killed, frozen or cut off leaves its last (progress, small age) in the store:
    # rank 0 ages it from when it first read it, and finds the rank behind
    store, clock = _Store(), _Clock()
    judge = HangWatchdog(store, 0, 2, "run", floor_s=4.0, factor=1.0, clock=clock)
    store.set("rex/hang/run/p0", "0 nan 0 1")
    store.set("rex/hang/run/p1", "7 0.1 0.2 31")  # rank 1's last words
    judge.progress = 8
    assert judge._look() is None
    clock.t += 3.0
    judge.advance()  # rank 0 waits at 9 from now on
    clock.t += 3.9
    assert judge._look() is None  # rank 1 silent for 7.1 s, but behind rank 0 for 3.9 s
    clock.t += 0.2
    hang = judge._look()
    assert hang is not None and hang.rank == 1 and hang.stalled_s == pytest.approx(4.1)
    # a rank that keeps publishing is aged by what it says, not by rank 0's clock
    store.set("rex/hang/run/p1", "9 0.1 0.3 32")
    assert judge._look() is None


def test_the_handlers_of_an_exception_are_ended_a_few_limits_later_unless_stopped() -> None:
    from lightning_rex.lightning.watchdog import CLOSING_LIMITS

    store, exits = _Store(), []
    dog = HangWatchdog(store, 1, 2, "run", floor_s=0.3, factor=1.0)
    dog._exit = exits.append  # type: ignore[method-assign]
    store.set("rex/hang/run/v", '{"seq": 5, "hang": null}')
    dog.close()  # on_exception: the handlers run, and never end
    worker = __import__("threading").Thread(target=dog._run)
    worker.start()
    assert _wait_for(lambda: bool(exits))
    assert f"ran for {CLOSING_LIMITS} limits" in exits[0]
    worker.join(30)
    stopped = HangWatchdog(_Store(), 1, 2, "run", floor_s=0.3, factor=1.0)
    stopped._exit = exits.append  # type: ignore[method-assign]
    stopped.close()
    stopped.stop(on_error=True)  # the strategy ran every handler
    assert len(exits) == 1
