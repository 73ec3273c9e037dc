"""``simulate`` on a workload scenario: global batch policies compared by time to target.

``python -m lightning_rex simulate --scenario gns-slow-8 --compare
fixed,hindsight,adaptive-oracle,pollux,pollux-split,rex --seeds 0-9 [--json]`` runs each
policy of :data:`~lightning_rex.sim.engine.goodput.BATCH_POLICIES` to the workload's target
(:func:`~lightning_rex.sim.engine.goodput.run_goodput`) and prints, per policy, the time to target
and what the policy did. Over a seed set, ``--json`` gives each
policy's ``time_to_target_mean`` in seconds, and ``rex_time_ratio`` is rex's time over the
policy's, paired by seed, with a 95% interval (below 1: rex is faster).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from lightning_rex.sim.cli.progress import progress_bar
from lightning_rex.sim.cli.report import paired_ratio
from lightning_rex.sim.engine.goodput import (
    BATCH_POLICIES,
    hindsight_batch,
    limit_curve,
    run_goodput,
)
from lightning_rex.sim.engine.time_parts import PARTS
from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = ["aggregate_goodput", "main_goodput"]

_COLS = [
    "time_to_target_s",
    "steps",
    "mean_batch",
    "final_batch",
    "batch_changes",
    "first_batch_change_step",
    "rollbacks",
    "decision_ms_p99",
]
# the default tables (100 columns); --wide prints every metric
_NARROW = ["time_to_target_s", "steps", "mean_batch", "batch_changes", "first_batch_change_step"]
_NARROW_SEEDS = [
    "time_to_target_mean",
    "reached",
    "mean_batch_mean",
    "first_change_step_mean",
    "rex_time_ratio",
]


def aggregate_goodput(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy's figures over a seed set.

    Args:
        rs: The policy's :meth:`~lightning_rex.sim.engine.goodput.GoodputResult.to_dict` per seed.

    Returns:
        Mean and largest time to target (over the runs that reached it, None if none did),
        the share that reached it, and means of the steps, batch, changes, first change
        step and rollbacks, the largest p99 decision time, and the mean of each of the
        time parts over the runs that reached the target (None if none did).
    """
    times = [r["time_to_target_s"] for r in rs if r["reached"]]
    parts = [r["time_parts"] for r in rs if r["reached"] and r.get("time_parts")]
    firsts = [r["first_batch_change_step"] for r in rs if r["first_batch_change_step"] is not None]
    return {
        "time_to_target_mean": float(np.mean(times)) if times else None,
        "time_to_target_max": float(np.max(times)) if times else None,
        "reached": float(np.mean([r["reached"] for r in rs])),
        "steps_mean": float(np.mean([r["steps"] for r in rs])),
        "mean_batch_mean": float(np.mean([r["mean_batch"] for r in rs])),
        "batch_changes_mean": float(np.mean([r["batch_changes"] for r in rs])),
        "first_change_step_mean": float(np.mean(firsts)) if firsts else None,
        "rollbacks_mean": float(np.mean([r["rollbacks"] for r in rs])),
        "decision_ms_p99": float(np.max([r["decision_ms_p99"] for r in rs])),
        "time_parts_mean": (
            {k: float(np.mean([p[k] for p in parts])) for k in PARTS} if parts else None
        ),
    }


def _names(args: argparse.Namespace) -> list[str]:
    names = [args.policy] if args.compare is None else args.compare.split(",")
    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in names if n not in BATCH_POLICIES]
    if bad:
        raise ValueError(
            f"{bad[0]!r} is not a global batch policy; a workload scenario compares "
            f"{', '.join(BATCH_POLICIES)}"
        )
    return names


def main_goodput(args: argparse.Namespace, scen: Scenario, fmt: Any) -> int:
    """Run the global batch policies of ``args`` on a workload scenario.

    Args:
        args: ``simulate``'s parsed arguments.
        scen: The scenario (with a workload).
        fmt: Formats a table, ``fmt(rows, cols)``.

    Returns:
        The exit code: 0, or 2 for an option a workload scenario does not take.
    """
    unsupported = [
        f"--{k.replace('_', '-')}"
        for k in ("trace", "warmup", "max_warmup", "decision_lag")
        if getattr(args, k) is not None
    ]
    try:
        if unsupported:
            raise ValueError(f"{unsupported[0]} is not supported on a workload scenario")
        names = _names(args)
        limit = limit_curve(scen)
        best_fixed = hindsight_batch(scen, limit)[0] if "hindsight" in names else None
    except ValueError as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    seeds = [args.seed] if args.seeds is None else list(args.seeds)
    bar = progress_bar(len(seeds) * len(names), args)
    per: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in seeds:
        for policy_name in names:
            bar.set_postfix_str(f"seed {seed}, {policy_name}")
            per[policy_name].append(
                run_goodput(scen, policy_name, seed, hindsight=best_fixed, limit=limit).to_dict()
            )
            bar.update(1)
    bar.close()
    head = (
        f"scenario {scen.name}, {scen.world_size} ranks, global batch {scen.global_batch} at "
        f"the start, hindsight-best fixed batch {best_fixed}"
    )
    if args.seeds is None:
        res = {n: rs[0] for n, rs in per.items()}
        if args.json:
            out = {"scenario": scen.name, "seed": args.seed, "hindsight_batch": best_fixed}
            print(json.dumps({**out, "policies": res}))
        else:
            print(f"{head}, seed {args.seed}")
            print(fmt(res, _COLS if args.wide else _NARROW))
        return 0
    agg = {n: aggregate_goodput(rs) for n, rs in per.items()}
    if "rex" in per:  # rex's time over each policy's, paired by seed (runs that all reached)
        for policy_name, results in per.items():
            pairs = [
                (a["time_to_target_s"], b["time_to_target_s"])
                for a, b in zip(per["rex"], results)
                if a["reached"] and b["reached"]
            ]
            if pairs:
                ratio = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
                agg[policy_name]["rex_time_ratio"], agg[policy_name]["rex_time_ratio_ci95"] = (
                    ratio[0],
                    [ratio[1], ratio[2]],
                )
            else:
                agg[policy_name]["rex_time_ratio"], agg[policy_name]["rex_time_ratio_ci95"] = (
                    None,
                    [None, None],
                )
    if args.json:
        out = {"scenario": scen.name, "seeds": seeds, "hindsight_batch": best_fixed}
        print(json.dumps({**out, "policies": agg}))
    else:
        print(f"{head}, seeds {seeds[0]}..{seeds[-1]} ({len(seeds)})")
        cols = list(next(iter(agg.values())).keys())
        print(fmt(agg, cols if args.wide else [c for c in _NARROW_SEEDS if c in cols]))
    return 0
