"""Quick start: what ``strategy="rex"`` does for a cluster with one slow rank.

Two CPU ranks train the same model on the same global batch (64 samples a step); rank 1 is
emulated 3x slower, as a V100 beside an A100 would be. Both are emulated devices twice as
slow as their CPU core (the emulator's ``headroom=2``), so that another process on the
machine, taking up to half a core, leaves every step time and ratio as it is. First a short
scan times a few static plans and keeps the fastest; then rounds of three runs are
interleaved:

* ``ddp``: Lightning's DDP, both ranks get 32 samples, the fast rank waits every step;
* ``rex``: your script with ``strategy="rex"`` and nothing else: it starts from the same even
  plan, measures each rank, and moves samples to the fast rank once a test says the
  imbalance is real;
* ``best static plan``: ``RexStrategy(micro_batch_sizes=..., adaptive=False)`` with the
  fastest plan of the scan, the plan you would pick if you knew the speeds in advance (the
  best rex can hope for).

In your own script the change is two lines::

    import lightning_rex  # registers the "rex" strategy
    trainer = L.Trainer(devices=2, strategy="rex")  # was strategy="ddp"

Run it (its duration on two cores is in README.md, Results; ``--repeat 5`` for a tighter
median; ``--json FILE`` also writes the runs and ratios, as ``nox -s figures`` reads them)::

    python examples/quickstart.py
    python examples/quickstart.py --repeat 5 --steps 300

The ratios are taken within each round (three runs back to back, under the same load) and
reported as their median over the rounds with their range, so a load that drifts between
runs cancels; the headroom keeps a load that stays from changing how unequal the ranks are
(see README.md, Results).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import statistics
import sys
import time
import warnings
from typing import Any

from lightning_rex.tools import bench, bench_cli

STRATEGIES = {"ddp": "ddp", "rex": "rex (adaptive)", "rex-static": "best static plan"}
SCAN = (10, 12, 14, 16, 18)
"""Rank 1's micro-batch in the static plans the scan times (rank 0 gets the rest of 64)."""
EMULATION = "--slowdowns 1,3 --headroom 2 --depth 3"
"""Rank 1 3x slower; both ranks devices at half their core's speed; a model half the default's
work per sample, so that the headroom does not double the demo's time."""
SCAN_STEPS = 90
"""Steps of each scan run (the first 30 untimed)."""
RUN_START = 50
"""A run's start (fork, Lightning's setup) in steps' worth of time, for the ETA."""


def quiet() -> None:
    """Silence Lightning's banners and third-party warnings, for this demo only."""
    warnings.simplefilter("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_rex"):
        logging.getLogger(name).setLevel(logging.ERROR)


