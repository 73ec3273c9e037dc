"""Regenerate ``rex_decisions.jsonl``: the report test's recorded decision log.

Run from the repository root: ``python tests/tools/data/make_rex_decisions.py``. It simulates
rex on 4 ranks (two fast, two slow) for 600 steps, where rank 1 slows down 1.6x at step 300,
and writes the driver's window records as training writes them.
"""

import json
from pathlib import Path

from lightning_rex.sim import make_policy, scenario_from_dict, simulate

RANK = {"overhead_s": 0.004, "knee": 16, "mem_cap": 512}
SCENARIO = {
    "global_batch": 256,
    "steps": 600,
    "window": 30,
    "comm": 0.005,
    "ranks": [
        {**RANK, "rate": 3000.0},
        {**RANK, "rate": 3000.0},
        {**RANK, "rate": 1500.0},
        {**RANK, "rate": 1500.0},
    ],
    "noise": {"dist": "lognormal", "cv": 0.08, "ar1": 0.5},
    "events": [{"ranks": [1], "start": 300, "end": 600, "factor": 1.6}],
}

if __name__ == "__main__":
    scen = scenario_from_dict(SCENARIO, "fixture-4")
    trace = simulate(scen, make_policy("rex", scen), 0)
    out = Path(__file__).with_name("rex_decisions.jsonl")
    with out.open("w") as fh:
        for i, rec in enumerate(trace.records):
            rec["run_id"] = "fixture0"
            rec["time"] = f"2025-01-01T00:{i // 60:02d}:{i % 60:02d}.000+00:00"
            fh.write(json.dumps(rec) + "\n")
    print(f"{out}: {len(trace.records)} records")
