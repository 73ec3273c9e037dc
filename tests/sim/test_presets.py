import pytest

from lightning_rex.sim.presets import PRESETS
from lightning_rex.sim.scenario import load_scenario


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_valid(name):
    s = load_scenario(name)
    assert s.name == name and s.world_size >= 2


def test_presets_match_their_names():
    pair = load_scenario("pair-3x")
    assert pair.ranks[0].rate == pytest.approx(3 * pair.ranks[1].rate)
    assert {r.rate for r in load_scenario("homogeneous-8").ranks} == {2000.0}
    assert load_scenario("homogeneous-8").world_size == 8
    gpus = load_scenario("a100-v100-t4-8")
    assert len({r.rate for r in gpus.ranks}) == 3 and gpus.world_size == 8
    assert load_scenario("mixed-64").world_size == 64
    assert load_scenario("mixed-4096").world_size == 4096
    mid = load_scenario("slowdown-mid-16")
    assert [(e.start, e.end) for e in mid.events] == [(mid.steps // 2, mid.steps)]
    trans = load_scenario("transient-16")
    assert all(e.end - e.start <= trans.window for e in trans.events)
    assert any(e.start // trans.window != (e.end - 1) // trans.window for e in trans.events)
    drift = load_scenario("drift-16")
    assert drift.factors(drift.steps - 1).max() > 1.5
