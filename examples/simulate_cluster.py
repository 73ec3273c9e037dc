"""Simulate your own cluster from a scenario file, then plot what each policy did.

``examples/my_cluster.yaml`` describes 8 GPUs of three kinds (two T4s with a memory wall),
a 0.5 s cost per new micro-batch shape, and a co-tenant that slows one A100 halfway through.
Edit it to describe your cluster (schema: docs/simulator.md, "Scenarios"). This script runs
rex against the even split, the static proportional plan and the published peers (LBB,
OmniLearn), paired over seeds, then renders the report (PNG plots and an HTML page)::

    python examples/simulate_cluster.py [--scenario examples/my_cluster.yaml] [--seeds 0-4]
        [--out rex_sim]

The same two steps from a shell::

    python -m lightning_rex simulate --scenario examples/my_cluster.yaml \\
        --compare even,proportional,lbb,omnilearn,rex --seeds 0-4 --trace rex_sim/trace
    python -m lightning_rex report rex_sim/trace --out rex_sim/report
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lightning_rex.__main__ import main as rex

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default=str(HERE / "my_cluster.yaml"))
    p.add_argument("--seeds", default="0-4", help="a seed range A-B (default 0-4)")
    p.add_argument("--out", default="rex_sim", help="where the trace and report go")
    a = p.parse_args(argv)
    trace, report = os.path.join(a.out, "trace"), os.path.join(a.out, "report")
    policies = "even,proportional,lbb,omnilearn,rex"
    sim = f"simulate --compare {policies} --seeds {a.seeds}".split()
    code = rex([*sim, "--scenario", a.scenario, "--trace", trace])
    if code:
        return code
    code = rex(["report", trace, "--out", report])
    if code == 0:
        print(f"open {os.path.join(report, 'index.html')} in a browser")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
