"""examples/profile_curve.py: a measured curve that the simulator takes as a rank entry."""

import importlib.util
import json
from pathlib import Path

from lightning_rex.sim import scenario_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_profile_curve_writes_a_rank_the_simulator_accepts(tmp_path):
    spec = importlib.util.spec_from_file_location("profile_curve", EXAMPLES / "profile_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "c.json"
    args = ["--model", "bench", "--sizes", "1,4,16", "--repeats", "2", "--warmup", "1"]
    assert mod.main([*args, "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    rank = d["rank"]
    assert [b for b, _ in rank["curve"]] == [1, 4, 16] and rank["mem_cap"] == 16
    assert rank["device"] == "cpu" and d["shape_change_s"] >= 0.0
    s = scenario_from_dict({"global_batch": 16, "steps": 10, "ranks": [rank, rank]})
    assert s.base_times([8, 8]).shape == (2,)
