"""``simulate --trace DIR``: window records per run and seed, and the seed aggregates."""

from __future__ import annotations

import json

import pytest
from tests.helpers.cli import run_command

from lightning_rex.driver.records import DecisionLog
from lightning_rex.sim.cli.trace import window_limits


def simulate(argv, capsys):
    return run_command(["simulate", *argv], capsys)


def test_trace_writes_records_and_a_summary_that_agrees_with_json(tmp_path, capsys):
    argv = ["--compare", "rex,even", "--seeds", "0-1", "--steps", "240", "--json"]
    rc, out, err = simulate(["--scenario", "pair-3x", *argv, "--trace", str(tmp_path)], capsys)
    assert rc == 0 and str(tmp_path) in err
    printed = json.loads(out)  # stdout still holds exactly the JSON object
    for pol in ("rex", "even"):
        for seed in (0, 1):
            recs = DecisionLog.read(tmp_path / "pair-3x" / pol / f"seed{seed}.jsonl")
            assert recs and all(r["policy"] == pol and r["seed"] == seed for r in recs)
            assert all(r["limit_samples_per_s"] > 0 for r in recs)
            # the limit is the oracle's: a policy is measured near or below it
            assert sum(r["global_samples_per_s"] for r in recs) < 1.05 * sum(
                r["limit_samples_per_s"] for r in recs
            )
    assert not (tmp_path / "pair-3x" / "oracle").exists()  # the oracle runs no window loop
    summary = json.loads((tmp_path / "summary.json").read_text())["scenarios"]["pair-3x"]
    assert summary["seeds"] == [0, 1] and summary["world_size"] == 2
    for pol in ("rex", "even", "oracle"):
        d = summary["policies"][pol]
        assert len(d["efficiency"]) == 2
        assert d["aggregate"]["eff_mean"] == pytest.approx(printed["policies"][pol]["eff_mean"])
        lo, hi = d["eff_ci95"]
        assert lo <= d["eff_gmean"] <= hi
        # one mean everywhere: the summary's (which the HTML draws) is the one printed
        assert d["eff_mean"] == pytest.approx(printed["policies"][pol]["eff_mean"])
        lo, hi = d["eff_mean_ci95"]
        assert lo <= d["eff_mean"] <= hi
    # a second scenario merges into the directory's summary
    rc, _, _ = simulate(
        ["--scenario", "homogeneous-8", "--steps", "90", "--trace", str(tmp_path)], capsys
    )
    assert rc == 0
    merged = json.loads((tmp_path / "summary.json").read_text())["scenarios"]
    assert set(merged) == {"pair-3x", "homogeneous-8"}
    assert merged["homogeneous-8"]["policies"]["rex"]["eff_ci95"] is None  # one seed
    assert (tmp_path / "homogeneous-8" / "rex" / "seed0.jsonl").exists()


def test_window_limits_weight_the_oracle_chunks_by_overlap():
    recs = [
        {"window": [0, 10], "plan": [60, 40]},
        {"window": [25, 35], "plan": [50, 50]},  # half in chunk 0 (0.1 s), half in chunk 1
        {"window": [90, 100], "plan": [50, 50]},  # past the oracle's chunks
    ]
    lim = window_limits(recs, [0.1, 0.3], 30)
    assert lim[0] == pytest.approx(100 / 0.1)
    assert lim[1] == pytest.approx(100 / 0.2)
    assert lim[2] is None
