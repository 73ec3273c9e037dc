r"""``python -m lightning_rex simulate``: run policies on a scenario and print the metrics.

Single run::

    python -m lightning_rex simulate --scenario a100-v100-t4-8 --policy rex --seed 0 [--json]

Comparison (the oracle always runs too, since efficiency needs it)::

    python -m lightning_rex simulate --scenario drift-16 \
        --compare even,static,proportional,rex,oracle

With ``--json`` stdout holds exactly one JSON object,
``{"scenario", "seed", "policies": {name: {metrics}}}`` (see
:class:`lightning_rex.sim.engine.scoring.SimResult`). ``--seeds 0-19`` runs a fixed seed set and
prints aggregates instead (mean/min efficiency over the whole run and at steady state,
false rescales per 10,000 steps, the share of events acted on within 3 windows, decision
latency); ``--cv`` / ``--ar1`` / ``--steps`` override the scenario, and ``--warmup`` /
``--max-warmup`` / ``--decision-lag`` the window loop's settings (to see what each of
training's costs takes from a policy). ``--trace DIR`` also writes every run's window
records (the format of training's ``rex_decisions.jsonl``) and ``DIR/summary.json``, which
``python -m lightning_rex report DIR`` plots (see :mod:`lightning_rex.sim.cli.trace`).

On a scenario with a ``workload`` (the ``gns-*`` presets), the policies are global batch
policies, ``--compare fixed,hindsight,pollux,pollux-split,pollux-rex,adaptive-oracle,rex``,
compared by their time to the workload's target (see :mod:`lightning_rex.sim.cli.goodput`).

On a scenario with memory (pass caps, :mod:`lightning_rex.sim.scenarios.memory`: ``fsdp-memory-8``)
the output names each rank's pass cap, and a seed set adds rex's throughput over every
other policy's, paired by seed (``"memory"`` in the JSON): ``rex / oracle`` is how close rex
comes to the best plan that prices accumulation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lightning_rex.sim.cli.progress import progress_bar

__all__ = ["add_parser", "best_peer", "main"]

POLICIES = ("even", "static", "proportional", "throughput", "lbb", "omnilearn", "rex", "oracle")
# on workload scenarios only (rex too); goodput.BATCH_POLICIES less rex (a test holds them
# equal: the goodput module is imported only when a workload scenario runs)
BATCH_POLICIES = ("fixed", "hindsight", "pollux", "pollux-split", "pollux-rex", "adaptive-oracle")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``simulate`` sub-command.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser, with ``func`` set to :func:`main`.
    """
    parser = subparsers.add_parser(
        "simulate",
        help="run rescaling policies on a simulated cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", required=True, help="a preset name or a .json/.yaml file")
    parser.add_argument(
        "--policy",
        default="rex",
        choices=POLICIES + BATCH_POLICIES,
        help="policy for a single run (fixed, hindsight, pollux, pollux-split, pollux-rex,"
        " adaptive-oracle: workload scenarios only)",
    )
    parser.add_argument("--compare", default=None, help="comma-separated policies to compare")
    parser.add_argument("--seed", type=_seed, default=0, help="noise seed (default 0)")
    parser.add_argument(
        "--seeds", type=_seeds, default=None, help="a seed set 'A-B' (inclusive): aggregates"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every metric (the default table fits 100 columns)",
    )
    parser.add_argument("--cv", type=float, default=None, help="override the noise CV")
    parser.add_argument("--ar1", type=float, default=None, help="override the noise AR(1)")
    parser.add_argument("--steps", type=int, default=None, help="override the run length")
    parser.add_argument(
        "--shape-change-s",
        type=float,
        default=None,
        help="override the seconds a new micro-batch shape costs (0: free)",
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="override the loop's warm-up steps (default 1)"
    )
    parser.add_argument(
        "--max-warmup",
        type=int,
        default=None,
        help="override the most steps the warm-up lasts while steps get faster (default 200)",
    )
    parser.add_argument(
        "--decision-lag",
        type=int,
        default=None,
        help="override the steps from a gather to its decision (default: half the steps between"
        " gathers, window // 2 for peers, window // 6 for rex's three looks per window)",
    )
    parser.add_argument(
        "--prior",
        default=None,
        metavar="SOURCE",
        help="rex's first plan from a prior, as RexCallback(prior=...): a decision log (a"
        " trace's seed<k>.jsonl), a run directory or a profile_curve.py JSON",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="write each run's window records to DIR/<scenario>/<policy>/seed<k>.jsonl and the"
        " seed aggregates to DIR/summary.json (input of 'report')",
    )
    parser.set_defaults(func=main)
    return parser


def _policies(args: argparse.Namespace) -> list[str]:
    names = [args.policy] if args.compare is None else args.compare.split(",")
    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad:
        what = (
            f"policy {bad[0]!r} needs a workload scenario"
            if bad[0] in BATCH_POLICIES
            else f"unknown policy {bad[0]!r}"
        )
        raise ValueError(f"{what}; choose from {', '.join(POLICIES)}")
    if "oracle" not in names:
        names.append("oracle")
    return names


