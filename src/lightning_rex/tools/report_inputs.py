"""What ``python -m lightning_rex report`` reads: decision logs, trace directories, JSON.

:func:`load_inputs` turns the command's inputs into a :class:`Report`: the runs to draw (a
run directory's or a decision log's last run, or ``--run-id``'s, drawn after the windows of
the runs it resumed; one run of a ``simulate --trace`` directory) and the per-scenario
comparison (a trace's summary, or ``simulate --json`` output). An input that cannot be read
is a :class:`ReportError`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LOG_NAME", "Interval", "Report", "ReportError", "load_inputs", "run_label"]

LOG_NAME = "rex_decisions.jsonl"

Interval = tuple[float, float | None, float | None]


class ReportError(Exception):
    """An input that cannot be reported on (the CLI prints it and exits with 2)."""


@dataclass
class Report:
    """What the inputs hold.

    Attributes:
        runs: ``(label, source, records)`` of every run to draw window plots for.
        comparison: Per scenario, per policy, ``(centre, low, high)`` efficiency.
        notes: Sentences for the page (how the comparison was computed).
    """

    runs: list[tuple[str, Path, list[dict[str, Any]]]] = field(default_factory=list)
    comparison: dict[str, dict[str, Interval]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _read_log(path: Path) -> list[dict[str, Any]]:
    from lightning_rex.driver.records import DecisionLog  # (it streams, in bounded memory)

    try:
        records = DecisionLog.read(path)
    except ValueError as error:
        raise ReportError(str(error)) from None
    return [r for r in records if isinstance(r, dict) and "window" in r and "plan" in r]


def _pick_run(
    logs: Sequence[tuple[Path, list[dict[str, Any]]]], run_id: str | None, where: Path
) -> tuple[str, Path, list[dict[str, Any]]]:
    """One run's records from logs (in order): ``run_id``'s, or the last run's."""
    runs: dict[str, tuple[Path, list[dict[str, Any]]]] = {}
    last = None
    for path, records in logs:
        for record in records:
            last = str(record.get("run_id"))
            runs.setdefault(last, (path, []))[1].append(record)
    if last is None:
        raise ReportError(f"{where} holds no window records")
    run_id = last if run_id is None else run_id
    if run_id not in runs:
        raise ReportError(f"run id {run_id!r} is not in {where}; its runs: {', '.join(runs)}")
    # logs from before resumes had run ids of their own repeat the windows after the last
    # checkpoint under the same id: keep one record per window, the latest written
    by_window = {tuple(r["window"]): r for r in runs[run_id][1]}
    records = sorted(by_window.values(), key=lambda r: r["window"][0])
    # a resumed fit is a run of its own (``resumed_from``): draw it after the windows of the
    # runs it continues that end before its own first one, never with its sibling branches
    seen, parent = {run_id}, records[-1].get("resumed_from")
    while isinstance(parent, str) and parent in runs and parent not in seen:
        seen.add(parent)
        start = records[0]["window"][0]
        earlier = {tuple(r["window"]): r for r in runs[parent][1] if r["window"][1] <= start}
        records = sorted(earlier.values(), key=lambda r: r["window"][0]) + records
        parent = runs[parent][1][-1].get("resumed_from")
    return run_label(run_id, records), runs[run_id][0], records


def _comparison_from_json(d: dict[str, Any], path: Path, out: Report) -> None:
    """``simulate --json`` output: one run (efficiency) or seed aggregates (eff_mean)."""
    pols = d.get("policies")
    if not isinstance(pols, dict) or "scenario" not in d:
        raise ReportError(f"{path}: not 'simulate --json' output nor a trace summary.json")
    key = "efficiency" if "seed" in d else "eff_mean"
    row = {n: (float(m[key]), None, None) for n, m in pols.items() if n != "oracle"}
    out.comparison.setdefault(str(d["scenario"]), {}).update(row)
    out.notes.append(f"{path.name}: {key} without an interval (use 'simulate --trace' for one).")


