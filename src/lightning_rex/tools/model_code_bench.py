"""``bench --model-code``: adaptive rex against static plans, for each case of model code.

The cases are :mod:`lightning_rex.tools.bench_cases`'; each run is one of
:func:`~lightning_rex.tools.bench.run_benchmark`'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from lightning_rex.tools.bench import run_benchmark

__all__ = ["run_model_code"]


def run_model_code(args: argparse.Namespace) -> dict[str, Any]:
    """``bench --model-code``: adaptive rex against static plans, for each model-code case.

    For each case of ``args.model_code``, ``args.repeat`` rounds each run adaptive rex (from
    the even plan) and every plan of ``args.static_plans``, interleaved as
    :func:`~lightning_rex.tools.bench.run_benchmark` interleaves strategies.

    Args:
        args: The parsed ``bench`` command line.

    Returns:
        ``{"cases": {case: {...}}}``: per case its ``runs``, rex's final ``plans``, and per
        round rex's throughput over the best static plan's (``rex_over_best_static``, from
        the warm-up's end) and over it after rex's first accepted plan
        (``rex_after_first_accept_over_best_static``).
    """
    out: dict[str, Any] = {}
    for case in args.model_code:
        runs: list[dict[str, Any]] = []
        for plan in args.static_plans:
            run_args = argparse.Namespace(**vars(args))
            run_args.case, run_args.adaptive = case, True
            run_args.compare, run_args.micro_batch_sizes = ["rex", "rex-static"], plan
            result = run_benchmark(run_args, progress=_progress(case, plan))
            runs += [{**r, "static_plan": plan} for r in result["runs"]]
        out[case] = _case_summary(runs, args.repeat)
    return {"cases": out}


def _progress(case: str, plan: list[int]) -> Any:
    def report(done: int, total: int, run: dict[str, Any]) -> None:
        print(
            f"{case} (static {plan}) {done}/{total}: {run['strategy']} "
            f"{run['samples_per_s']:.1f} samples/s, plan {run['plan']}",
            file=sys.stderr,
            flush=True,
        )

    return report


def _case_summary(runs: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    rex = [r for r in runs if r["strategy"] == "rex"]
    static = [r for r in runs if r["strategy"] == "rex-static"]
    whole, after = [], []
    for rep in range(repeat):
        mine = [r for r in rex if r["repeat"] == rep]
        best = max(r["samples_per_s"] for r in static if r["repeat"] == rep)
        whole += [r["samples_per_s"] / best for r in mine]
        after += [
            r["samples_per_s_after_first_accept"] / best
            for r in mine
            if r.get("samples_per_s_after_first_accept")
        ]
    best_plan = max(static, key=lambda r: r["samples_per_s"])["plan"]
    return {
        "runs": runs,
        "plans": [r["plan"] for r in rex],
        "best_static_plan": best_plan,
        "rex_over_best_static": statistics.median(whole),
        "rex_after_first_accept_over_best_static": statistics.median(after) if after else None,
    }
