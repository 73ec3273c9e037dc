"""Quick start: what ``strategy="rex"`` does for a cluster with one slow rank.

Two CPU ranks train the same model on the same global batch (64 samples a step); rank 1 is
emulated 3x slower, as a V100 beside an A100 would be. Three runs of each are interleaved:

* ``ddp``: Lightning's DDP, both ranks get 32 samples, the fast rank waits every step;
* ``rex``: your script with ``strategy="rex"`` and nothing else: it starts from the same even
  plan, measures each rank, and moves samples to the fast rank once a test says the
  imbalance is real;
* ``best static plan``: ``RexStrategy(micro_batch_sizes=[50, 14], adaptive=False)``, the plan
  you would pick if you knew the speeds in advance (the best rex can hope for).

In your own script the change is two lines::

    import lightning_rex  # registers the "rex" strategy
    trainer = L.Trainer(devices=2, strategy="rex")  # was strategy="ddp"

Run it (about 4 minutes on two cores; ``--repeat 5`` for a tighter median)::

    python examples/quickstart.py [--repeat 3] [--steps 300]

The throughputs are medians over the repeats, with their range: on a shared machine one run
can be 10% off, so no single run is quoted.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings
from typing import Any

from lightning_rex.tools import bench, bench_cli

STRATEGIES = {"ddp": "ddp", "rex": "rex (adaptive)", "rex-static": "best static plan"}


def quiet() -> None:
    """Silence Lightning's banners and third-party warnings, for this demo only."""
    warnings.simplefilter("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_rex"):
        logging.getLogger(name).setLevel(logging.ERROR)


def bar(done: int, total: int, run: dict[str, Any]) -> None:
    width = 30
    filled = width * done // total
    label = f"{STRATEGIES[run['strategy']]}: {run['samples_per_s']:.0f} samples/s"
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:40s}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def summary(result: dict[str, Any]) -> list[str]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in result["runs"]:
        by.setdefault(r["strategy"], []).append(r)
    ddp = statistics.median(r["samples_per_s"] for r in by["ddp"])
    lines = []
    for name, runs in by.items():
        rates = [r["samples_per_s"] for r in runs]
        med = statistics.median(rates)
        line = (
            f"{STRATEGIES[name]:17s} {med:7.0f} samples/s (range {min(rates):.0f}-{max(rates):.0f})"
            f"  x{med / ddp:.2f} of ddp"
        )
        if name == "rex":
            plans = [tuple(r["plan"]) for r in runs]
            first = [r["first_accept_step"] for r in runs if r.get("first_accept_step") is not None]
            line += f"; plan found {max(set(plans), key=plans.count)}"
            if first:
                line += f" by step {statistics.median(first):.0f}"
        lines.append(line)
    rex, static = (
        statistics.median(r["samples_per_s"] for r in by[k]) for k in ("rex", "rex-static")
    )
    lines.append(
        f"rex reached x{rex / static:.2f} of the best static plan, starting from the even plan "
        "(its first windows run at ddp's speed)"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs of each (default 3)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    a = p.parse_args(argv)
    if a.steps <= 60:
        p.error("--steps must be above 60: 30 warm-up steps are not timed, and rex needs windows")
    quiet()
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    cmd = "bench --compare ddp,rex,rex-static --adaptive --slowdowns 1,3 --micro-batch-sizes 50,14"
    args = parser.parse_args([*cmd.split(), "--steps", str(a.steps), "--repeat", str(a.repeat)])
    print(
        f"2 CPU ranks, rank 1 emulated 3x slower, global batch 64, {a.steps} steps a run, "
        f"{a.repeat} runs each (interleaved)"
    )
    result = bench.run_benchmark(args, progress=bar)
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
