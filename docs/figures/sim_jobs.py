"""The simulator's figures: ``python -m lightning_rex simulate`` over presets and seeds."""

from __future__ import annotations

from typing import Any

from common import (
    Command,
    _over_rex,
    _rex,
    _sim,
    duration,
    f3,
    interval,
    measured,
    result,
    seconds,
)

# ----------------------------------------------------------------------------- the simulator
README_PRESETS = {
    "homogeneous-8": "8 equal GPUs",
    "slowdown-15pct-16": "one of 16 ranks 15% slower",
    "a100-v100-t4-8": "3 A100, 3 V100, 2 T4",
    "mixed-64": "64 ranks of three generations",
    "transient-16": "four stragglers of one window",
}
README_POLICIES = ("even", "lbb", "omnilearn", "rex")


def _readme_cmds() -> dict[str, Command]:
    out = {}
    compare = f"--compare {','.join(README_POLICIES)} --seeds 0-9"
    for preset in README_PRESETS:
        out[preset] = _sim(preset, compare)
        if preset == "a100-v100-t4-8":  # its row with shape changes free follows it
            out[f"{preset}@0"] = _sim(preset, f"{compare} --shape-change-s 0")
    return out


def render_sim_readme(data: dict[str, Any]) -> dict[str, str]:
    """The README's simulator table and how long a command takes."""
    rows = [
        "| cluster (preset) | even split (ddp) | LBB | OmniLearn | rex |"
        " rex / best peer [95% CI] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key in data["commands"]:
        preset = key.split("@")[0]
        label = f"{README_PRESETS[preset]} (`{preset}`)"
        if key.endswith("@0"):
            label = "the same, shape changes free (`--shape-change-s 0`)"
        r = result(data, key)
        pol = r["policies"]
        best = r["rex_over_best_peer"]
        cells = [f3(pol[p]["eff_mean"]) for p in README_POLICIES]
        ratio = f"{f3(best['ratio'])} {interval(*best['ci95'])} vs {best['peer']}"
        rows.append(f"| {label} | {' | '.join(cells)} | {ratio} |")
    secs = seconds(data, "a100-v100-t4-8")
    rows += [
        "",
        f"{measured(data)} Each command took {duration(secs)} or so (`a100-v100-t4-8`,"
        " 10 seeds of 3,000 steps, 5 policies with the oracle).",
    ]
    return {"sim-readme": "\n".join(rows), "sim-duration": duration(secs)}


HELP_PRESETS = (
    "homogeneous-8",
    "{root}/docs/scenarios/mild-1.3x-8.yaml",
    "slowdown-15pct-16",
    "pair-3x",
    "a100-v100-t4-8",
    "transient-16",
)
HELP_POLICIES = ("even", "proportional", "lbb", "omnilearn", "rex")


def _help_cmds() -> dict[str, Command]:
    out = {}
    for preset in HELP_PRESETS:
        name = preset.rsplit("/", 1)[-1]
        for cost in (None, "0"):
            if cost is not None and preset == "pair-3x":
                continue  # pair-3x charges nothing already
            extra = () if cost is None else ("--shape-change-s", cost)
            out[f"{name}@{cost or 'preset'}"] = _sim(
                preset, f"--compare {','.join(HELP_POLICIES)} --seeds 0-9 {' '.join(extra)}"
            )
    return out


def _scen(key: str) -> str:
    name = key.split("@")[0]
    return f"`{name}`"


def render_sim_help(data: dict[str, Any]) -> dict[str, str]:
    """The tables of docs/when_does_rex_help.md."""
    table = [
        "| scenario | cost | even (DDP) | proportional | lbb | omnilearn | rex | rex steady state"
        " | rex over even [95% CI] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    changes = [
        "| scenario | plan changes | rollbacks | false rescales / 10k steps | shape-change seconds"
        " charged |",
        "| --- | --- | --- | --- | --- |",
    ]
    glance = [
        "| cluster (`simulate` scenario) | DDP's efficiency | rex over DDP [95% CI] |",
        "| --- | --- | --- |",
    ]
    costs = ["| scenario | rex | proportional | lbb |", "| --- | --- | --- | --- |"]
    for key in data["commands"]:
        r = result(data, key)
        pol = r["policies"]
        free = key.endswith("@0") or key.startswith("pair-3x")
        cost = "0" if free else "0.5 s"
        over = _over_rex(r, "even")
        cells = [f3(pol[p]["eff_mean"]) for p in HELP_POLICIES]
        table.append(
            f"| {_scen(key)} | {cost} | {' | '.join(cells)} | {f3(pol['rex']['steady_eff_mean'])}"
            f" | {f3(over[0])} {interval(over[1], over[2])} |"
        )
        if not key.endswith("@0"):
            rex = pol["rex"]
            changes.append(
                f"| {_scen(key)} | {rex['plan_changes_mean']:.1f} | {rex['rollbacks_mean']:.1f} | "
                f"{rex['false_per_10k_steps']:.2f} | {rex['shape_change_s_mean']:.1f} |"
            )
            glance.append(
                f"| {_scen(key)} | {f3(pol['even']['eff_mean'])} | **{f3(over[0])}** "
                f"{interval(over[1], over[2])} |"
            )
            free_key = key.replace("@preset", "@0")
            if free_key in data["commands"] and free_key != key:
                fr = result(data, free_key)["policies"]
                costs.append(
                    f"| {_scen(key)} | "
                    + " | ".join(
                        f"{f3(fr[p]['eff_mean'])} -> {f3(pol[p]['eff_mean'])}"
                        for p in ("rex", "proportional", "lbb")
                    )
                    + " |"
                )
    note = f"{measured(data)} Seeds 0-9; cells are mean efficiency (throughput over the oracle's)."
    return {
        "sim-help": "\n".join([*table, "", note]),
        "sim-changes": "\n".join([*changes, "", note]),
        "sim-glance": "\n".join([*glance, "", f"{measured(data)} Seeds 0-9, each preset's cost."]),
        "sim-costs": "\n".join([*costs, "", note]),
    }


PEER_PRESETS = (
    "pair-3x",
    "resnet50-k80-m60-v100-6",
    "homogeneous-8",
    "a100-v100-t4-8",
    "tiled-8",
    "staircase-8",
    "memwall-8",
    "twoscale-noise-8",
    "spiky-noise-8",
    "slowdown-15pct-16",
    "transient-16",
    "slowdown-mid-16",
    "drift-16",
    "mixed-64",
    "mixed-4096",
)
PEER_POLICIES = ("even", "static", "proportional", "lbb", "omnilearn", "rex")


def _peer_cmds() -> dict[str, Command]:
    out = {}
    for preset in PEER_PRESETS:
        big = preset == "mixed-4096"
        pols = [p for p in PEER_POLICIES if not (big and p == "lbb")]
        seeds = "0-2" if big else "0-9"
        for cost in (None, "0"):
            if cost is not None and preset == "pair-3x":
                continue
            extra = () if cost is None else ("--shape-change-s", cost)
            out[f"{preset}@{cost or 'preset'}"] = _sim(
                preset, f"--compare {','.join(pols)} --seeds {seeds} {' '.join(extra)}"
            )
    return out


def render_sim_peers(data: dict[str, Any]) -> dict[str, str]:
    """Every preset against every peer, with and without shape costs."""
    head = [
        "| preset | " + " | ".join(PEER_POLICIES) + " | rex steady | rex / best peer [95% CI] |"
        " rex's plan changes (rolled back) | decision p99 |",
        "| --- | " + " | ".join("---" for _ in PEER_POLICIES) + " | --- | --- | --- | --- |",
    ]
    tables: dict[str, list[str]] = {"preset": list(head), "0": list(head)}
    for key in data["commands"]:
        preset, cost = key.split("@")
        r = result(data, key)
        pol = r["policies"]
        best = r["rex_over_best_peer"]
        cells = [f3(pol[p]["eff_mean"]) if p in pol else "-" for p in PEER_POLICIES]
        rex = pol["rex"]
        label = preset + (" (seeds 0-2)" if preset == "mixed-4096" else "")
        row = (
            f"| {label} | {' | '.join(cells)} | {f3(rex['steady_eff_mean'])} | "
            f"{f3(best['ratio'])} {interval(*best['ci95'])} vs {best['peer']} | "
            f"{rex['plan_changes_mean']:.1f} ({rex['rollbacks_mean']:.1f}) | "
            f"{rex['decision_ms_p99']:.0f} ms |"
        )
        tables[cost].append(row)
        if preset == "pair-3x":  # it charges nothing: the same row in both
            tables["0"].append(row)
    note = f"{measured(data)} Seeds 0-9 (`mixed-4096`: 0-2; LBB does not run there)."
    return {
        "sim-peers-cost": "\n".join([*tables["preset"], "", note]),
        "sim-peers-free": "\n".join([*tables["0"], "", note]),
    }


# ----------------------------------------------------------------------------- targets
BASELINES = "--compare static,proportional,rex --seeds 0-9 --shape-change-s 0"
TARGET_CMDS = {
    "a100": _sim(
        "a100-v100-t4-8", "--compare static,proportional,rex --seeds 0-9 --shape-change-s 0"
    ),
    "mixed-64": _sim(
        "mixed-64", "--compare static,proportional,rex --seeds 0-9 --shape-change-s 0"
    ),
    "slowdown-mid": _sim(
        "slowdown-mid-16", "--compare static,proportional,rex --seeds 0-9 --shape-change-s 0"
    ),
    "drift": _sim("drift-16", BASELINES),
    "noise": _sim(
        "homogeneous-8", "--cv 0.3 --ar1 0.5 --policy rex --seeds 0-19 --shape-change-s 0"
    ),
    "slowdown-15pct": _sim("slowdown-15pct-16", "--policy rex --seeds 0-59 --shape-change-s 0"),
    "transient": _sim("transient-16", "--policy rex --seeds 0-59 --shape-change-s 0"),
    "spiky": _sim("spiky-noise-8", "--policy rex --seeds 0-19"),
    "twoscale": _sim("twoscale-noise-8", "--policy rex --seeds 0-19"),
    "latency-8": _sim("a100-v100-t4-8", "--policy rex --seed 0"),
    "latency-4096": _sim("mixed-4096", "--policy rex --seed 0"),
}


def render_targets(data: dict[str, Any]) -> dict[str, str]:
    """The controller's targets, measured."""

    def rex(key: str) -> dict[str, Any]:
        return result(data, key)["policies"]["rex"]

    def cmd(key: str) -> str:
        return "`" + data["commands"][key]["command"].replace("python -m lightning_rex ", "") + "`"

    rows = ["| target | command | measured |", "| --- | --- | --- |"]
    for key in ("a100", "mixed-64"):
        r = rex(key)
        pol = result(data, key)["policies"]
        rows.append(
            f"| steady state: efficiency >= 0.97 | {cmd(key)} | rex {f3(r['eff_mean'])} whole run, "
            f"{f3(r['steady_eff_mean'])} steady (min {f3(r['steady_eff_min'])}); static "
            f"{f3(pol['static']['eff_mean'])}, proportional {f3(pol['proportional']['eff_mean'])} |"
        )
    for key in ("slowdown-mid", "drift"):
        r = rex(key)
        pol = result(data, key)["policies"]
        best = max(pol["static"]["eff_mean"], pol["proportional"]["eff_mean"])
        rows.append(
            f"| dynamic: efficiency >= 0.93, above static and proportional | {cmd(key)} | rex "
            f"{f3(r['eff_mean'])} (min {f3(r['eff_min'])}), {f3(r['eff_mean'] / best)}x the better"
            " baseline |"
        )
    r = rex("noise")
    rows.append(
        f"| noise only: <= 1 false rescale / 10,000 steps | {cmd('noise')} | "
        f"{r['false_per_10k_steps']:.2f} |"
    )
    r = rex("slowdown-15pct")
    rows.append(
        f"| a persistent 15% slowdown at CV 0.10 acted on within 3 windows in >= 95% (restated"
        f" below) | {cmd('slowdown-15pct')} | "
        f"{100 * r['events_acted_within_3']:.1f}% within 3, false rescales "
        f"{r['false_per_10k_steps']:.2f} / 10k |"
    )
    r = rex("transient")
    rows.append(
        f"| transient stragglers of <= 1 window acted on in <= 1% | {cmd('transient')} | "
        f"{100 * r['events_acted_within_3']:.2f}% |"
    )
    for key in ("spiky", "twoscale"):
        r = rex(key)
        rows.append(
            f"| noise only: false rescales / 10,000 steps | {cmd(key)} | "
            f"{r['false_per_10k_steps']:.2f} |"
        )
    for key, limit in (("latency-8", "20 ms at 8 ranks"), ("latency-4096", "1 s at 4096 ranks")):
        r = result(data, key)["policies"]["rex"]
        rows.append(
            f"| decision latency p50 <= {limit} | {cmd(key)} | p50 {r['decision_ms_p50']:.1f} ms, "
            f"p99 {r['decision_ms_p99']:.0f} ms |"
        )
    return {"sim-targets": "\n".join([*rows, "", measured(data)])}


FOUR = ("--scenario", "mixed-4096")
SIM4096_CMDS = {
    "trace": _rex(
        "simulate", *FOUR, "--policy", "rex", "--seed", "0", "--trace", "prior_run", "--json"
    ),
    "prior": _rex(
        "simulate",
        *FOUR,
        "--compare",
        "proportional,rex",
        "--seeds",
        "1-2",
        "--prior",
        "prior_run/mixed-4096/rex/seed0.jsonl",
        "--json",
    ),
    "no-prior": _rex(
        "simulate", *FOUR, "--compare", "proportional,rex", "--seeds", "1-2", "--json"
    ),
    "defaults": _rex(
        "simulate", *FOUR, "--compare", "proportional,rex", "--seeds", "0-9", "--json"
    ),
    "fixed-10": _rex(
        "simulate",
        *FOUR,
        "--compare",
        "proportional,rex",
        "--seeds",
        "0-9",
        "--warmup",
        "10",
        "--max-warmup",
        "0",
        "--json",
    ),
}


def render_4096(data: dict[str, Any]) -> dict[str, str]:
    """The first minutes at 4096 ranks: a prior, the warm-up at speed against a fixed one."""
    rows = [
        "| run | command | rex, whole run (steady) | plan changes | proportional |",
        "| --- | --- | --- | --- | --- |",
    ]
    labels = {
        "no-prior": "no prior (seeds 1-2)",
        "prior": "seed 0's log as the prior (seeds 1-2)",
        "defaults": "defaults (seeds 0-9)",
        "fixed-10": "a fixed 10-step warm-up, the former default (seeds 0-9)",
    }
    for key, label in labels.items():
        pol = result(data, key)["policies"]
        r = pol["rex"]
        rows.append(
            f"| {label} | `{data['commands'][key]['command']}` | {f3(r['eff_mean'])} "
            f"({f3(r['steady_eff_mean'])}) | {r['plan_changes_mean']:.1f} | "
            f"{f3(pol['proportional']['eff_mean'])} |"
        )
    return {"sim-4096": "\n".join([*rows, "", measured(data)])}


# ----------------------------------------------------------------------------- batch scaling
GNS = ("gns-flat-8", "gns-slow-8", "gns-fast-8", "gns-flat-64", "gns-slow-64", "gns-fast-64")
GNS_LONG = ("gns-image-8", "gns-lm-8", "gns-image-64", "gns-lm-64")
_GNS_POLICIES = "fixed,hindsight,adaptive-oracle,pollux,pollux-split,pollux-rex,rex"


def _gns_compare(presets: tuple[str, ...]) -> dict[str, Command]:
    return {
        p: _rex("simulate", "--scenario", p, "--compare", _GNS_POLICIES, "--seeds", "0-9", "--json")
        for p in presets
    }


def _gns_cmds() -> dict[str, Command]:
    out = _gns_compare(GNS)
    out["gns-slow-4096"] = _sim("gns-slow-4096", "--policy rex --seeds 0-2")
    return out


GNS_LONG_CMDS = _gns_compare(GNS_LONG)


def _gns_rows(data: dict[str, Any], presets: tuple[str, ...]) -> list[str]:
    """Time to target of every batch policy, and rex's paired ratios, one row a preset."""
    rows = [
        "| preset | fixed `B0` | hindsight (`B`) | adaptive oracle | Pollux | Pollux, oracle split"
        " | Pollux, rex's split | rex (mean `B`, first change) | rex / oracle"
        " | rex / Pollux, rex's split | rex / Pollux, oracle split | rex / Pollux |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in presets:
        r = result(data, p)
        pol = r["policies"]

        def t(name: str, pol: dict[str, Any] = pol) -> str:
            v = pol[name]["time_to_target_mean"]
            return "-" if v is None else f"{v:.1f} s"

        rex = pol["rex"]
        first = rex["first_change_step_mean"]
        ratio = {  # rex's time over the policy's, paired by seed
            n: f"{f3(pol[n]['rex_time_ratio'])} {interval(*pol[n]['rex_time_ratio_ci95'])}"
            for n in ("adaptive-oracle", "pollux-rex", "pollux-split", "pollux")
        }
        rows.append(
            f"| `{p}` | {t('fixed')} | {t('hindsight')} ({r['hindsight_batch']}) | "
            f"{t('adaptive-oracle')} | {t('pollux')} | {t('pollux-split')} | "
            f"{t('pollux-rex')} | {t('rex')} ({rex['mean_batch_mean']:.0f}, step "
            f"{'-' if first is None else f'{first:.0f}'}) | {ratio['adaptive-oracle']} | "
            f"{ratio['pollux-rex']} | {ratio['pollux-split']} | {ratio['pollux']} |"
        )
    return rows


def _gns_span(data: dict[str, Any], presets: tuple[str, ...], peer: str) -> str:
    """The range of rex's mean time ratio to ``peer`` over ``presets``: ``0.95-1.02x``."""
    r = [result(data, p)["policies"][peer]["rex_time_ratio"] for p in presets]
    return f"{min(r):.2f}-{max(r):.2f}x"


def _gns_summary(data: dict[str, Any], presets: tuple[str, ...], what: str) -> str:
    """One line of rex's time ratios over a set of presets, for the README."""
    return (
        f"On the {what}, seeds 0-9, rex's time to the target is "
        f"{_gns_span(data, presets, 'pollux')} Pollux's, "
        f"{_gns_span(data, presets, 'pollux-rex')} that of Pollux's batch choice with rex's "
        f"split, {_gns_span(data, presets, 'pollux-split')} that of Pollux's batch choice "
        f"with the oracle's split, and {_gns_span(data, presets, 'adaptive-oracle')} the "
        "adaptive oracle's (means by preset, paired by seed)."
    )


_GAP_PARTS = ("start_s", "trials_s", "kept_s", "shape_s", "steps_s")


def _gns_gap_rows(data: dict[str, Any], presets: tuple[str, ...]) -> list[str]:
    """The time of rex and of Pollux's two splits over the oracle's, part by part (``time_parts``).

    Each cell is the policy's mean part less the oracle's, in points of the oracle's mean
    time; the first is the whole difference (the limit's, the last step's overshoot, is in
    it too).
    """
    rows = [
        "| preset | policy | over the oracle | batch choice: at `B0`, before the first change"
        " | trials gone back on | the batches kept | all three | new shapes"
        " | the split and noise |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in presets:
        pol = result(data, p)["policies"]
        oracle = pol["adaptive-oracle"]
        base, ref = oracle["time_to_target_mean"], oracle["time_parts_mean"]
        for name, label in (
            ("rex", "rex"),
            ("pollux-rex", "Pollux, rex's split"),
            ("pollux-split", "Pollux, oracle split"),
        ):
            agg = pol[name]
            parts = agg["time_parts_mean"]
            total = 100.0 * (agg["time_to_target_mean"] - base) / base
            diff = {k: 100.0 * (parts[k] - ref[k]) / base for k in _GAP_PARTS}
            choice = diff["start_s"] + diff["trials_s"] + diff["kept_s"]
            cells = [f"{diff[k]:+.1f}" for k in _GAP_PARTS[:3]]
            cells += [f"**{choice:+.1f}**", *(f"{diff[k]:+.1f}" for k in _GAP_PARTS[3:])]
            rows.append(
                f"| {f'`{p}`' if name == 'rex' else ''} | {label} | {total:+.1f}% | "
                + " | ".join(cells)
                + " |"
            )
    return rows


def render_gns_long(data: dict[str, Any]) -> dict[str, str]:
    """The long workload presets' table (hours at the fixed ``B0``) and its summary."""
    return {
        "gns-long-table": "\n".join([*_gns_rows(data, GNS_LONG), "", measured(data)]),
        "gns-long-summary": _gns_summary(data, GNS_LONG, "long presets (hours at `B0`)"),
        "gns-long-gap": "\n".join(_gns_gap_rows(data, GNS_LONG)),
    }


def render_gns(data: dict[str, Any]) -> dict[str, str]:
    """Global batch scaling's time to target against Pollux, its split and the two limits."""
    rows = _gns_rows(data, GNS)
    summary = _gns_summary(data, GNS, "short presets (minutes at `B0`)")
    big = result(data, "gns-slow-4096")["policies"]["rex"]
    line = (
        f"At 4096 ranks (`{data['commands']['gns-slow-4096']['command']}`): time to target "
        f"{big['time_to_target_mean']:.1f} s, decisions p99 {big['decision_ms_p99']:.0f} ms; "
        f"the command took {duration(seconds(data, 'gns-slow-4096'))}."
    )
    return {
        "gns-table": "\n".join([*rows, "", measured(data)]),
        "gns-4096": line,
        "gns-summary": summary,
        "gns-gap": "\n".join(_gns_gap_rows(data, GNS)),
    }
