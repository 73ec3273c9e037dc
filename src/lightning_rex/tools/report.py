r"""``python -m lightning_rex report``: PNG plots and an HTML page of a run's decisions.

Inputs (one or more)::

    python -m lightning_rex report lightning_logs/version_0            # a run directory
    python -m lightning_rex report rex_decisions.jsonl --run-id ID     # a decision log
    python -m lightning_rex report TRACE_DIR --policy rex --seed 0     # simulate --trace DIR
    python -m lightning_rex report a.json b.json                       # simulate --json output

A run directory is searched for ``rex_decisions.jsonl`` files; of the runs they hold
(``run_id``), the last one is drawn unless ``--run-id`` picks another; a run resumed from a
checkpoint is drawn after the windows of the run it resumed (``resumed_from``) up to its
own first window, and branches resumed from one checkpoint are drawn apart. For a decision log the
report draws ``compute.png`` (each rank's median compute time per window, plan changes as
vertical lines), ``plan.png`` (each rank's micro-batch over steps), ``pvalues.png`` (the
imbalance test's adjusted p-values against alpha, with the proposals marked where their
test is drawn and the accepts and rollbacks on a strip of their own) and ``throughput.png``
(global samples per second, against the even split's estimate where the records carry one,
as training's do, and against the limit where they carry ``limit_samples_per_s``, as
simulator traces do). The page's headline for a training run is its measured throughput
against what the even split would have given on the same ranks, estimated from their
measured step times (see :mod:`lightning_rex.tools.headline`). A simulator trace directory
(``simulate --trace DIR``) gives those plots per scenario, prefixed by the scenario's name,
for ``--policy`` on ``--seed``, and ``comparison.png``: each policy's efficiency per scenario,
the arithmetic mean over seeds (``eff_mean``) with its 95% interval. ``simulate --json``
output gives the comparison without intervals (it keeps no per-seed figures; ``--trace``
does). With more than 16 ranks, 16 are drawn over the band of all. ``index.html`` shows the
plots with a summary and a table of the decisions other than hold. Exit code 2 for an input
that cannot be read.
"""

from __future__ import annotations

import argparse
import html
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from lightning_rex.tools.report_inputs import Report, ReportError, load_inputs

__all__ = ["DEFAULT_ALPHA", "Report", "ReportError", "add_parser", "load_inputs", "main"]

#: The imbalance test's level when neither ``--alpha`` nor the records give one: the default
#: of ``Controller`` and ``RexCallback`` (not imported here: they pull in torch).
DEFAULT_ALPHA = 0.01
MAX_TABLE_ROWS = 500


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``report`` sub-command.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser, with ``func`` set to :func:`main`.
    """
    parser = subparsers.add_parser(
        "report",
        help="plot a run's decision log or a simulator trace (PNGs and index.html)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a run directory, a rex_decisions.jsonl file, a 'simulate --trace' directory, or"
        " 'simulate --json' output files",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default: rex_report/ inside the first input directory, or next"
        " to the first input file)",
    )
    parser.add_argument("--run-id", default=None, help="the run to draw (default: the log's last)")
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help=f"significance level to draw (default: the records' own, else {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="trace directories: the policy to draw (default: rex if traced, else the first)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="trace directories: the seed to draw"
    )
    parser.set_defaults(func=main)
    return parser


def _fmt_plan(plan: Sequence[int] | None) -> str:
    if plan is None:
        return "-"
    head = ", ".join(str(b) for b in plan[:8])
    return f"[{head}{', ...' if len(plan) > 8 else ''}] (B={sum(plan)}, N={len(plan)})"


def _lineage(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``("resumed from", ...)`` for a run that continues others' windows, else nothing."""
    ids = list(dict.fromkeys(str(r.get("run_id")) for r in records))
    if len(ids) < 2:
        return []
    firsts = {str(r.get("run_id")): r["window"][0] for r in reversed(records)}
    chain = ", then ".join(f"{i} (from step {firsts[i]})" for i in ids[:-1])
    return [("resumed from", chain)]


