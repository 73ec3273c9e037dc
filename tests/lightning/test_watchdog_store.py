"""The hang watchdog lets go of its store when it stops (in-process, a stand-in store)."""

from __future__ import annotations

import gc
import weakref

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
