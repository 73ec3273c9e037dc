"""Figures of preemption and the hang watchdog (issue 60): their tests, repeated."""

from __future__ import annotations

from typing import Any

from common import Command, result

RELIABILITY_CMDS = {
    "trial": Command(
        ("{python}", "{root}/scripts/reliability_trial.py", "--json", "out.json"), "file"
    ),
}


def _s(x: float) -> str:
    return f"{x:.2f} s"


def render_reliability(data: dict[str, Any]) -> dict[str, str]:
    """How fast a hung rank ends the run, and how many paused runs and signals went through."""
    r = result(data, "trial")
    ends = [t for h in r["hangs"] for t in h["ended_s"]]
    polls = (max(ends) - r["limit_s"]) / r["poll_s"]
    pause = [ok for name, ok in r["watchdog"].items() if "pause" in name]
    repeated = {k: ok for k, ok in r["preemption"].items() if "world_size" not in k}
    other_size = [ok for k, ok in r["preemption"].items() if "world_size" in k]
    return {
        "watchdog-hang": (
            f"{_s(min(ends))} to {_s(max(ends))} after the hang, at a limit of "
            f"{r['limit_s']:g} s polled every {r['poll_s']:g} s (the limit plus {polls:.1f} "
            "polls, with rank 1 hung and with rank 0 hung)"
        ),
        "watchdog-pause": (
            f"{r['pauses'] if all(pause) else 0} runs of {r['pauses']} (a validation of "
            f"{r['pause_s']:g} s on both ranks, then a fetch of {r['lag_s']:g} s on one, at a "
            f"limit of {r['limit_s']:g} s)"
        ),
        "preemption-trials": (
            f"{sum(repeated.values())} of {len(repeated)} cases passed, each interrupted and "
            f"resumed {r['signals']} times; the resume on another world size "
            f"{'passed' if all(other_size) else 'failed'}"
        ),
    }