# the default tables' columns (100 characters wide); --wide prints every metric
_SINGLE = [
    "efficiency",
    "steady_efficiency",
    "rescales",
    "rollbacks",
    "false_rescales",
    "decision_ms_p99",
]
_SEEDS = [
    "eff_mean",
    "eff_min",
    "steady_eff_mean",
    "rescales_mean",
    "false_per_10k_steps",
    "vs_rex",
]

_MAX_SEED = 2**32 - 1
_MAX_SEEDS = 10_000


def _seed(text: str) -> int:
    """A noise seed from the command line: an integer in ``[0, 2**32)``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {text!r}") from None
    if not 0 <= value <= _MAX_SEED:
        raise argparse.ArgumentTypeError(f"a seed is in [0, {_MAX_SEED}], got {value}")
    return value


def _seeds(spec: str) -> list[int]:
    """A seed set: ``A-B`` (inclusive, ``A <= B``) or ``a,b,c``."""
    text = spec.strip()
    if "-" in text[1:]:  # a range (a leading "-" is a negative seed, refused by _seed)
        dash = text.index("-", 1)
        first, last = _seed(text[:dash].strip()), _seed(text[dash + 1 :].strip())
        if last < first:
            raise argparse.ArgumentTypeError(f"a seed range A-B needs A <= B, got {spec!r}")
        if last - first + 1 > _MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"at most {_MAX_SEEDS:,} seeds, got {spec!r}")
        return list(range(first, last + 1))
    seeds = [_seed(x.strip()) for x in text.split(",")]
    if len(seeds) > _MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"at most {_MAX_SEEDS:,} seeds, got {len(seeds):,}")
    return seeds


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ",".join(_fmt(x) for x in v[:8]) + (",..." if len(v) > 8 else "") + "]"
    return str(v)


def _table(rows: dict[str, dict[str, Any]], cols: list[str]) -> str:
    head = ["policy", *cols]
    body = [[name] + [_fmt(r[c]) for c in cols] for name, r in rows.items()]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in body]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run the sub-command.

    Args:
        args: The parsed arguments of :func:`add_parser`'s parser.

    Returns:
        The exit code: 0, or 2 for a bad scenario.
    """
    from lightning_rex.driver.config import LoopConfig
    from lightning_rex.sim.cli.report import aggregate, memory_summary, paired_ratio
    from lightning_rex.sim.cli.trace import (
        read_summary,
        run_traced,
        trace_path,
        write_records,
        write_summary,
    )
    from lightning_rex.sim.engine.engine import default_loop, simulate
    from lightning_rex.sim.engine.scoring import run
    from lightning_rex.sim.policies.builtin import OraclePolicy, make_policy
    from lightning_rex.sim.scenarios.scenario import ScenarioError
    from lightning_rex.sim.scenarios.schema import (
        load_scenario,
        with_noise,
        with_shape_change,
        with_steps,
    )

    try:
        scen = load_scenario(args.scenario)
        if args.cv is not None or args.ar1 is not None:
            scen = with_noise(scen, args.cv, args.ar1)
        if args.steps is not None:
            scen = with_steps(scen, args.steps)
        if args.shape_change_s is not None:
            scen = with_shape_change(scen, args.shape_change_s)
    except ScenarioError as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    if scen.workload is not None:
        from lightning_rex.sim.cli.goodput import main_goodput

        return main_goodput(args, scen, _table)
    try:
        names = _policies(args)
    except ValueError as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    # each policy's loop: the scenario's window, the policy's looks, the overrides
    loops: dict[str, LoopConfig] = {}
    try:
        for policy_name in names:
            pol = make_policy(policy_name, scen)
            loops[policy_name] = default_loop(
                scen,
                pol,
                warmup=args.warmup,
                decision_lag=args.decision_lag,
                max_warmup=args.max_warmup,
            )
    except ValueError as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    prior = None
    if args.prior is not None:
        from lightning_rex.driver.prior import load_prior
        from lightning_rex.sim.policies.builtin import RexPolicy

        try:
            prior = load_prior(args.prior)
        except ValueError as err:
            print(f"simulate: {err}", file=sys.stderr)
            return 2

    def policy(n: str) -> Any:  # a fresh policy object for rex with a prior, else the name
        return RexPolicy(prior=prior) if n == "rex" and prior is not None else n

    if args.trace is not None:
        try:  # before any run: a trace that cannot be written should not cost a simulation
            Path(args.trace).mkdir(parents=True, exist_ok=True)
            read_summary(args.trace)
        except (OSError, ValueError) as err:
            print(f"simulate: cannot write the trace to {args.trace}: {err}", file=sys.stderr)
            return 2

    seeds_run = [args.seed] if args.seeds is None else list(args.seeds)
    bar = progress_bar(len(seeds_run) * len(names), args)

    def one(n: str, seed: int, oracle: Any) -> dict[str, Any]:
        bar.set_postfix_str(f"seed {seed}, {n}")
        try:
            return _one(n, seed, oracle)
        finally:
            bar.update(1)

    def _one(n: str, seed: int, oracle: Any) -> dict[str, Any]:
        if args.trace is None:
            return run(scen, policy(n), seed, oracle=oracle, loop=loops[n]).to_dict()
        res, records = run_traced(scen, policy(n), seed, oracle, loops[n])
        if n != "oracle":  # the oracle runs no window loop
            write_records(trace_path(args.trace, scen.name, n, seed), records)
        return res.to_dict()

    if args.seeds is None:
        oracle = simulate(scen, OraclePolicy(scen), args.seed)
        res = {n: one(n, args.seed, oracle) for n in names}
        bar.close()
        if args.trace is not None:
            path = write_summary(args.trace, scen, [args.seed], {n: [r] for n, r in res.items()})
            print(f"simulate: wrote the trace to {path.parent}", file=sys.stderr)
        if args.json:
            print(json.dumps({"scenario": scen.name, "seed": args.seed, "policies": res}))
        else:
            print(
                f"scenario {scen.name}, seed {args.seed}, {scen.world_size} ranks, "
                f"{scen.steps} steps"
            )
            if scen.pass_caps is not None:
                print(f"pass caps (samples per pass, memory): {_fmt(scen.pass_caps)}")
            cols = (
                _SINGLE
                if not args.wide
                else [
                    "throughput",
                    "efficiency",
                    "steady_efficiency",
                    "time_to_90pct_windows",
                    "rescales",
                    "plan_changes",
                    "rollbacks",
                    "false_rescales",
                    "detection_delay_windows",
                    "decision_ms_p50",
                    "decision_ms_p99",
                ]
            )
            print(_table(res, cols))
        return 0
    seeds = list(args.seeds)
    per: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in seeds:
        oracle = simulate(scen, OraclePolicy(scen), seed)
        for policy_name in names:
            per[policy_name].append(one(policy_name, seed, oracle))
    bar.close()
    if args.trace is not None:
        path = write_summary(args.trace, scen, seeds, per)
        print(f"simulate: wrote the trace to {path.parent}", file=sys.stderr)
    agg = {n: aggregate(rs, scen.steps) for n, rs in per.items()}
    best: dict[str, Any] | None = None
    if "rex" in per:  # each policy against rex, paired by seed
        rex = [r["efficiency"] for r in per["rex"]]
        for policy_name, results in per.items():
            ratio = paired_ratio([r["efficiency"] for r in results], rex)
            agg[policy_name]["vs_rex"], agg[policy_name]["vs_rex_ci95"] = (
                ratio[0],
                [ratio[1], ratio[2]],
            )
        best = best_peer(per)
    out: dict[str, Any] = {"scenario": scen.name, "seeds": seeds, "policies": agg}
    if best is not None:
        out["rex_over_best_peer"] = best
    memory = memory_summary(per, scen.pass_caps)
    if memory is not None:
        out["memory"] = memory
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"scenario {scen.name}, seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}), "
            f"{scen.world_size} ranks, {scen.steps} steps"
        )
        cols = list(next(iter(agg.values())).keys())
        print(_table(agg, cols if args.wide else [c for c in _SEEDS if c in cols]))
        if best is not None:
            low, high = best["ci95"]
            ci_text = "" if low is None else f" [{low:.3f}, {high:.3f}] (95%, paired by seed)"
            print(f"rex / best peer ({best['peer']}): {best['ratio']:.3f}{ci_text}")
        if memory is not None:
            print(f"pass caps (samples per pass, memory): {_fmt(memory['pass_caps'])}")
            for policy_name, (ratio, low, high) in memory["rex_over"].items():
                ci_text = "" if low is None else f" [{low:.3f}, {high:.3f}]"
                print(f"rex / {policy_name}: {ratio:.3f}{ci_text} (throughput, paired by seed)")
    return 0


def best_peer(per: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Rex's efficiency over the best other policy's, paired by seed.

    The best peer is the policy other than rex and the oracle with the highest mean
    efficiency over the seeds.

    Args:
        per: Each policy's per-seed results (``rex`` among them).

    Returns:
        ``{"peer", "ratio", "ci95": [low, high]}`` (the interval None for one seed), or
        None when rex has no peer here.
    """
    from lightning_rex.sim.cli.report import paired_ratio

    peers = {n: rs for n, rs in per.items() if n not in ("rex", "oracle")}
    if "rex" not in per or not peers:
        return None
    name = max(peers, key=lambda n: sum(r["efficiency"] for r in peers[n]) / len(peers[n]))
    ratio = paired_ratio(
        [r["efficiency"] for r in per["rex"]], [r["efficiency"] for r in peers[name]]
    )
    return {"peer": name, "ratio": ratio[0], "ci95": [ratio[1], ratio[2]]}