def _trace(root: Path, args: argparse.Namespace, out: Report) -> None:
    """A ``simulate --trace`` directory: the comparison, and the window plots of one run."""
    try:
        summary = json.loads((root / "summary.json").read_text())
        scenarios = dict(summary["scenarios"])
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ReportError(f"{root / 'summary.json'}: not a trace summary ({error})") from None
    for name, scenario in scenarios.items():
        rows = {}
        for pol, stats in scenario["policies"].items():
            if pol != "oracle":
                if "eff_mean" in stats:  # the mean simulate --seeds prints
                    low, high = stats.get("eff_mean_ci95") or (None, None)
                    rows[pol] = (float(stats["eff_mean"]), low, high)
                else:  # a summary written before it was saved
                    low, high = stats.get("eff_ci95") or (None, None)
                    rows[pol] = (float(stats["eff_gmean"]), low, high)
        out.comparison.setdefault(name, {}).update(rows)
        seed = scenario["seeds"][0] if args.seed is None else args.seed
        traced = [n for n in scenario["policies"] if n != "oracle"]
        policy = args.policy or ("rex" if "rex" in traced else (traced or ["rex"])[0])
        log = root / scenario.get("trace_dir", name) / policy / f"seed{seed}.jsonl"
        if not log.exists():
            out.notes.append(f"{name}: no trace of policy {policy!r}, seed {seed} ({log}).")
            continue
        records = _read_log(log)
        if records:
            out.runs.append((f"{name}: {policy}, seed {seed}", log, records))
        else:  # e.g. LBB: it changes the plan every step, so no window completes
            out.notes.append(f"{name}: {policy} wrote no window records ({log}).")
    out.notes.append(
        "Efficiency: throughput over the oracle's on the same seed; the point is the"
        " arithmetic mean over seeds (eff_mean, as simulate --seeds prints it), the bar its"
        " 95% Student-t interval (none for one seed)."
    )


def load_inputs(paths: Sequence[str], args: argparse.Namespace) -> Report:
    """Read every input.

    Args:
        paths: The inputs (run directories, logs, trace directories, JSON files).
        args: The parsed options (``run_id``, ``policy``, ``seed``).

    Returns:
        The runs to draw and the comparison.

    Raises:
        ReportError: For a missing, empty or unreadable input, or an unknown run id.
    """
    out = Report()
    for spec in paths:
        try:
            _load_one(Path(spec), args, out)
        except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as error:
            raise ReportError(
                f"{spec}: not a decision log, trace or simulator JSON ({error!r})"
            ) from error
    return out


def _load_one(p: Path, args: argparse.Namespace, out: Report) -> None:
    """Read one input into ``out`` (see :func:`load_inputs`)."""
    if not p.exists():
        raise ReportError(f"{p}: no such file or directory")
    if not (p.is_dir() or p.is_file()):  # a FIFO would block, a device (/dev/zero) never ends
        raise ReportError(f"{p}: not a regular file or directory")
    from lightning_rex.driver.records import MAX_LOG_BYTES

    if p.is_file() and p.suffix == ".json" and p.stat().st_size > MAX_LOG_BYTES:
        raise ReportError(f"{p}: {p.stat().st_size:,} bytes; JSON is read up to {MAX_LOG_BYTES:,}")
    if p.is_dir() and (p / "summary.json").exists():
        _trace(p, args, out)
    elif p.is_dir():
        files = sorted(p.rglob(LOG_NAME), key=lambda f: (f.stat().st_mtime, str(f)))
        if not files:
            raise ReportError(f"{p}: no {LOG_NAME} or summary.json below it")
        out.runs.append(_pick_run([(f, _read_log(f)) for f in files], args.run_id, p))
    elif p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as error:
            raise ReportError(f"{p}: not JSON ({error})") from None
        if isinstance(data, dict) and "scenarios" in data:
            _trace(p.parent, args, out)
        else:
            _comparison_from_json(data if isinstance(data, dict) else {}, p, out)
    else:
        out.runs.append(_pick_run([(p, _read_log(p))], args.run_id, p))


def run_label(run_id: str, records: list[dict[str, Any]]) -> str:
    """A run's name for titles: when it started and on how many ranks.

    Args:
        run_id: The run's id (used where the records carry no time).
        records: Its records, in order.

    Returns:
        ``"run of 2026-12-02 10:31 UTC, 2 ranks"``.
    """
    when = str(records[0].get("time") or "")
    num_ranks = len(records[-1]["plan"])
    ranks = f"{num_ranks} rank{'s' if num_ranks != 1 else ''}"
    if len(when) >= 16:
        return f"run of {when[:10]} {when[11:16]} UTC, {ranks}"
    return f"run {run_id}, {ranks}"