def _run_section(
    label: str, source: Path, records: list[dict[str, Any]], pngs: list[Path], headline: str
) -> str:
    """The HTML of one run: headline, summary, plots, and its non-hold decisions."""
    escape = html.escape
    changes = [r for r in records if r.get("effective_step") is not None]
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record["decision"])] = counts.get(str(record["decision"]), 0) + 1
    final = changes[-1]["new_plan"] if changes else records[-1]["plan"]
    run_id = str(records[-1].get("run_id"))
    summary = [
        *([] if label == run_id else [("run", label)]),
        ("run id", run_id),
        ("source", str(source)),
        *_lineage(records),
        ("windows", f"{len(records)} (steps {records[0]['window'][0]}-{records[-1]['step']})"),
        ("plan changes", str(len(changes))),
        ("rollbacks", str(counts.get("rollback", 0))),
        ("decisions", ", ".join(f"{k} {v}" for k, v in counts.items())),
        ("first plan", _fmt_plan(records[0]["plan"])),
        ("final plan", _fmt_plan(final)),
    ]
    parts = [f"<h2>{escape(label)}</h2>"]
    if headline:
        parts.append(f'<p class="headline"><b>{escape(headline)}</b></p>')
    parts.append("<table>")
    parts += [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary]
    parts.append("</table>")
    parts += [
        f'<p><a href="{escape(p.name)}"><img src="{escape(p.name)}" alt="{escape(p.stem)}"></a></p>'
        for p in pngs
    ]
    acted = [r for r in records if r["decision"] != "hold"]
    parts.append(f"<h3>Decisions other than hold ({len(acted)})</h3>")
    if acted:
        parts.append(
            "<table><tr><th>window</th><th>decision</th><th>plan</th><th>new plan</th>"
            "<th>effective step</th><th>imbalance</th><th>reason</th></tr>"
        )
        for record in acted[:MAX_TABLE_ROWS]:
            imb = record.get("imbalance")
            cells = [
                f"{record['window'][0]}-{record['window'][1]}",
                str(record["decision"]),
                _fmt_plan(record["plan"]),
                _fmt_plan(record.get("new_plan")),
                "-" if record.get("effective_step") is None else str(record["effective_step"]),
                "-" if imb is None else f"{imb:.3f}",
                str(record.get("reason", "")),
            ]
            parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
        if len(acted) > MAX_TABLE_ROWS:
            parts.append(f"<p>({len(acted) - MAX_TABLE_ROWS} more rows left out)</p>")
    return "\n".join(parts)


def _page(report: Report, sections: list[str], comparison: Path | None) -> str:
    escape = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>lightning-rex report</title>',
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:left;font-size:90%}img{max-width:100%}"
        ".headline{font-size:120%}</style>",
        "</head><body><h1>lightning-rex report</h1>",
    ]
    if comparison is not None:
        parts.append("<h2>Policies compared</h2>")
        parts += [f"<p>{escape(n)}</p>" for n in report.notes]
        parts.append(f'<p><img src="{escape(comparison.name)}" alt="comparison"></p>')
        parts.append(
            "<table><tr><th>scenario</th><th>policy</th><th>efficiency</th>"
            "<th>95% interval</th></tr>"
        )
        for scen, rows in report.comparison.items():
            for pol, (centre, low, high) in rows.items():
                interval = "-" if low is None or high is None else f"[{low:.4f}, {high:.4f}]"
                parts.append(
                    f"<tr><td>{escape(scen)}</td><td>{escape(pol)}</td>"
                    f"<td>{centre:.4f}</td><td>{interval}</td></tr>"
                )
        parts.append("</table>")
    parts += sections
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def main(args: argparse.Namespace) -> int:
    """Run the sub-command.

    Args:
        args: The parsed arguments of :func:`add_parser`'s parser.

    Returns:
        The exit code: 0; 1 without matplotlib; 2 for an input that cannot be reported on.
    """
    try:
        import matplotlib  # noqa: F401  (the optional dependency, named in the message)

        from lightning_rex.tools import plots
    except ImportError as err:
        print(
            f"report: matplotlib is needed ({err}); install it with "
            "`pip install lightning-rex[plot]`",
            file=sys.stderr,
        )
        return 1
    try:
        report = load_inputs(args.inputs, args)
    except ReportError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    if args.alpha is not None and not 0.0 < args.alpha < 1.0:
        print(f"report: --alpha must be in (0, 1), got {args.alpha}", file=sys.stderr)
        return 2
    try:
        written = _write(report, args, plots)
    except OSError as err:
        print(f"report: cannot write the report: {err}", file=sys.stderr)
        return 2
    except (KeyError, IndexError, TypeError, ValueError) as err:
        print(f"report: a record lacks what the plots need ({err!r})", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _write(report: Report, args: argparse.Namespace, plots: ModuleType) -> list[Path]:
    """Draw every plot and the page; return the files written."""
    from lightning_rex.tools.headline import even_split_headline

    first = Path(args.inputs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "rex_report"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sections = []
    used: set[str] = set()
    for label, source, records in report.runs:
        windows = plots.Windows.from_records(records)
        levels = Counter(float(r["alpha"]) for r in records if r.get("alpha"))
        alpha = args.alpha or (levels.most_common(1)[0][0] if levels else DEFAULT_ALPHA)
        # one run: compute.png, ...; several: <scenario or run id>_compute.png, ...
        prefix = "" if len(report.runs) == 1 else _slug(label.split(":")[0]) + "_"
        while prefix in used:
            prefix = f"{prefix}{len(used)}_"
        used.add(prefix)
        title = f"{label}: "
        found = even_split_headline(records)
        headline = "" if found is None else found.sentence()
        pngs = [
            plots.plot_compute(windows, out / f"{prefix}compute.png", title),
            plots.plot_plan(windows, out / f"{prefix}plan.png", float(records[-1]["step"]), title),
            plots.plot_pvalues(windows, out / f"{prefix}pvalues.png", alpha, title),
            plots.plot_throughput(
                windows,
                out / f"{prefix}throughput.png",
                title,
                "" if found is None else f"x{found.speedup[0]:.2f} the even split's estimate",
            ),
        ]
        written += pngs
        sections.append(_run_section(label, source, records, pngs, headline))
    comparison = None
    if report.comparison:
        comparison = plots.plot_comparison(report.comparison, out / "comparison.png")
        written.append(comparison)
    page = out / "index.html"
    page.write_text(_page(report, sections, comparison))
    written.append(page)
    return written
