"""``python -m lightning_rex report``: PNGs of the expected size and an HTML page.

The decision log ``data/rex_decisions.jsonl`` was recorded from the simulator (rex on 4
ranks, rank 1 slowing down 1.6x halfway; ``data/make_rex_decisions.py`` regenerates it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import warnings
from pathlib import Path

import pytest
from tests.helpers.cli import run_command

from lightning_rex.tools import plots, report

DATA = Path(__file__).with_name("data") / "rex_decisions.jsonl"
WINDOW_PNGS = ("compute.png", "plan.png", "pvalues.png", "throughput.png")
SIZE = (round(plots.FIGSIZE[0] * plots.DPI), round(plots.FIGSIZE[1] * plots.DPI))


def run_report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_command(["report", *argv], capsys)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_pngs(out: Path, names: tuple[str, ...] | list[str]) -> None:
    for name in names:
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert png_size(path) == SIZE, name


def records() -> list[dict]:
    return [json.loads(x) for x in DATA.read_text().splitlines()]


def test_report_of_a_recorded_decision_log(tmp_path, capsys):
    out = tmp_path / "rep"
    rc, stdout, _ = run_report([str(DATA), "--out", str(out)], capsys)
    assert rc == 0
    check_pngs(out, WINDOW_PNGS)
    page = (out / "index.html").read_text()
    assert {str(out / n) for n in [*WINDOW_PNGS, "index.html"]} == set(stdout.split())
    for name in WINDOW_PNGS:
        assert f'src="{name}"' in page
    assert "fixture0" in page and "[98, 60, 48, 50]" in page  # run id and final plan
    assert page.count("<td>propose</td>") == 3 and page.count("<td>accept</td>") == 3
    assert "<td>hold</td>" not in page


def test_a_run_directory_is_searched_and_the_report_goes_inside_it(tmp_path, capsys):
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    shutil.copy(DATA, run / "rex_decisions.jsonl")
    rc, _, _ = run_report([str(tmp_path / "lightning_logs")], capsys)
    assert rc == 0
    check_pngs(tmp_path / "lightning_logs" / "rex_report", WINDOW_PNGS)


def test_run_id_picks_one_run_of_several_and_defaults_to_the_last(tmp_path, capsys):
    recs = records()
    other = [{**r, "run_id": "second", "plan": [64] * 4} for r in recs[:5]]
    log = tmp_path / "rex_decisions.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [*recs, *other]))
    rc, _, _ = run_report([str(log), "--out", str(tmp_path / "a")], capsys)
    assert rc == 0 and "second" in (tmp_path / "a" / "index.html").read_text()
    assert "fixture0" not in (tmp_path / "a" / "index.html").read_text()
    rc, _, _ = run_report([str(log), "--out", str(tmp_path / "b"), "--run-id", "fixture0"], capsys)
    assert rc == 0 and "fixture0" in (tmp_path / "b" / "index.html").read_text()
    rc, _, err = run_report([str(log), "--run-id", "nope"], capsys)
    assert rc == 2 and "'nope'" in err and "fixture0, second" in err


@pytest.mark.parametrize("case", ["missing", "empty", "no-log-dir", "bad-json", "bad-alpha"])
def test_unreadable_inputs_exit_2_with_a_clear_message(tmp_path, capsys, case):
    argv = {
        "missing": [str(tmp_path / "nope.jsonl")],
        "empty": [str(tmp_path / "rex_decisions.jsonl")],
        "no-log-dir": [str(tmp_path)],
        "bad-json": [str(tmp_path / "x.json")],
        "bad-alpha": [str(DATA), "--alpha", "2", "--out", str(tmp_path / "rep")],
    }[case]
    (tmp_path / "rex_decisions.jsonl").write_text("\n")
    (tmp_path / "x.json").write_text("{not json")
    if case == "no-log-dir":
        (tmp_path / "rex_decisions.jsonl").unlink()
    rc, stdout, err = run_report(argv, capsys)
    expect = {
        "missing": "no such file",
        "empty": "holds no window records",
        "no-log-dir": "no rex_decisions.jsonl",
        "bad-json": "not JSON",
        "bad-alpha": "--alpha",
    }[case]
    assert rc == 2 and stdout == "" and err.startswith("report: ") and expect in err


def test_without_matplotlib_it_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run_report([str(DATA), "--out", str(tmp_path)], capsys)
    assert rc == 1 and "pip install lightning-rex[plot]" in err


def test_many_ranks_and_a_changing_global_batch(tmp_path, capsys):
    """300 ranks, then 320 with a larger batch: 16 lines over a band, every PNG drawn."""
    recs = []
    for i in range(12):
        n = 300 if i < 6 else 320
        plan = [8 + (r % 5) for r in range(n)]
        recs.append(
            {
                "run_id": "big",
                "step": 10 * (i + 1),
                "window": [10 * i, 10 * (i + 1)],
                "plan": plan,
                "median_ms": [10.0 + r * 0.01 + i for r in range(n)],
                "p_values": None,
                "decision": "propose" if i == 5 else "hold",
                "new_plan": [9] * 320 if i == 5 else None,
                "effective_step": 60 if i == 5 else None,
                "global_samples_per_s": 1000.0 + i,
                "reason": "",
            }
        )
    log = tmp_path / "rex_decisions.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, _, _ = run_report([str(log)], capsys)
    assert rc == 0
    check_pngs(tmp_path / "rex_report", WINDOW_PNGS)
    w = plots.Windows.from_records(recs)
    assert w.median_ms.shape == (12, 320) and w.changes == [(60, "propose")]
    ranks = plots.pick_ranks(w.median_ms)
    assert len(ranks) == plots.MAX_RANK_LINES and 0 in ranks and 319 in ranks


def test_default_alpha_is_the_controllers():
    from lightning_rex.core.settings import DecisionSettings

    assert DecisionSettings().alpha == report.DEFAULT_ALPHA


def simulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    return run_command(["simulate", *argv], capsys)[:2]


def test_a_simulator_trace_gives_window_plots_and_the_comparison(tmp_path, capsys):
    trace = tmp_path / "trace"
    base = ["--compare", "rex,even", "--seeds", "0-1", "--steps", "240", "--trace", str(trace)]
    assert simulate(["--scenario", "pair-3x", *base], capsys)[0] == 0
    # a second scenario, as 'simulate --json' aggregates (no interval)
    rc, out = simulate(
        [
            "--scenario",
            "homogeneous-8",
            "--compare",
            "rex,even",
            "--json",
            "--seeds",
            "0-1",
            "--steps",
            "120",
        ],
        capsys,
    )
    (tmp_path / "agg.json").write_text(out)
    rc, _, _ = run_report(
        [str(trace), str(tmp_path / "agg.json"), "--out", str(tmp_path / "rep")], capsys
    )
    assert rc == 0
    check_pngs(tmp_path / "rep", [*WINDOW_PNGS, "comparison.png"])
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "pair-3x: rex, seed 0" in page and 'src="comparison.png"' in page
    assert page.count("<td>pair-3x</td>") == 2 and page.count("<td>homogeneous-8</td>") == 2
    # the even policy's run on seed 1, with its limit line
    rc, _, _ = run_report(
        [str(trace), "--policy", "even", "--seed", "1", "--out", str(tmp_path / "even")], capsys
    )
    assert rc == 0 and "pair-3x: even, seed 1" in (tmp_path / "even" / "index.html").read_text()
    # a policy that was not traced is a note on the page; the comparison is still drawn
    rc, _, _ = run_report([str(trace), "--policy", "lbb", "--out", str(tmp_path / "lbb")], capsys)
    page = (tmp_path / "lbb" / "index.html").read_text()
    assert rc == 0 and "no trace of policy &#x27;lbb&#x27;" in page and "comparison.png" in page


def test_a_trace_without_rex_draws_its_first_policy(tmp_path, capsys):
    trace = tmp_path / "trace"
    base = ["--compare", "even", "--seeds", "0-1", "--steps", "120", "--trace", str(trace)]
    assert simulate(["--scenario", "pair-3x", *base], capsys)[0] == 0
    rc, _, _ = run_report([str(trace), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0 and "pair-3x: even, seed 0" in (tmp_path / "rep" / "index.html").read_text()


def test_a_broken_summary_is_not_overwritten(tmp_path, capsys):
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "summary.json").write_text("{not json")
    base = ["--compare", "even", "--seeds", "0-1", "--steps", "60", "--trace", str(trace)]
    rc, _ = simulate(["--scenario", "pair-3x", *base], capsys)
    assert rc == 2 and (trace / "summary.json").read_text() == "{not json"


def test_the_alpha_line_follows_the_records_and_resumed_windows_count_once(
    tmp_path, capsys, monkeypatch
):
    recs = records()
    for r in recs:
        r["alpha"] = 0.05
    first, resumed = tmp_path / "run" / "version_0", tmp_path / "run" / "version_1"
    first.mkdir(parents=True)
    resumed.mkdir()
    half = len(recs) // 2
    # the interrupted run wrote a few windows past its checkpoint; the resumed run repeats them
    (first / "rex_decisions.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs[: half + 3])
    )
    (resumed / "rex_decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[half:]))
    rep = report.load_inputs(
        [str(tmp_path / "run")], argparse.Namespace(run_id=None, seed=None, policy=None)
    )
    ((_, _, got),) = rep.runs
    assert [r["window"] for r in got] == [r["window"] for r in recs]
    seen = []
    real = plots.plot_pvalues
    monkeypatch.setattr(
        plots,
        "plot_pvalues",
        lambda w, path, alpha, title="": seen.append(alpha) or real(w, path, alpha, title),
    )
    rc, _, _ = run_report([str(tmp_path / "run"), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0 and seen == [0.05]


def test_branches_resumed_from_one_checkpoint_are_drawn_apart(tmp_path, capsys):
    # run "a" windows 0-40; "b" and "c" each resumed from a's checkpoint at step 20
    recs = records()[:4]

    def rec(i: int, run: str, parent: str | None, decision: str = "hold") -> dict:
        start = 10 * i
        return {
            **recs[i % len(recs)],
            "run_id": run,
            "resumed_from": parent,
            "window": [start, start + 10],
            "step": start + 10,
            "decision": decision,
            "reason": f"{run}-{start}",
        }

    log = tmp_path / "rex_decisions.jsonl"
    rows = [rec(i, "a", None) for i in range(4)]
    rows += [rec(i, "b", "a", "rollback") for i in (2, 3)] + [rec(2, "c", "a", "accept")]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pages = {}
    for run in ("a", "b", "c"):
        out = tmp_path / run
        assert run_report([str(log), "--run-id", run, "--out", str(out)], capsys)[0] == 0
        pages[run] = (out / "index.html").read_text()
    assert "b-20" not in pages["a"] and "c-20" not in pages["a"]
    assert pages["b"].count("<td>rollback</td>") == 2 and "c-20" not in pages["b"]
    assert pages["c"].count("<td>accept</td>") == 1 and "b-20" not in pages["c"]
    assert "resumed from</th><td>a (from step 0)" in pages["b"]
    # each branch is drawn after a's windows up to its own first one
    assert "<td>4 (steps 0-40)</td>" in pages["b"] and "<td>3 (steps 0-30)</td>" in pages["c"]


@pytest.mark.parametrize("case", ["fifo", "device", "long-line", "too-large"])
def test_any_input_is_read_in_bounded_memory_or_refused(tmp_path, capsys, monkeypatch, case):
    import os

    from lightning_rex.driver import records

    log = tmp_path / "rex_decisions.jsonl"
    if case == "fifo":  # would block forever on open
        os.mkfifo(tmp_path / "pipe.jsonl")
        argv, expect = [str(tmp_path / "pipe.jsonl")], "not a regular file"
    elif case == "device":  # never ends, and has no newline
        argv, expect = ["/dev/zero"], "not a regular file"
    elif case == "long-line":  # one 3 MiB line and no newline: skipped, read in chunks
        log.write_bytes(b"x" * (3 << 20))
        argv, expect = [str(log)], "holds no window records"
    else:
        log.write_text(DATA.read_text())
        monkeypatch.setattr(records, "MAX_LOG_BYTES", 1000)
        argv, expect = [str(log)], "read up to 1,000 bytes"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc, stdout, err = run_report(argv, capsys)
    assert rc == 2 and stdout == "" and expect in err


def test_a_training_run_gets_the_even_split_headline_and_a_title_of_its_start(tmp_path, capsys):
    recs = []
    for i, r in enumerate(records()[:6]):
        recs.append(
            {
                **r,
                "time": "2026-12-02T10:31:07.123+00:00",
                "window_wall_s": 0.5,
                "window_samples": 10 * sum(r["plan"]),
                "even_step_ms": [60.0 + i, 55.0 + i, 65.0 + i],
            }
        )
    log = tmp_path / "rex_decisions.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, _, _ = run_report([str(log), "--out", str(tmp_path / "r")], capsys)
    assert rc == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<h2>run of 2026-12-02 10:31 UTC, 4 ranks</h2>" in page
    assert 'class="headline"' in page and "the even split (DDP&#x27;s) would have trained" in page
    assert page.count("<th>run id</th>") == 1 and "<th>run</th>" in page
    check_pngs(tmp_path / "r", WINDOW_PNGS)


def test_help_texts_are_plain_text(capsys):
    from lightning_rex.__main__ import build_parser

    parser = build_parser()
    for command in ("bench", "simulate", "report"):
        text = parser._subparsers._group_actions[0].choices[command].format_help()
        assert "``" not in text and ":class:" not in text and ":mod:" not in text, command
        assert not any(line.rstrip().endswith("::") for line in text.splitlines()), command
