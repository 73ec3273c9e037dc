"""The README's first script, run as a user runs it: where its plan lands, and its headline.

Issue 59 asked that the script land within 4 samples of the plan the README states in every
run, and that the report's headline (the even split's throughput, estimated from rex's own
records) be checked against real DDP runs of the same script, paired. Run from the
repository root, with the package installed::

    python scripts/readme_check.py [--rounds 3] [--json FILE]

Each round runs the script twice, as written (``strategy="rex"``) and with
``strategy="ddp"`` plus a monitor-only ``RexCallback`` (which records each window's samples
and wall time), in alternating order. It prints each rex run's final plan and headline, each
ddp run's measured throughput over the same windows, and per round the headline's
even-split estimate over ddp's measured throughput (1.0: unbiased).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _script(strategy: str) -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found is not None, "README.md has no python block"
    script = found.group(1)
    if strategy == "ddp":
        script = script.replace('strategy="rex",', 'strategy="ddp",')
        script = script.replace("list(trainer.strategy.plan)", "None")
        monitor = "lightning_rex.RexCallback(verbose=False), "  # monitor-only under ddp
        script = script.replace(
            "callbacks=[lightning_rex.HeterogeneityEmulator(",
            f"callbacks=[{monitor}lightning_rex.HeterogeneityEmulator(",
        )
    return script


def _records(run_dir: Path) -> list[dict[str, Any]]:
    log = run_dir / "lightning_logs" / "version_0" / "rex_decisions.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _run(strategy: str) -> dict[str, Any]:
    from lightning_rex.tools.headline import even_split_headline

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.py"
        path.write_text(_script(strategy))
        done = subprocess.run(
            [sys.executable, str(path)], cwd=tmp, capture_output=True, text=True, check=True
        )
        records = _records(Path(tmp))
    timed = [r for r in records if r.get("window_wall_s")]
    out: dict[str, Any] = {
        "strategy": strategy,
        "first_window_step": timed[0]["step"] if timed else None,
        "samples_per_s": sum(r["window_samples"] for r in timed)
        / sum(r["window_wall_s"] for r in timed),
    }
    if strategy == "rex":
        plan = re.search(r"plan in force at the end: (\[.*?\])", done.stdout)
        out["plan"] = json.loads(plan.group(1)) if plan else None
        headline = even_split_headline(records)
        if headline is not None:
            out["headline_even"] = list(headline.even)
            out["headline_speedup"] = list(headline.speedup)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the results.

    Args:
        argv: The command line (default: ``sys.argv``).

    Returns:
        The exit code.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of rex and ddp (default 3)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results here")
    a = p.parse_args(argv)
    rounds = []
    for k in range(a.rounds):
        order = ("rex", "ddp") if k % 2 == 0 else ("ddp", "rex")
        runs = {name: _run(name) for name in order}
        rex, ddp = runs["rex"], runs["ddp"]
        est = rex.get("headline_even", [float("nan")] * 3)
        rounds.append({"rex": rex, "ddp": ddp, "estimate_over_ddp": est[0] / ddp["samples_per_s"]})
        print(
            f"round {k}: rex plan {rex['plan']}, {rex['samples_per_s']:.0f} samples/s, headline "
            f"x{rex['headline_speedup'][0]:.2f} (even split estimated {est[0]:.0f} samples/s, "
            f"95% {est[1]:.0f}-{est[2]:.0f}); ddp measured {ddp['samples_per_s']:.0f} samples/s; "
            f"estimate / ddp {rounds[-1]['estimate_over_ddp']:.3f}; rex / ddp measured "
            f"x{rex['samples_per_s'] / ddp['samples_per_s']:.2f}",
            flush=True,
        )
    ratios = [r["estimate_over_ddp"] for r in rounds]
    median = statistics.median(ratios)
    print(f"the headline's even-split estimate / ddp measured: median {median:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
