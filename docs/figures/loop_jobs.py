"""Figure jobs of sharding and custom loops: the memory preset, the Fabric loop's speed-up."""

from __future__ import annotations

import math
from typing import Any

from common import (
    Command,
    _example,
    _over_rex,
    _rex,
    duration,
    f3,
    interval,
    measured,
    result,
    seconds,
)

__all__ = ["FABRIC_CMDS", "MEMORY_CMDS", "render_fabric", "render_memory"]

MEMORY_POLICIES = ("even", "throughput", "proportional", "rex", "oracle")
MEMORY_CMDS: dict[str, Command] = {
    "memory": _rex(
        "simulate",
        "--scenario",
        "fsdp-memory-8",
        "--compare",
        ",".join(MEMORY_POLICIES),
        "--seeds",
        "0-4",
        "--json",
    )
}
FABRIC_CMDS: dict[str, Command] = {
    "ddp": _example("fabric_gpt.py", "--compare", "3", "--json", "out.json", output="file"),
    "fsdp": _example(
        "fabric_gpt.py",
        "--strategy",
        "rex_fsdp",
        "--compare",
        "2",
        "--json",
        "out.json",
        output="file",
    ),
}
_LABELS = {
    "even": "even FSDP (accumulates where it must)",
    "throughput": "memory-blind split by throughput",
    "proportional": "proportional to measured step times",
    "rex": "rex",
    "oracle": "memory-aware oracle",
}


def _ratio(values: list[float]) -> tuple[float, float, float]:
    """The paired ratio's geometric mean and its range over seeds."""
    return math.exp(sum(map(math.log, values)) / len(values)), min(values), max(values)


def render_memory(data: dict[str, Any]) -> dict[str, str]:
    """The memory preset: every policy's efficiency, rex over each (paired by seed)."""
    out = result(data, "memory")
    pol, mem = out["policies"], out["memory"]
    rows = [
        "| policy | efficiency (whole run) | rex over it, paired by seed [95%] |",
        "| --- | --- | --- |",
    ]
    for name in MEMORY_POLICIES:
        p = pol[name]
        if name == "rex":
            over = "1"
        else:
            ratio, lo, hi = _over_rex(out, name)
            over = f"{f3(ratio)} {interval(lo, hi)}"
        rows.append(f"| {_LABELS[name]} | {f3(p['eff_mean'])} | {over} |")
    caps = ", ".join(str(c) for c in mem["pass_caps"])
    table = "\n".join(
        [
            *rows,
            "",
            f"Pass caps (samples per pass): {caps}. `{data['commands']['memory']['command']}`, "
            f"took {duration(seconds(data, 'memory'))}. {measured(data)}",
        ]
    )
    g = {k: _ratio(v)[0] for k, v in mem["rex_over"].items()}
    summary = (
        f"rex reaches {f3(g['oracle'])} of a memory-aware oracle, {f3(g['even'])}x even FSDP and "
        f"{f3(g['throughput'])}x a memory-blind throughput split (paired over seeds 0-4)"
    )
    return {"sim-memory": table, "sim-memory-summary": summary}


def render_fabric(data: dict[str, Any]) -> dict[str, str]:
    """The Fabric loop's paired speed-up over even, under rex (DDP) and rex_fsdp."""
    rows = [
        "| strategy | command | rex over even, each pair | geometric mean | rex's plan | took |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key in ("ddp", "fsdp"):
        r = result(data, key)
        pairs = ", ".join(f3(x) for x in r["rex_over_even"])
        plan = "[" + ", ".join(str(b) for b in r["rex_plan"]) + "]"
        rows.append(
            f"| `{r['strategy']}` | `{data['commands'][key]['command']}` | {pairs} | "
            f"{f3(r['rex_over_even_geomean'])} | {plan} | {duration(seconds(data, key))} |"
        )
    return {"fabric-table": "\n".join([*rows, "", measured(data)])}
