"""Figures of real runs on this machine: the demo, the bench, the emulator, the examples."""

from __future__ import annotations

import dataclasses
import inspect
import re
import statistics
from typing import Any

from common import (
    _example,
    _rex,
    duration,
    measured,
    result,
    seconds,
    spread,
)

# ----------------------------------------------------------------------------- the demo
DEMO = ("quickstart.py", "--json", "out.json")


def _demo_row(label: str, d: dict[str, Any]) -> str:
    r = d["result"]
    ddp = [x["samples_per_s"] for x in r["runs"] if x["strategy"] == "ddp"]
    rex_static = [a / b for a, b in zip(r["ratios"], r["ratios_rex_static"])]
    plan = r["static_plan"]
    return (
        f"| {label} | {statistics.median(ddp):.0f} ({min(ddp):.0f}-{max(ddp):.0f}) | "
        f"{spread(r['ratios'])} | {spread(r['ratios_rex_static'])}, `{plan}` | "
        f"{spread(rex_static)} | {duration(d['seconds'])} |"
    )


def render_demo(data: dict[str, Any]) -> dict[str, str]:
    """The demo's table, its one-line summary and its duration."""
    idle, busy = data["commands"]["idle"], data["commands"]["busy"]
    table = "\n".join(
        [
            "| run | ddp samples/s | rex / ddp | best static plan / ddp | rex / best static plan"
            " | the command took |",
            "| --- | --- | --- | --- | --- | --- |",
            _demo_row("`python examples/quickstart.py`, idle", idle),
            _demo_row("the same, beside a busy loop", busy),
            "",
            f"{measured(data)} Ratios are paired within each round of three runs (median over"
            " the rounds, with their range).",
        ]
    )
    runs = [x for x in idle["result"]["runs"] if x["strategy"] == "rex"]
    firsts = [x["first_accept_step"] for x in runs if x.get("first_accept_step") is not None]
    settled = f", settling by step {statistics.median(firsts):.0f}" if firsts else ""
    summary = (
        f"Measured with `python examples/quickstart.py` (what `nox -s demo` runs; "
        f"{duration(idle['seconds'])} here), rex trains that pair "
        f"{statistics.median(idle['result']['ratios']):.2f} times as fast as `ddp` when it "
        f"adapts from the even plan{settled} "
        f"({statistics.median(busy['result']['ratios']):.2f} beside another CPU-heavy process),"
        " against "
        f"{statistics.median(idle['result']['ratios_rex_static']):.2f} for the fastest static"
        f" plan the demo's scan found ({data['date']})."
    )
    return {
        "demo-table": table,
        "demo-summary": summary,
        "demo-duration": f"It took {duration(idle['seconds'])} here ({data['date']}, idle, two"
        " cores), plus the install:",
    }


# ----------------------------------------------------------------------------- the bench
BENCH_CMDS = {
    "homogeneous-adaptive": _rex(
        "bench",
        "--compare",
        "ddp,rex",
        "--adaptive",
        "--slowdowns",
        "1,1",
        "--steps",
        "300",
        "--repeat",
        "12",
        "--json",
    ),
    "homogeneous-static": _rex(
        "bench",
        "--compare",
        "ddp,rex",
        "--slowdowns",
        "1,1",
        "--steps",
        "300",
        "--repeat",
        "7",
        "--json",
    ),
    "static-3x": _rex(
        "bench",
        "--compare",
        "ddp,rex",
        "--slowdowns",
        "1,3",
        "--micro-batch-sizes",
        "50,14",
        "--steps",
        "300",
        "--repeat",
        "5",
        "--json",
    ),
    "adaptive-3x": _rex(
        "bench",
        "--compare",
        "ddp,rex,rex-static",
        "--adaptive",
        "--slowdowns",
        "1,3",
        "--micro-batch-sizes",
        "50,14",
        "--steps",
        "600",
        "--repeat",
        "5",
        "--json",
    ),
}


