"""The decision log: run ids and times, no duplicate windows on resume, partial last lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_rex.driver.records import DecisionLog, window_metrics


def _record(run: str, start: int) -> dict[str, Any]:
    return {
        "run_id": run,
        "time": "2026-11-30T00:00:00.000+00:00",
        "window": [start, start + 10],
        "plan": [40, 24],
        "median_ms": [10.0, 11.0],
        "p_values": [0.5, 0.001],
        "verdict": "imbalanced",
        "decision": "propose",
        "imbalance": 0.1,
        "dropped_samples": 2,
    }


def test_a_resumed_run_writes_no_window_twice_and_other_runs_stay_apart(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "run-a")
    assert log.write(_record("run-a", 0)) and log.write(_record("run-a", 10))
    resumed = DecisionLog(tmp_path, "run-a")  # a resume of run-a, same directory
    assert not resumed.write(_record("run-a", 10))  # written before the crash
    assert resumed.write(_record("run-a", 20))
    other = DecisionLog(tmp_path, "run-b")  # a second fit in the same directory
    assert other.write(_record("run-b", 10))
    recs = DecisionLog.read(tmp_path / "rex_decisions.jsonl")
    assert [(r["run_id"], r["window"][0]) for r in recs] == [
        ("run-a", 0),
        ("run-a", 10),
        ("run-a", 20),
        ("run-b", 10),
    ]
    assert window_metrics(recs[0])["rex/dropped_samples"] == 2.0


def test_a_partial_last_line_is_skipped_on_read_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "rex_decisions.jsonl"
    path.write_text(json.dumps(_record("a", 0)) + "\n" + '{"run_id": "a", "wind')
    with pytest.warns(UserWarning, match="partial last line"):
        assert len(DecisionLog.read(path)) == 1
    with pytest.warns(UserWarning, match="removing a partial last line"):
        log = DecisionLog(tmp_path, "a")
    log.write(_record("a", 10))
    assert [r["window"][0] for r in DecisionLog.read(path)] == [0, 10]


def test_a_malformed_line_anywhere_is_skipped_and_named(tmp_path: Path) -> None:
    # two runs appending at once glued two records; a third line is fine
    path = tmp_path / "rex_decisions.jsonl"
    glued = json.dumps(_record("a", 0))[:-5] + json.dumps(_record("b", 0))
    path.write_text(
        json.dumps(_record("a", 0))
        + "\n"
        + glued
        + "\n[1, 2]\n"
        + json.dumps(_record("b", 10))
        + "\n"
    )
    with pytest.warns(UserWarning, match=r"skipped 2 line\(s\) .* \(line 2, 3\)"):
        recs = DecisionLog.read(path)
    assert [(r["run_id"], r["window"][0]) for r in recs] == [("a", 0), ("b", 10)]
    with pytest.warns(UserWarning, match="skipped 2"):
        log = DecisionLog(tmp_path, "c")  # a new fit in that directory starts and writes
    assert log.write(_record("c", 0))


def test_window_metrics_flatten_a_record() -> None:
    m = window_metrics({**_record("a", 0), "predicted_step_ms": 9.0, "measured_step_ms": 11.0})
    assert m["rex/plan_rank1"] == 24 and m["rex/p_value_rank1"] == 0.001 and m["rex/decision"] == 1
    assert m["rex/imbalanced"] == 1.0 and "rex/global_samples_per_s" not in m
