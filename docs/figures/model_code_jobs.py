"""Figures of real model code (issue 59): in-step collectives, the emulator, the README's script."""

from __future__ import annotations

import statistics
from typing import Any

from common import Command, _rex, f2, f3, measured, result

CASES = "plain,sync_dist,unused_head,all_gather,sync_bn,checkpoint"
STATIC = "46,18/48,16/50,14"

MODEL_CODE_CMDS = {
    # rank 1 slowed by the model's own code: it sleeps 3 x 0.5 ms a sample in its forward
    "forward": _rex(
        *f"bench --model-code {CASES} --slowdowns 1,3 --slow-forward 0.5 --width 32 --depth 1 "
        f"--steps 300 --static-plans {STATIC} --json".split()
    ),
    # the same cases, rank 1 slowed by the emulator instead
    "emulated": _rex(
        *f"bench --model-code {CASES} --slowdowns 1,3 --headroom 2 --steps 300 "
        f"--static-plans {STATIC} --json".split()
    ),
    "emulation": _rex(
        *f"bench --emulation --model-code {CASES} --slowdowns 1,3 --headroom 2 "
        "--model-sizes small,medium,large --thread-counts 1 --no-pin --steps 100 --warmup 10 "
        "--window 20 --json".split()
    ),
    "readme": Command(
        ("{python}", "{root}/scripts/readme_check.py", "--rounds", "3", "--json", "out.json"),
        "file",
    ),
}

_LABELS = {
    "plain": "nothing else (the gradient all-reduce only)",
    "sync_dist": '`self.log("train_loss", loss, sync_dist=True, on_step=True)`',
    "unused_head": "an unused head, `find_unused_parameters=True`",
    "all_gather": "`self.all_gather(loss)`",
    "sync_bn": "a batch norm all-reducing its statistics in the forward (CPU `SyncBatchNorm`)",
    "checkpoint": "activation checkpointing of the hidden layers",
}


def _plans(row: dict[str, Any]) -> str:
    return ", ".join(f"`{p}`" for p in row["plans"])


def render_model_code(data: dict[str, Any]) -> dict[str, str]:
    """The model-code table, the emulator's achieved slowdowns per case, the README's runs."""
    forward = result(data, "forward")["cases"]
    emulated = result(data, "emulated")["cases"]
    rows = [
        "| what `training_step` holds | slowed forward: rex's final plans | rex / best static "
        "| emulated: rex's final plans | rex / best static |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case, label in _LABELS.items():
        f, e = forward[case], emulated[case]
        rows.append(
            f"| {label} | {_plans(f)} | {f3(f['rex_over_best_static'])} | {_plans(e)} "
            f"| {f3(e['rex_over_best_static'])} |"
        )
    rows += [
        "",
        f"{measured(data)} Each cell pairs rex's runs with the fastest of the static plans "
        f"`[46, 18]`, `[48, 16]` and `[50, 14]` run in the same command (their best: "
        f"`{forward['plain']['best_static_plan']}` slowed, "
        f"`{emulated['plain']['best_static_plan']}` emulated, without model code), over "
        "the steps after the warm-up, rex's first even-split windows included. Commands: "
        f"`{data['commands']['forward']['command']}` and "
        f"`{data['commands']['emulated']['command']}`.",
    ]
    emu = [
        "| what `training_step` holds | model | compute ms, rank 0 / rank 1 | rank 1 / rank 0 |",
        "| --- | --- | --- | --- |",
    ]
    for row in result(data, "emulation")["emulation"]:
        ms = row["median_ms"]
        emu.append(
            f"| {row['case']} | {row['size']} | {f2(ms[0])} / {f2(ms[1])} "
            f"| {f2(row['achieved'][1])} |"
        )
    emu += [
        "",
        f"{measured(data)} Asked for: rank 1 3x slower "
        f"(`{data['commands']['emulation']['command']}`).",
    ]
    rounds = result(data, "readme")
    plans = [r["rex"]["plan"] for r in rounds]
    ratios = [r["estimate_over_ddp"] for r in rounds]
    speedups = [r["rex"]["samples_per_s"] / r["ddp"]["samples_per_s"] for r in rounds]
    headlines = [r["rex"]["headline_speedup"][0] for r in rounds]
    readme = (
        f"In {len(rounds)} runs here ({data['date']}) the plan in force at the end was "
        + ", ".join(f"`{p}`" for p in plans)
        + '. Paired with a run of the same script under `strategy="ddp"` in each round '
        f"(`{data['commands']['readme']['command']}`), the report's headline said "
        + ", ".join(f"x{f2(h)}" for h in headlines)
        + " where rex measured "
        + ", ".join(f"x{f2(s)}" for s in speedups)
        + " over ddp: its estimate of the even split's throughput was "
        + ", ".join(f3(r) for r in ratios)
        + f" of ddp's measured one (median {f3(statistics.median(ratios))})."
    )
    return {
        "model-code-table": "\n".join(rows),
        "model-code-emulation": "\n".join(emu),
        "readme-runs": readme,
    }
