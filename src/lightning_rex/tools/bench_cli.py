"""``python -m lightning_rex bench``: a real-run benchmark of ddp against rex.

Every strategy runs in turn, in one invocation, on the same model and data, ``--repeat``
times, interleaved (in reverse order on odd repeats), so that the ratios compare runs
measured under the same machine load.
Each run is a real 2-process Lightning fit with the fork start method (Lightning's own
launcher), with the :class:`~lightning_rex.tools.emulator.HeterogeneityEmulator` slowing ranks down.

The model is compute-bound: a weight-tied deep MLP (one ``width x width`` layer applied
``depth`` times to each of a sample's ``tokens`` feature vectors, then mean-pooled), so it
has many FLOPs per sample (about 38 MFLOP forward and backward) and few parameters (76k),
and the gloo all-reduce does not drown the uneven split on two CPU cores. The global batch is
``32 x devices``, as a ddp user would write it.

Unless ``--no-pin``, each rank's threads are pinned to a core of their own (where the machine
has a core per rank), as a cluster gives each rank its own GPU: unpinned, the scheduler moves
two busy ranks and their helper threads between two cores and the run-to-run spread of a
ratio grows from about 3% to about 6%. Pinning applies to every strategy alike.

``--headroom 2`` makes every rank an emulated device at half its core's speed (the emulator
sleeps the rest of each compute phase), so that another process on the machine, taking up to
half a rank's core, leaves the step times, and so the ratios, as they are; ``--depth`` sets
the model's work per sample (``--depth 3`` halves it, so the steps take about as long as
without the headroom). ``examples/quickstart.py`` runs with both.

With ``--adaptive`` and ``ddp`` in ``--compare``, it also checks the report's headline: the
even split's throughput that ``report`` estimates from rex's own records, over the paired
ddp run's measured throughput (1.0 is an unbiased estimate).

``--emulation`` checks the emulator instead of comparing strategies: for each of three model
sizes and each thread count (and each ``--model-code`` case, given one) it trains the even
plan and prints each rank's compute time, as rex measures it, and the factor achieved against
the one asked for.

``--model-code CASES`` runs real model code that waits on peers inside the step (see
:mod:`lightning_rex.tools.bench_cases`: ``sync_dist``, ``unused_head``, ``all_gather``,
``sync_bn``, ``checkpoint``, ``plain``): for each case, adaptive rex and every plan of
``--static-plans``, paired in each round, and it prints rex's throughput over the best static
plan's. ``--slow-forward MS`` makes the ranks slow by the model's own code instead of the
emulator: a rank of slowdown ``s`` sleeps ``s x MS`` milliseconds a sample inside its forward,
before every collective of the step, as every kernel of a slower GPU is slower.

This module is the command line only; the runs are in :mod:`lightning_rex.tools.bench`,
imported when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["add_parser", "main"]


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to fd 1 (this process and forked ranks) to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 1, got {text}")
    return value


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` sub-command.

    Args:
        sub: The sub-parsers object of the top-level parser.

    Returns:
        The ``bench`` parser.
    """
    parser = sub.add_parser(
        "bench",
        help="real 2-process CPU benchmark: ddp vs rex",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--compare",
        type=lambda s: [x.strip() for x in s.split(",")],
        default=["ddp", "rex"],
        help="strategies to run, from ddp,rex,rex-static (default ddp,rex); rex-static is rex "
        "with the fixed static plan, useful beside an --adaptive rex",
    )
    parser.add_argument(
        "--adaptive",
        action="store_true",
        help="rex starts from the even plan and adapts it with a RexCallback; "
        "--micro-batch-sizes then applies to rex-static only",
    )
    parser.add_argument("--window", type=int, default=30, help="RexCallback window (default 30)")
    parser.add_argument("--devices", type=int, default=2, help="CPU ranks (default 2)")
    parser.add_argument(
        "--slowdowns",
        type=_floats,
        default=None,
        help="per-rank emulated slowdowns, e.g. 1,3 (default: all 1)",
    )
    parser.add_argument(
        "--steps", type=int, default=300, help="optimizer steps per run (default 300)"
    )
    parser.add_argument(
        "--warmup", type=int, default=30, help="steps excluded from timing (default 30)"
    )
    parser.add_argument(
        "--micro-batch-sizes",
        type=_ints,
        default=None,
        help="rex plan, e.g. 48,16 (default: proportional to 1/slowdown)",
    )
    parser.add_argument(
        "--events",
        type=json.loads,
        default=None,
        help='emulated events as JSON: [{"ranks":[1],"start":100,"end":120,"factor":4}]',
    )
    parser.add_argument(
        "--depth",
        type=_positive_int,
        default=6,
        help="how many times the model applies its shared hidden layer: the work per "
        "sample (default 6)",
    )
    parser.add_argument(
        "--headroom",
        type=_headroom,
        default=1.0,
        help="emulate every rank as a device this many times slower than its CPU core "
        "(default 1: the fastest rank runs at the core's speed); 2 or more keeps the "
        "step times of a run, and so its ratios, unchanged by another process on the "
        "machine (see HeterogeneityEmulator)",
    )
    parser.add_argument(
        "--width",
        type=_positive_int,
        default=256,
        help="the model's hidden width (default 256)",
    )
    parser.add_argument(
        "--emulation",
        action="store_true",
        help="check the emulator: the even plan on each of --model-sizes and --thread-counts, "
        "each rank's compute time and its slowdown achieved against the one asked for",
    )
    parser.add_argument(
        "--model-sizes",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=["small", "medium", "large"],
        help="with --emulation: models from small,medium,large (default all three)",
    )
    parser.add_argument(
        "--thread-counts",
        type=lambda s: [0 if x.strip() == "default" else _positive_int(x) for x in s.split(",")],
        default=[1, 0],
        help="with --emulation: torch threads per rank, 'default' for torch's own choice "
        "(default 1,default)",
    )
    parser.add_argument(
        "--model-code",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=None,
        help="run these model-code cases (from plain,sync_dist,unused_head,all_gather,sync_bn,"
        "checkpoint): adaptive rex against each --static-plans plan, per case",
    )
    parser.add_argument(
        "--static-plans",
        type=lambda s: [_ints(p) for p in s.split("/") if p.strip()],
        default=None,
        help="with --model-code: the static plans, e.g. 46,18/48,16/50,14 (default: the plan "
        "proportional to 1/slowdown)",
    )
    parser.add_argument(
        "--slow-forward",
        type=float,
        default=None,
        metavar="MS",
        help="no emulator: a rank of slowdown s sleeps s x MS milliseconds a sample inside its "
        "forward (the model's own code is slow)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repeats (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="do not pin each rank to a core of its own (pinned by default where there is a "
        "core per rank)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON object on stdout"
    )
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Validate the arguments, run the benchmark and print the results.

    Args:
        args: The parsed command line.

    Returns:
        The exit code.
    """
    from lightning_rex.tools.bench import MODEL_SIZES, PER_RANK_BATCH, run_benchmark

    unknown = [s for s in args.compare if s not in ("ddp", "rex", "rex-static")]
    if unknown:
        raise SystemExit(f"--compare takes strategies from ddp,rex,rex-static; unknown: {unknown}")
    if args.slowdowns is None:
        args.slowdowns = [1.0] * args.devices
    if len(args.slowdowns) != args.devices:
        raise SystemExit(
            f"--slowdowns needs {args.devices} values (one per device), got {args.slowdowns}"
        )
    if args.micro_batch_sizes is not None and (
        len(args.micro_batch_sizes) != args.devices
        or sum(args.micro_batch_sizes) != PER_RANK_BATCH * args.devices
    ):
        raise SystemExit(
            f"--micro-batch-sizes needs {args.devices} values summing to "
            f"{PER_RANK_BATCH * args.devices}"
        )
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"--warmup must be in [0, --steps), got {args.warmup}")
    if args.emulation:
        return _emulation(args, MODEL_SIZES)
    if args.model_code is not None:
        return _model_code(args)
    with _stdout_to_stderr():
        result = run_benchmark(args)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'strategy':8s} {'repeat':>6s} {'samples/s':>10s} {'step ms':>8s}  plan")
    for run in result["runs"]:
        print(
            f"{run['strategy']:8s} {run['repeat']:6d} {run['samples_per_s']:10.1f} "
            f"{run['step_ms_median']:8.2f}  {run['plan']}"
        )
    if "ratio_rex_over_ddp" in result:
        ratios = result["ratios"]
        print(
            f"rex/ddp throughput ratio: {result['ratio_rex_over_ddp']:.3f} "
            f"(median of {len(ratios)}; min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
    for key, label in (
        ("ratio_rex_static_over_ddp", "rex-static/ddp throughput ratio"),
        ("ratio_rex_after_first_accept_over_ddp", "rex/ddp after the first accepted plan"),
    ):
        if key in result:
            print(f"{label}: {result[key]:.3f}")
    if even := result.get("headline_even_over_ddp"):
        print(
            "the report's even-split estimate / ddp measured: "
            f"{statistics.median(even):.3f} (per round: {', '.join(f'{e:.3f}' for e in even)})"
        )
    for run in result["runs"]:
        if run.get("adaptive"):
            print(f"rex repeat {run['repeat']} plan history: {run['plan_history']}")
    return 0


def _model_code(args: argparse.Namespace) -> int:
    """``--model-code``: rex against the best static plan, per case of model code."""
    from lightning_rex.tools.bench import PER_RANK_BATCH, default_plan
    from lightning_rex.tools.bench_cases import CASES
    from lightning_rex.tools.model_code_bench import run_model_code

    unknown = [c for c in args.model_code if c not in CASES]
    if unknown:
        raise SystemExit(f"--model-code takes cases from {','.join(CASES)}; unknown: {unknown}")
    if args.static_plans is None:
        args.static_plans = [args.micro_batch_sizes or default_plan(args.slowdowns, args.devices)]
    for plan in args.static_plans:
        if len(plan) != args.devices or sum(plan) != PER_RANK_BATCH * args.devices:
            raise SystemExit(
                f"--static-plans: {plan} needs {args.devices} values summing to "
                f"{PER_RANK_BATCH * args.devices}"
            )
    with _stdout_to_stderr():
        result = run_model_code(args)
    if args.json:
        print(json.dumps(result))
        return 0
    head = f"{'case':12s} {'rex / best static':>17s} {'after 1st accept':>16s}"
    print(f"{head}  best static, rex plans")
    for case, row in result["cases"].items():
        after = row["rex_after_first_accept_over_best_static"]
        print(
            f"{case:12s} {row['rex_over_best_static']:17.3f} "
            f"{'-' if after is None else f'{after:.3f}':>16s}  {row['best_static_plan']}, "
            f"{row['plans']}"
        )
    return 0


def _emulation(args: argparse.Namespace, sizes: dict[str, Any]) -> int:
    """``--emulation``: the achieved slowdowns per model size and thread count."""
    from lightning_rex.tools.bench import run_emulation_check

    unknown = [s for s in args.model_sizes if s not in sizes]
    if unknown:
        raise SystemExit(f"--model-sizes takes names from {','.join(sizes)}; unknown: {unknown}")
    if len(set(args.slowdowns)) == 1:
        raise SystemExit("--emulation needs --slowdowns that differ, e.g. 1,3")
    cases = args.model_code or ["plain"]
    with _stdout_to_stderr():
        rows = run_emulation_check(args, args.model_sizes, args.thread_counts, cases)
    if args.json:
        print(json.dumps({"emulation": rows}))
        return 0
    print(
        f"{'case':12s} {'model':7s} {'threads':>7s}  {'compute ms per rank':24s} achieved / asked"
    )
    for row in rows:
        times_ms = ", ".join(f"{m:.2f}" for m in row["median_ms"])
        got = ", ".join(f"{a:.2f}/{b:g}" for a, b in zip(row["achieved"], row["asked"]))
        threads = row["threads"] or "default"
        print(f"{row['case']:12s} {row['size']:7s} {threads:>7}  {times_ms:24s} {got}")
    return 0
