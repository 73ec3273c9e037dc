"""A stop request reaches every rank at the same exchange (fake ranks as threads)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tests.driver.test_loop import drive, make
from tests.helpers.fakes import ThreadCollectives, run_threads

from lightning_rex.driver.stopping import AgreedStop, StopKind, StopRequests


def test_the_strongest_request_is_agreed_with_the_ranks_that_asked() -> None:
    stops = StopRequests()
    assert stops.agree(np.zeros(4), 10) is None
    stops.request(StopKind.REQUEUE)
    stops.request(StopKind.STOP)  # a weaker one later keeps the stronger
    assert stops.local == StopKind.REQUEUE
    assert stops.column(2).tolist() == [2.0, 2.0]
    agreed = stops.agree(np.array([0.0, 1.0, 0.0, 2.0]), 25)
    assert agreed == AgreedStop(StopKind.REQUEUE, 25, (1, 3))
    assert stops.agree(np.array([1.0, 1.0, 1.0, 1.0]), 40) == agreed  # the first one is kept


def test_a_request_on_one_rank_is_agreed_by_every_rank_at_its_next_exchange() -> None:
    def rank(r: int, c: ThreadCollectives) -> Any:
        driver, target = make(c)
        driver.start(0, ["cpu"])
        seen: dict[int, AgreedStop | None] = {}

        def each(step: int) -> None:
            if r == 1 and step == 27:
                driver.stops.request(StopKind.STOP)  # a signal handler's call
            seen[step] = driver.stops.agreed

        drive(driver, target, range(60), [r], each=each)
        driver.finish()
        return {s: a for s, a in seen.items() if a is not None}

    out = run_threads(2, rank)
    assert not any(isinstance(o, BaseException) for o in out), out
    # windows [10, 20) and [25, 35): the exchange at 39 (lag 5 after the gather at 34)
    first = [min(o) for o in out]
    assert first[0] == first[1] == 40  # learned at 39's exchange, seen from step 40 on
    assert out[0][40] == out[1][40] == AgreedStop(StopKind.STOP, 39, (1,))