def render_bench(data: dict[str, Any]) -> dict[str, str]:
    """The real bench's table, and the line for equal ranks."""
    rows = [
        "| setup | command | rex / ddp, median (range) over the repeats |",
        "| --- | --- | --- |",
    ]
    labels = {
        "static-3x": "static plan `[50, 14]`, rank 1 3x slower",
        "homogeneous-static": "static even plan, equal ranks",
        "adaptive-3x": "adaptive from the even plan, rank 1 3x slower",
        "homogeneous-adaptive": "adaptive, equal ranks",
    }
    for key, label in labels.items():
        r = result(data, key)
        cell = spread(r["ratios"])
        if "ratios_rex_static" in r:
            cell += f"; the static plan `[50, 14]` {spread(r['ratios_rex_static'])}"
        rows.append(f"| {label} | `{data['commands'][key]['command']}` | {cell} |")
    rows += ["", measured(data)]
    homo = result(data, "homogeneous-adaptive")
    line = (
        f"On equal ranks rex holds the even plan: "
        f"`{data['commands']['homogeneous-adaptive']['command']}` gives rex/ddp "
        f"{spread(homo['ratios'])} over {len(homo['ratios'])} interleaved pairs, within the "
        "machine's run-to-run noise."
    )
    checks = []
    labels = (("adaptive-3x", "rank 1 3x slower"), ("homogeneous-adaptive", "equal ranks"))
    for key, label in labels:
        even = result(data, key).get("headline_even_over_ddp")
        if even:
            checks.append(f"{spread(even)} with {label} (`{data['commands'][key]['command']}`)")
    headline = (
        "The report's estimate of the even split's throughput, from rex's own records, over "
        "the paired ddp run's measured throughput: " + "; ".join(checks) + f" ({data['date']})."
    )
    return {
        "bench-table": "\n".join(rows),
        "bench-homogeneous": line,
        "bench-headline": headline,
    }


# ----------------------------------------------------------------------------- the emulator
EMULATION = (
    "bench",
    "--emulation",
    "--slowdowns",
    "1,3",
    "--no-pin",
    "--steps",
    "100",
    "--warmup",
    "10",
    "--window",
    "20",
    "--json",
)


def render_emulation(data: dict[str, Any]) -> dict[str, str]:
    """The emulator's achieved slowdowns, idle and beside busy loops."""
    rows = [
        "| machine | headroom | model | threads | compute ms, rank 0 / rank 1 | rank 1 / rank 0 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, (machine, headroom) in {
        "idle-1": ("idle", "1"),
        "idle-2": ("idle", "2"),
        "busy-1": ("beside two busy loops", "1"),
        "busy-2": ("beside two busy loops", "2"),
    }.items():
        for row in result(data, key)["emulation"]:
            ms = row["median_ms"]
            threads = row["threads"] or "default"
            rows.append(
                f"| {machine} | {headroom} | {row['size']} | {threads} | "
                f"{ms[0]:.2f} / {ms[1]:.2f} | {row['achieved'][1]:.2f} |"
            )
    rows += [
        "",
        f"{measured(data)} Asked for: rank 1 3x slower (`{data['commands']['idle-1']['command']}`"
        ", with `--headroom 2` for headroom 2).",
    ]
    return {"emulation-table": "\n".join(rows)}


BATCH_EXAMPLE = {
    "teacher": _example(
        "batch_scaling.py", "--repeat", "3", "--fixed-batch", "512", output="last-line"
    )
}


def render_batch_example(data: dict[str, Any]) -> dict[str, str]:
    """``examples/batch_scaling.py``'s table and duration."""
    res = result(data, "teacher")
    rows = [
        "| setting | time to 1.53 (per run) | final val loss | final val acc | B used |",
        "| --- | --- | --- | --- | --- |",
    ]
    labels = {
        "off": "off (B = 32)",
        "on": 'on, `lr_rule="sqrt"`',
        "fixed": "fixed B = 512 from the start, rate x4 (sqrt)",
    }
    for name, label in labels.items():
        rs = res[name]
        times = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
        t = (
            "not reached"
            if not times
            else (
                f"{statistics.median(times):.1f} s ({', '.join(f'{x:.1f}' for x in sorted(times))})"
            )
        )
        batches = sorted({b for r in rs for _, b in r["batches"]})
        used = (
            str(batches[0])
            if len(batches) == 1
            else f"{batches[0]}, then {batches[1]}-{batches[-1]}"
        )
        rows.append(
            f"| {label} | {t} | {statistics.median(r['val_loss'] for r in rs):.4f} | "
            f"{statistics.median(r['val_acc'] for r in rs):.4f} | {used} |"
        )
    total = duration(seconds(data, "teacher"))
    rows += ["", f"{measured(data)} `{data['commands']['teacher']['command']}` took {total}."]
    return {"batch-example": "\n".join(rows), "batch-example-duration": total}


