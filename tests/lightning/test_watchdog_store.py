"""The hang watchdog lets go of its store when it stops (in-process, a stand-in store)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

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


def test_a_rank_whose_handlers_finish_is_not_ended_and_closing_puts_the_exit_off() -> None:
    import threading

    from lightning_rex.driver.errors import RexRankError

    store, exits = _Store(), []
    store.set("rex/hang/run/a1", "1")
    dog = _dog(store, 0, exits, grace_s=0.3)
    worker = threading.Thread(target=dog._act, args=(1, RexRankError(1, "stuck")))
    worker.start()
    assert _wait_for(lambda: dog.error is not None)
    dog.close()  # on_exception: the handlers run, the exit waits a limit (60 s) for them
    assert not _wait_for(lambda: bool(exits), 1.0)
    dog.stop()  # the strategy ran every handler
    worker.join(30)
    assert not worker.is_alive() and exits == []
