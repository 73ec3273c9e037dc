"""The exchange message round-trips through its row; at most one ready plan is sent."""

from __future__ import annotations

from lightning_rex.driver.exchange import ExchangeMessage


def test_round_trip_with_and_without_a_plan() -> None:
    for msg in (
        ExchangeMessage(),
        ExchangeMessage(True, 0.25, (51, 13), False),
        ExchangeMessage(True, 0.0, None, True),
        ExchangeMessage(failed=True),
    ):
        assert ExchangeMessage.from_row(msg.to_row(2)) == msg


def test_from_ready_takes_the_latest_imbalance_and_the_plan() -> None:
    msg = ExchangeMessage.from_ready([0.5, 0.1], [None, (40, 24)], more_pending=True)
    assert msg == ExchangeMessage(True, 0.1, (40, 24), True)
    assert ExchangeMessage.from_ready([], [], more_pending=False) == ExchangeMessage()


def test_a_failure_carries_no_plan_and_no_poll() -> None:
    msg = ExchangeMessage.from_ready([0.5], [(40, 24)], more_pending=True, failed=True)
    assert msg.failed and msg.plan is None and not msg.more_pending