# ----------------------------------------------------------------------------- examples
EXAMPLE_CMDS = {
    "cli": _example("cli/train.py", "fit", "--config", "{root}/examples/cli/adaptive.yaml"),
    "simulate_cluster": _example("simulate_cluster.py"),
    "digits": _example("digits.py"),
    "profile_curve": _example("profile_curve.py", "--model", "bench"),
}


def render_examples(data: dict[str, Any]) -> dict[str, str]:
    """How long each example takes as documented."""
    rows = ["| example | command | took |", "| --- | --- | --- |"]
    for key, d in data["commands"].items():
        rows.append(f"| `{key}` | `{d['command']}` | {duration(d['seconds'])} |")
    return {"example-durations": "\n".join([*rows, "", measured(data)])}


# ----------------------------------------------------------------------------- from the code
def _args_table(cls: Any, skip: tuple[str, ...] = ()) -> str:
    """An argument table from a class's signature and its Google-style docstring."""
    doc = inspect.getdoc(cls) or ""
    text = doc.split("Args:", 1)[1].split("Raises:", 1)[0] if "Args:" in doc else ""
    meaning: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("    ") and not line.startswith("        ") and ":" in stripped:
            name, rest = stripped.split(":", 1)
            meaning[name] = rest.strip()
        elif name and stripped:
            meaning[name] += " " + stripped
    rows = ["| argument | default | meaning |", "| --- | --- | --- |"]
    # a dataclass field with a default factory shows what the factory makes
    factories = {
        f.name: f.default_factory
        for f in getattr(cls, "__dataclass_fields__", {}).values()
        if f.default_factory is not dataclasses.MISSING
    }
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in ("self", *skip) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = factories[p.name]() if p.name in factories else p.default
        rows.append(f"| `{p.name}` | `{default!r}` | {_markdown(meaning.get(p.name, ''))} |")
    return "\n".join(rows)


