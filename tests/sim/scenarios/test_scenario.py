import json

import numpy as np
import pytest

from lightning_rex.sim.scenarios.presets import PRESETS
from lightning_rex.sim.scenarios.scenario import ScenarioError
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict, to_dict

BASE = {
    "global_batch": 64,
    "steps": 300,
    "window": 30,
    "comm": 0.01,
    "ranks": [{"rate": 1000.0, "overhead_s": 0.004, "knee": 8, "mem_cap": 64}] * 2,
    "noise": {"dist": "lognormal", "cv": 0.1, "ar1": 0.5},
    "events": [{"ranks": [1], "start": 100, "end": 200, "factor": 1.5}],
}


def with_(path, value):
    d = json.loads(json.dumps(BASE))
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return d


def test_valid_round_trip():
    s = scenario_from_dict(BASE, name="x")
    assert s.world_size == 2 and s.events[0].factor == 1.5
    assert scenario_from_dict(to_dict(s)) == s
    assert s.factors(150).tolist() == [1.0, 1.5] and s.event_active(150)
    assert not s.event_active(200)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("ranks", 0, "rate"), -5.0, "ranks[0].rate"),
        (("ranks",), [], "ranks"),
        (("events", 0, "end"), 400, "events[0]"),
        (("events", 0, "start"), 300, "events[0]"),
        (("events", 0, "ranks"), [7], "events[0].ranks"),
        (("bogus",), 1, "bogus"),
        (("ranks", 0, "speed"), 1, "speed"),
        (("noise", "sigma"), 1, "sigma"),
        (("noise", "ar1"), 1.0, "noise.ar1"),
        (("global_batch",), 0, "global_batch"),
        (("ranks", 1, "mem_cap"), 8, "mem_cap"),
    ],
)
def test_bad_values_name_the_field(path, value, field):
    with pytest.raises(ScenarioError, match=field.replace("[", r"\[").replace("]", r"\]")):
        scenario_from_dict(with_(path, value))


def test_missing_required_field():
    d = dict(BASE)
    del d["steps"]
    with pytest.raises(ScenarioError, match="steps"):
        scenario_from_dict(d)


def test_files_and_presets(tmp_path):
    import yaml

    j = tmp_path / "a.json"
    j.write_text(json.dumps(BASE))
    y = tmp_path / "b.yaml"
    y.write_text(yaml.safe_dump(BASE))
    assert load_scenario(str(j)) == scenario_from_dict(BASE, name="a")
    assert load_scenario(str(y)).ranks == load_scenario(str(j)).ranks
    for name in PRESETS:
        assert load_scenario(name).name == name
    with pytest.raises(ScenarioError, match="neither a preset"):
        load_scenario("no-such-thing")
    required = {
        "pair-3x",
        "homogeneous-8",
        "a100-v100-t4-8",
        "mixed-64",
        "slowdown-mid-16",
        "transient-16",
        "drift-16",
        "mixed-4096",
    }
    assert required <= set(PRESETS)


def test_a_wave_round_trips_and_shapes_the_curve():
    d = with_(("ranks", 0, "wave"), {"size": 32, "share": 0.5})
    s = scenario_from_dict(d)
    assert s.ranks[0].wave == (32, 0.5) and s.ranks[1].wave is None
    assert scenario_from_dict(to_dict(s)) == s
    t = s.time_table(np.array([32, 33]), 0)
    assert t[0, 1] - t[0, 0] > 10 * (t[1, 1] - t[1, 0])  # only rank 0 jumps at its wave


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"size": 0, "share": 0.5}, "wave.size"),
        ({"size": 32, "share": 1.5}, "wave.share"),
        ({"size": 32}, "share"),
        ({"size": 32, "share": 0.5, "depth": 2}, "depth"),
    ],
)
def test_bad_waves_name_the_field(value, field):
    with pytest.raises(ScenarioError, match=field):
        scenario_from_dict(with_(("ranks", 0, "wave"), value))