class Progress:
    """A bar over every step of every run, with an ETA, on stderr.

    Args:
        runs: ``(label, steps)`` of every run, in order.
    """

    def __init__(self, runs: list[tuple[str, int]]) -> None:
        self.runs = runs
        self.total = sum(n + RUN_START for _, n in runs)
        self.start = time.monotonic()  # system-wide: the forked ranks read the same clock

    def step(self, run: int, done: int) -> None:
        """Draw the bar (called in rank 0's process after each step).

        Args:
            run: The run's index.
            done: Steps done in that run.
        """
        if done % 5 and done != self.runs[run][1]:
            return
        steps = sum(n + RUN_START for _, n in self.runs[:run]) + RUN_START + done
        frac = steps / self.total
        elapsed = time.monotonic() - self.start
        eta = f"{(elapsed / frac - elapsed) / 60:4.1f} min left" if frac > 0.02 else "..."
        width = 30
        filled = int(width * frac)
        label = f"run {run + 1}/{len(self.runs)} {self.runs[run][0]}, step {done}"
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {frac:4.0%} {label:38s} {eta}"
        )
        sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line."""
        sys.stderr.write("\n")
        sys.stderr.flush()


def _args(cmd: str, steps: int, repeat: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    return parser.parse_args([*cmd.split(), "--steps", str(steps), "--repeat", str(repeat)])


def _scan_step(progress: Progress, index: int, _run: int, done: int) -> None:
    progress.step(index, done)


def scan(progress: Progress) -> tuple[list[int], dict[tuple[int, ...], float]]:
    """Time each static plan of ``SCAN`` once.

    Args:
        progress: The bar (the scan's runs come first in it).

    Returns:
        The fastest plan, and the samples/s of every plan.
    """
    rates: dict[tuple[int, ...], float] = {}
    for i, small in enumerate(SCAN):
        plan = [64 - small, small]
        cmd = f"bench --compare rex-static {EMULATION} --micro-batch-sizes {plan[0]},{plan[1]}"
        res = bench.run_benchmark(
            _args(cmd, SCAN_STEPS, 1),
            progress=lambda *_: None,
            on_step=functools.partial(_scan_step, progress, i),
        )
        rates[tuple(plan)] = float(res["runs"][0]["samples_per_s"])
    best = max(rates, key=lambda p: rates[p])
    return list(best), rates


def _spread(values: list[float]) -> str:
    return f"x{statistics.median(values):.2f} (range x{min(values):.2f}-x{max(values):.2f})"


def summary(result: dict[str, Any], plan: list[int], scanned: int) -> list[str]:
    """The demo's report: throughputs, then the ratios paired within each round.

    Args:
        result: :func:`~lightning_rex.tools.bench.run_benchmark`'s result.
        plan: The static plan the runs used.
        scanned: How many static plans the scan timed.

    Returns:
        The lines to print.
    """
    by: dict[str, list[dict[str, Any]]] = {}
    for r in result["runs"]:
        by.setdefault(r["strategy"], []).append(r)
    lines = []
    for name, runs in by.items():
        rates = [r["samples_per_s"] for r in runs]
        label = STRATEGIES[name] + (f" {plan}" if name == "rex-static" else "")
        line = f"{label:25s} {statistics.median(rates):6.0f} samples/s"
        line += f" (runs {min(rates):.0f}-{max(rates):.0f})"
        if name == "rex":
            plans = [tuple(int(b) for b in r["plan"]) for r in runs]
            first = [r["first_accept_step"] for r in runs if r.get("first_accept_step") is not None]
            common = collections.Counter(plans).most_common(1)[0][0]
            line += f"; plan found {list(common)}"
            if first:
                line += f" by step {statistics.median(first):.0f}"
        lines.append(line)
    rounds = len(result["ratios"])
    rex_static = [a / b for a, b in zip(result["ratios"], result["ratios_rex_static"])]
    lines += [
        f"paired within each of {rounds} rounds (median, range):",
        f"  rex / ddp                 {_spread(result['ratios'])}",
        f"  best static plan / ddp    {_spread(result['ratios_rex_static'])}",
        f"  rex / best static plan    {_spread(rex_static)}"
        " (rex starts from the even plan: its first windows run at ddp's speed)",
        f"the static plan {plan} is the fastest of {scanned} timed by the scan",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results to FILE")
    a = p.parse_args(argv)
    if a.steps <= 60:
        p.error("--steps must be above 60: 30 warm-up steps are not timed, and rex needs windows")
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    quiet()
    compare = ["ddp", "rex", "rex-static"]
    order = [n for rep in range(a.repeat) for n in (compare if rep % 2 == 0 else compare[::-1])]
    progress = Progress(
        [(f"scan {[64 - s, s]}", SCAN_STEPS) for s in SCAN] + [(n, a.steps) for n in order]
    )
    print(
        "2 CPU ranks emulating devices at half their core's speed, rank 1 3x slower, global "
        f"batch 64; a scan of {len(SCAN)} "
        f"static plans, then {a.repeat} rounds of ddp, rex and the best static plan, "
        f"{a.steps} steps a run"
    )
    best, rates = scan(progress)
    cmd = (
        f"bench --compare ddp,rex,rex-static --adaptive {EMULATION} "
        f"--micro-batch-sizes {best[0]},{best[1]}"
    )
    result = bench.run_benchmark(
        _args(cmd, a.steps, a.repeat),
        progress=lambda *_: None,
        on_step=lambda run, done: progress.step(len(SCAN) + run, done),
    )
    progress.close()
    print("scan: " + ", ".join(f"{list(k)} {v:.0f}" for k, v in rates.items()) + " samples/s")
    print("\n".join(summary(result, best, len(SCAN))))
    if a.json:
        scanned = [{"plan": list(k), "samples_per_s": v} for k, v in rates.items()]
        out = {"scan": scanned, "static_plan": best, **result}
        with open(a.json, "w") as fh:
            json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