def _markdown(text: str) -> str:
    """A docstring's reST as markdown: literals and roles in backquotes."""
    text = re.sub(
        r":(?:class|func|meth|mod|attr|data|exc):`~?([\w.]+)`",
        lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`",
        text,
    )
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("|", "\\|")


def render_defaults(_: dict[str, Any]) -> dict[str, str]:
    """The argument tables and the controller's constants, from the code."""
    from lightning_rex import HeterogeneityEmulator, RexCallback
    from lightning_rex.core.settings import DecisionSettings

    return {
        "callback-args": _args_table(RexCallback),
        "emulator-args": _args_table(HeterogeneityEmulator),
        "settings-table": _args_table(DecisionSettings),
        "constants-table": _constants(),
        "presets-table": _presets(),
    }


def _presets() -> str:
    """The simulator's plan presets: what each models, from its code and docstring."""
    from lightning_rex.sim import load_scenario
    from lightning_rex.sim.scenarios.presets import PRESETS

    rows = [
        "| preset | ranks | steps | global batch | new shape costs | what it models |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, make in PRESETS.items():
        scen = load_scenario(name)
        if scen.workload is not None:
            continue  # the global batch presets are in docs/batch_scaling.md
        doc = " ".join((make.__doc__ or "").split("\n\n")[0].split())
        rows.append(
            f"| `{name}` | {scen.world_size} | {scen.steps:,} | {scen.global_batch:,} | "
            f"{scen.shape_change_s:g} s | {_markdown(doc)} |"
        )
    return "\n".join(rows)


def _constants() -> str:
    """The named constants the docs quote, read from their modules."""
    import math

    from lightning_rex.core.decide import looks
    from lightning_rex.core.model import tiles, time_model
    from lightning_rex.core.scaling import batch_scaling, noise_scale, scaling_decider
    from lightning_rex.core.settings import DecisionSettings
    from lightning_rex.core.stats import persistence
    from lightning_rex.measure.telemetry import MemoryBound
    from lightning_rex.sim.policies import pollux
    from lightning_rex.tools import emulator

    prior = [math.exp(p) for p in tiles.LOG_PRIOR]
    kinds = list(tiles.HYPOTHESES)
    none = prior[kinds.index((1, 1))]
    tile = next(p for h, p in zip(kinds, prior) if h != (1, 1) and h[1] == 1)
    waves = sum(p for h, p in zip(kinds, prior) if h[1] != 1)
    safety = inspect.signature(MemoryBound.__init__).parameters["safety"].default
    from lightning_rex.lightning import watchdog

    basis = DecisionSettings().num_basis  # cubic B-splines over [b_ref / R, b_ref R]
    knots = (time_model._REACH**2) ** (1.0 / (basis - 3))
    rows = [
        (
            "cold start's level, a multiple of alpha",
            "`persistence.COLD_START_LEVEL`",
            persistence.COLD_START_LEVEL,
        ),
        (
            "most ranks at which a cold start also t-tests single ranks",
            "`persistence.T_TEST_MAX_RANKS`",
            persistence.T_TEST_MAX_RANKS,
        ),
        (
            "an early look's level, a fraction of a window's",
            "`looks.EARLY_LEVEL`",
            looks.EARLY_LEVEL,
        ),
        ("prior probability of no tile", "`tiles.LOG_PRIOR`", round(none, 4)),
        ("prior probability of each tile alone", "`tiles.LOG_PRIOR`", round(tile, 4)),
        (
            "prior probability of a tile with a wave, all together",
            "`tiles.LOG_PRIOR`",
            round(waves, 4),
        ),
        (
            "the work's share in waves, under a wave hypothesis",
            "`tiles.WAVE_SHARE`",
            tiles.WAVE_SHARE,
        ),
        (
            "a change of B moves it at most this factor",
            "`batch_scaling.STEP_LIMIT`",
            batch_scaling.STEP_LIMIT,
        ),
        (
            "a predicted gain that may leave that trust region",
            "`batch_scaling.FAR_GAIN`",
            batch_scaling.FAR_GAIN,
        ),
        (
            "a gain of B large enough to go before a re-split",
            "`scaling_decider._LARGE_GAIN`",
            scaling_decider._LARGE_GAIN,
        ),
        (
            "noise-scale clip, robust standard deviations",
            "`noise_scale._ROBUST_WIDTH`",
            noise_scale._ROBUST_WIDTH,
        ),
        ("memory bound's share of the free memory", "`MemoryBound(safety=...)`", safety),
        ("the emulator's headroom on a CPU rank", "`emulator.CPU_HEADROOM`", emulator.CPU_HEADROOM),
        (
            "the emulator warns above this times its emulated factor",
            "`emulator._TOLERANCE`",
            emulator._TOLERANCE,
        ),
        (
            "time a stuck rank's process gets to exit after the watchdog's error",
            "`watchdog.GRACE_S`, `watchdog.GRACE_POLLS`",
            f"{watchdog.GRACE_S:g} s, or {watchdog.GRACE_POLLS} polls if longer",
        ),
        (
            "time between the Pollux peer's choices of the batch",
            "`pollux._PERIOD_S`",
            f"{pollux._PERIOD_S:g} s",
        ),
        (
            "ratio between the time model's spline knots (default basis)",
            "`time_model._REACH`, `num_basis`",
            round(knots, 2),
        ),
    ]
    out = ["| what | where | value |", "| --- | --- | --- |"]
    out += [
        f"| {what} | {where} | {value if isinstance(value, str) else f'{value:g}'} |"
        for what, where, value in rows
    ]
    return "\n".join(out)


def render_validation(data: dict[str, Any]) -> dict[str, str]:
    """How often validation rolls back a plan of each true step time."""
    r = result(data, "rates")
    rows = [
        "| new plan's true step time | rolled back, 1 look | rolled back, 3 looks |"
        " decided after one segment (10 steps), 3 looks |",
        "| --- | --- | --- | --- |",
    ]
    for row in r["rows"]:
        pct = [f"{100 * row[k]:.0f}%" for k in ("rolled_1", "rolled_3", "longer_3")]
        early = f"{100 - float(pct[2][:-1]):.0f}%"
        rows.append(f"| x{row['factor']:.2f} | {pct[0]} | {pct[1]} | {early} |")
    cmd = data["commands"]["rates"]["command"]
    rows += [
        "",
        f"{measured(data)} {r['trials']} seeded trials a row (`{cmd}`): N = 8, window 30, CV 0.10"
        " AR(1) 0.5, a baseline of 4 windows.",
    ]
    return {"validation-rates": "\n".join(rows)}
