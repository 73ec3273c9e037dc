"""``simulate --trace DIR``: every policy run's window records, and the seed aggregates.

For every policy run (and every seed of ``--seeds``) the driver's window records are written
in the format of training's ``rex_decisions.jsonl`` to ``DIR/<scenario>/<policy>/seed<k>.jsonl``,
each record with ``limit_samples_per_s``: the oracle's throughput over the record's window
(from the oracle's mean step time per ``window``-step chunk, weighted by overlap). The oracle
itself has no window loop and writes no records.

``DIR/summary.json`` holds ``{"scenarios": {name: summary}}`` and is merged with what the
directory already holds, so several ``simulate --trace DIR`` invocations (one per scenario)
build up one comparison; ``DIR/<scenario>/summary.json`` holds that scenario's part alone. A
scenario's summary has its ``steps``, ``world_size``, ``window``, ``global_batch``, ``seeds``
and ``trace_dir`` (its folder's name under ``DIR``), and per policy: ``efficiency`` (per
seed), ``limit_samples_per_s`` (per seed), ``eff_mean`` with ``eff_mean_ci95`` (the
arithmetic mean of the per-seed efficiencies, the ``eff_mean`` that ``simulate --seeds``
prints, and its 95% Student-t interval; None for a single seed), ``eff_gmean`` with
``eff_ci95`` (the geometric mean and its interval, from
:func:`~lightning_rex.sim.cli.report.paired_ratio` against 1) and
``aggregate`` (:func:`~lightning_rex.sim.cli.report.aggregate`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_rex.driver.config import LoopConfig
from lightning_rex.sim.cli.report import aggregate, mean_interval, paired_ratio
from lightning_rex.sim.engine.engine import Trace
from lightning_rex.sim.engine.scoring import SimResult, scored_run
from lightning_rex.sim.policies.base import Policy
from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = [
    "read_summary",
    "run_traced",
    "trace_path",
    "window_limits",
    "write_records",
    "write_summary",
]


def run_traced(
    scenario: Scenario,
    policy: Policy | str,
    seed: int,
    oracle: Trace,
    loop: LoopConfig | None = None,
) -> tuple[SimResult, list[dict[str, Any]]]:
    """Run a policy as :func:`~lightning_rex.sim.engine.scoring.run` does, keeping its records.

    Args:
        scenario: The scenario.
        policy: A built-in policy name, or a policy object.
        seed: The noise seed.
        oracle: The oracle's trace on this scenario and seed.
        loop: The window loop's settings; default the engine's.

    Returns:
        The run's metrics and its window records, each with ``limit_samples_per_s``.
    """
    res, trace = scored_run(scenario, policy, seed, oracle=oracle, loop=loop)
    name = policy if isinstance(policy, str) else policy.name
    limits = window_limits(trace.records, oracle.window_step_s, scenario.window)
    records = [
        {**r, "limit_samples_per_s": lim, "policy": name, "seed": int(seed)}
        for r, lim in zip(trace.records, limits)
    ]
    return res, records


def window_limits(
    records: Sequence[dict[str, Any]], chunk_step_s: Sequence[float], window: int
) -> list[float | None]:
    """The oracle's throughput over each record's window.

    Args:
        records: Window records (``window`` is ``[first step, end step)``, ``plan`` the
            micro-batches).
        chunk_step_s: The oracle's mean step time per ``window``-step chunk from step 0.
        window: The chunk length in steps.

    Returns:
        Per record, the global batch over the oracle's overlap-weighted mean step time, or
        None where no chunk overlaps the window.
    """
    out: list[float | None] = []
    for record in records:
        start, end = (int(x) for x in record["window"])
        total = weight = 0.0
        for chunk in range(start // window, (max(end, start + 1) - 1) // window + 1):
            if chunk >= len(chunk_step_s):
                break
            overlap = min(end, (chunk + 1) * window) - max(start, chunk * window)
            total += overlap * float(chunk_step_s[chunk])
            weight += overlap
        covered = weight > 0 and total > 0
        out.append(sum(record["plan"]) * weight / total if covered else None)
    return out


def trace_path(directory: str | Path, scenario: str, policy: str, seed: int) -> Path:
    """Where a run's records go.

    Args:
        directory: The ``--trace`` directory.
        scenario: The scenario's name.
        policy: The policy's name.
        seed: The seed.

    Returns:
        ``directory/<scenario>/<policy>/seed<seed>.jsonl``.
    """
    return Path(directory) / _safe(scenario) / _safe(policy) / f"seed{int(seed)}.jsonl"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def write_records(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write records as a ``rex_decisions.jsonl`` file (replacing one already there).

    Args:
        path: The file; its directory is created.
        records: The records.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def read_summary(directory: str | Path) -> dict[str, Any]:
    """The trace summary in ``directory``, to merge a new scenario into.

    Args:
        directory: The trace directory.

    Returns:
        Its ``summary.json``, or an empty one (``{"scenarios": {}}``) when there is none.

    Raises:
        ValueError: If a ``summary.json`` is there but is not a trace summary (it is not
            overwritten: it may hold other scenarios' figures).
    """
    path = Path(directory) / "summary.json"
    if not path.exists():
        return {"scenarios": {}}
    try:
        old = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} exists but is not a trace summary ({error})") from None
    if not (isinstance(old, dict) and isinstance(old.get("scenarios"), dict)):
        raise ValueError(f"{path} exists but is not a trace summary")
    return old


def write_summary(
    directory: str | Path,
    scenario: Scenario,
    seeds: Sequence[int],
    results: dict[str, list[dict[str, Any]]],
) -> Path:
    """Write a scenario's seed aggregates and merge them into ``directory/summary.json``.

    Args:
        directory: The ``--trace`` directory.
        scenario: The scenario.
        seeds: The seeds run, in order.
        results: Per policy, its :meth:`SimResult.to_dict` per seed (in ``seeds`` order).

    Returns:
        The path of ``directory/summary.json``.

    Raises:
        ValueError: If the directory holds a ``summary.json`` that is not a trace summary.
    """
    root = Path(directory)
    policies: dict[str, Any] = {}
    for name, runs in results.items():
        eff = [float(r["efficiency"]) for r in runs]
        gmean, low, high = paired_ratio(eff, [1.0] * len(eff))
        mean, half = mean_interval(eff)
        policies[name] = {
            "efficiency": eff,
            "limit_samples_per_s": [float(r["limit_throughput"]) for r in runs],
            "eff_mean": mean,
            "eff_mean_ci95": None if half is None else [mean - half, mean + half],
            "eff_gmean": gmean,
            "eff_ci95": None if low is None else [low, high],
            "aggregate": aggregate(runs, scenario.steps),
        }
    summary = {
        "steps": scenario.steps,
        "world_size": scenario.world_size,
        "window": scenario.window,
        "global_batch": scenario.global_batch,
        "seeds": [int(s) for s in seeds],
        "trace_dir": _safe(scenario.name),
        "policies": policies,
    }
    (root / _safe(scenario.name)).mkdir(parents=True, exist_ok=True)
    (root / _safe(scenario.name) / "summary.json").write_text(json.dumps(summary, indent=1))
    path = root / "summary.json"
    merged = read_summary(root)
    merged["scenarios"][scenario.name] = summary
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, indent=1))
    os.replace(tmp, path)  # readers see the old summary or the new one, never half of one
    return path
