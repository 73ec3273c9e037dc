"""The report's headline: measured throughput against the even split's estimate."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_rex.tools.headline import even_split_headline, even_split_series


def _record(start: int, plan: list[int], median_ms: list[float], wall: float, even: Any) -> dict:
    steps = 10
    return {
        "window": [start, start + steps],
        "step": start + steps,
        "plan": plan,
        "median_ms": median_ms,
        "window_wall_s": wall,
        "window_samples": steps * sum(plan),
        "even_step_ms": even,
    }


def test_the_even_split_takes_its_compute_plus_the_time_outside_compute() -> None:
    # two windows of 10 steps of B = 64: the first at the even plan, the second after rex's
    # change; outside compute (all-reduce, optimizer) 2 ms a step in both
    records = [
        _record(10, [32, 32], [10.0, 30.0], 10 * 0.032, [28.0, 26.0, 31.0]),
        _record(20, [48, 16], [16.0, 17.0], 10 * 0.019, [30.0, 27.0, 33.0]),
    ]
    h = even_split_headline(records)
    assert h is not None and h.windows == 2
    assert h.measured == pytest.approx(1280 / (0.32 + 0.19))
    # the latest estimate at B = 64 (30 ms, 95% 27-33 ms) for both windows, plus 2 ms each
    assert h.even[0] == pytest.approx(1280 / (20 * 0.032))
    assert h.even[1] == pytest.approx(1280 / (20 * 0.035))  # the slow end is the low one
    assert h.even[2] == pytest.approx(1280 / (20 * 0.029))
    assert h.speedup[0] == pytest.approx(h.measured / h.even[0])
    assert h.speedup[1] < h.speedup[0] < h.speedup[2]
    assert "x1.25 (x1.14-x1.37)" in h.sentence()
    series = even_split_series(records)
    assert series[1] == pytest.approx([640 / 0.32, 640 / 0.35, 640 / 0.29])


def test_no_headline_without_an_estimate_or_a_wall_time() -> None:
    assert even_split_headline([_record(0, [32, 32], [1.0, 1.0], 0.1, None)]) is None
    assert even_split_headline([_record(0, [32, 32], [1.0, 1.0], None, [1.0, 1.0, 1.0])]) is None
    assert even_split_series([_record(0, [32, 32], [1.0, 1.0], 0.1, None)]) == [None]
