"""The report's data: equal ranks drawn once, with their device, and proposals that say why."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from matplotlib.figure import Figure

from lightning_rex.sim.cli.trace import run_traced
from lightning_rex.sim.engine.engine import simulate
from lightning_rex.sim.policies.builtin import OraclePolicy
from lightning_rex.sim.scenarios.schema import load_scenario
from lightning_rex.tools import plots
from lightning_rex.tools.windows import (
    PROPOSAL_CAUSES,
    Windows,
    device_label,
    labelled_groups,
    proposal_cause,
    rank_groups,
)


def record(step: int, plan: list[int], ms: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "window": [step - 10, step],
        "plan": plan,
        "median_ms": ms,
        "decision": "hold",
        **extra,
    }


def test_ranks_of_one_device_plan_and_speed_form_one_group():
    devices = ["A100", "A100", "A100", "V100", "V100", "T4"]
    recs = [
        record(10, [8, 8, 8, 8, 8, 8], [10, 10.5, 10.2, 20, 26, 40], devices=devices),
        record(20, [12, 12, 12, 8, 8, 2], [11, 10.8, 11, 20, 26, 12], devices=devices),
    ]
    w = Windows.from_records(recs)
    # A100s: one device, one plan, times within 10%; V100s: 30% apart; T4 alone
    assert rank_groups(w) == [[0, 1, 2], [3], [4], [5]]
    labels = [g.label for g in labelled_groups(w)]
    assert labels == ["A100: ranks 0-2", "rank 3 (V100)", "rank 4 (V100)", "rank 5 (T4)"]


def test_equal_ranks_without_device_names_group_only_on_equal_plans():
    # an old log (no devices): ranks 0 and 2 are equal; rank 1 has the same times, another plan
    recs = [record(10, [8, 8, 8], [10, 10, 10]), record(20, [8, 9, 7], [10, 10, 10])]
    w = Windows.from_records(recs)
    assert w.devices == [None, None, None]
    assert rank_groups(w) == [[0], [1], [2]]
    recs[1]["plan"] = [8, 9, 8]
    recs[1]["new_plan"] = None
    w = Windows.from_records(recs)
    assert rank_groups(w) == [[0, 2], [1]]
    assert [g.label for g in labelled_groups(w)] == ["ranks 0, 2", "rank 1"]


@pytest.mark.parametrize(
    ("key", "label"),
    [("sim:A100", "A100"), ("sim", None), ("NVIDIA H200", "NVIDIA H200"), ("cpu", "cpu")],
)
def test_device_labels(key, label):
    assert device_label(key) == label


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("imbalance at cold start on ranks [0, 2]", "cold start"),
        ("persistent imbalance on ranks [3]", "persistent"),
        ("non-inferior (x0.703 vs before); still imbalanced: refined", "refined"),
        ("the plan in force breaks the size bounds", "bounds"),
        ("plan tried from outside", "other"),
    ],
)
def test_proposal_causes_follow_the_controllers_reasons(reason, cause):
    assert proposal_cause(reason) == cause


def test_simulated_records_name_devices_and_the_figures_use_them(monkeypatch):
    scen = dataclasses.replace(load_scenario("a100-v100-t4-8"), steps=600)
    _, recs = run_traced(scen, "rex", 0, simulate(scen, OraclePolicy(scen), 0))
    keys = ["sim:A100"] * 3 + ["sim:V100"] * 3 + ["sim:T4"] * 2
    assert recs and all(r["devices"] == keys for r in recs)
    w = Windows.from_records(recs)
    assert w.devices == ["A100"] * 3 + ["V100"] * 3 + ["T4"] * 2
    figures: list[Figure] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    plots.plot_plan(w, "plan.png", float(w.step[-1]))
    plots.plot_pvalues(w, "pvalues.png", 0.01)
    for fig in figures:
        legend = fig.axes[0].get_legend()
        texts = [t.get_text() for t in legend.get_texts()]
        # every rank line names its device: "rank 3 (V100)" or "A100: ranks 0-2"
        lines = [t for t in texts if t.startswith("rank ") or ": ranks " in t]
        assert len(lines) >= 3
        assert all(any(d in t for d in ("A100", "V100", "T4")) for t in lines)
    texts = [t.get_text() for t in figures[1].axes[0].get_legend().get_texts()]
    causes = {proposal_cause(r["reason"]) for r in recs if r["decision"] == "propose"}
    assert causes and all(PROPOSAL_CAUSES[c][0] in texts for c in causes)
    assert "propose" not in texts  # each proposal names its test


def test_long_rank_lists_are_cut_in_legends():
    n = 40
    recs = [record(10, [8 if r % 2 else 9 for r in range(n)], [10.0] * n, devices=["x"] * n)]
    labels = [g.label for g in labelled_groups(Windows.from_records(recs))]
    assert labels == ["x: ranks 0, 2, 4, ... (20 ranks)", "x: ranks 1, 3, 5, ... (20 ranks)"]
