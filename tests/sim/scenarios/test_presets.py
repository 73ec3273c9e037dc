import numpy as np
import pytest

from lightning_rex.sim.scenarios.presets import PRESETS, SHAPE_CHANGE_S
from lightning_rex.sim.scenarios.schema import load_scenario, with_shape_change


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


def test_the_shape_presets_have_their_shapes():
    tiled = load_scenario("tiled-8")
    t = np.array([tiled.base_times(np.full(8, n)) for n in range(33, 66)])  # sizes 33..65
    a100, v100 = t[:, 0], t[:, 3]
    assert len(set(v100[:8])) == 1 and v100[8] > v100[7]  # 33..40 one stair, 41 the next
    assert len(set(a100[:16])) == 1 and a100[16] > a100[15]  # 16-sample stairs on A100
    wall = load_scenario("memwall-8")
    a100 = wall.ranks[0]
    lo, hi = wall.base_times(np.full(8, 150))[0], wall.base_times(np.full(8, 250))[0]
    assert a100.wall == (0.7, 2.5) and hi / lo > 2 * 250 / 150  # far above linear growth
    meas = load_scenario("resnet50-k80-m60-v100-6")
    assert meas.devices == ("K80", "K80", "M60", "M60", "V100", "V100")
    t = meas.base_times(np.array([32, 32, 32, 32, 128, 128]))
    assert t == pytest.approx([0.646726, 0.646726, 0.468247, 0.468247, 0.351948, 0.351948])


def test_the_noise_presets_have_their_noise():
    two = load_scenario("twoscale-noise-8").noise
    assert [(c.share, c.ar1) for c in two.components] == [(0.6, 0.95), (0.4, 0.0)]
    spiky = load_scenario("spiky-noise-8").noise
    assert (spiky.spikes.prob, spiky.spikes.factor) == (0.01, 3.0)


def test_gpu_presets_charge_the_documented_shape_change_cost():
    for name in PRESETS:
        expected = 0.0 if name == "pair-3x" else SHAPE_CHANGE_S
        assert load_scenario(name).shape_change_s == expected, name
    assert with_shape_change(load_scenario("drift-16"), 0.0).shape_change_s == 0.0
