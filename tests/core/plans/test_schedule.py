"""PlanSchedule and SizeBounds: the one record of plans, checked on every write and load."""

from __future__ import annotations

import pytest

from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.saved import StateError


def test_plans_are_a_step_function_and_later_entries_are_replaced() -> None:
    s = PlanSchedule((32, 32), 64)
    s.set((40, 24), 10)
    s.set((48, 16), 20)
    assert [s.plan_at(k) for k in (0, 9, 10, 19, 20, 99)] == [
        (32, 32),
        (32, 32),
        (40, 24),
        (40, 24),
        (48, 16),
        (48, 16),
    ]
    s.set((30, 34), 15)  # a plan scheduled earlier drops the entries after it
    assert s.entries == [(0, (32, 32)), (10, (40, 24)), (15, (30, 34))] and s.changes == 2


def test_every_plan_is_checked_against_b_and_both_bounds() -> None:
    s = PlanSchedule((32, 32), 64, SizeBounds(min_size=2, max_size=50))
    with pytest.raises(ValueError, match="sum to the global batch B=64"):
        s.set((40, 25), 3)
    with pytest.raises(ValueError, match=r"exceeds max_micro_batch_size on ranks \[0\]"):
        s.set((60, 4), 3)
    with pytest.raises(ValueError, match="min_micro_batch_size=2"):
        s.set((63, 1), 3)
    with pytest.raises(ValueError, match="one entry per rank"):
        s.set((64,), 3)


def test_infeasible_bounds_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match=r"max_micro_batch_size=15 x 4 ranks is below the global"):
        PlanSchedule((16, 16, 16, 16), 64, SizeBounds(1, 15))
    with pytest.raises(ValueError, match=r"min_micro_batch_size=20 x 4 ranks exceeds"):
        PlanSchedule((16, 16, 16, 16), 64, SizeBounds(20))
    with pytest.raises(ValueError, match="max_micro_batch_size must be None or an int >= min"):
        SizeBounds(4, 3)
    with pytest.raises(ValueError, match="min_micro_batch_size must be an int >= 1"):
        SizeBounds(0)


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ([], "schedule"),
        ([[0, [32, 32]], [5, [40, 25]]], r"schedule\[1\]\[1\]"),
        ([[0, [32, 32]], [5, [40, 24]], [5, [24, 40]]], r"schedule\[2\]\[0\]"),
        ([[0, [32, 32, 0]]], r"schedule\[0\]\[1\]"),
        ([[0, [32, 32]], [-1, [40, 24]]], r"schedule\[1\]\[0\]"),
        ([[0, [60, 4]]], r"schedule\[0\]\[1\]"),
        ([[0]], r"schedule\[0\]"),
    ],
)
def test_load_names_the_bad_entry(entries: list, field: str) -> None:
    s = PlanSchedule((32, 32), 64, SizeBounds(1, 50))
    with pytest.raises(StateError, match=field):
        s.load_state_dict(entries)
    assert s.entries == [(0, (32, 32))]  # nothing half-loaded


def test_round_trip() -> None:
    s = PlanSchedule((32, 32), 64)
    s.set((40, 24), 7)
    t = PlanSchedule((32, 32), 64)
    t.load_state_dict(s.state_dict())
    assert t.entries == s.entries
