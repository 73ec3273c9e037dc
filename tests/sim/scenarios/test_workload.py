"""The workload's statistics: the array forms agree with the scalar ones they stand for."""

from __future__ import annotations

import numpy as np
from tests.helpers.workload import workload_scenario

from lightning_rex.sim.scenarios.schema import scenario_from_dict
from lightning_rex.sim.scenarios.workload import Workload


def _workload() -> Workload:
    trace = [[0.0, 4.0, 100.0], [1000.0, 1.0, 200.0], [3000.0, 0.5, 400.0]]
    workload = scenario_from_dict(workload_scenario(trace=trace)).workload
    assert workload is not None
    return workload


def test_noise_scales_interpolate_as_noise_scale_does_and_hold_past_the_ends() -> None:
    w = _workload()
    progress = np.array([-5.0, 0.0, 500.0, 1000.0, 2000.0, 3000.0, 9000.0])
    np.testing.assert_array_equal(w.noise_scales(progress), [w.noise_scale(p) for p in progress])
    assert w.noise_scale(500.0) == 150.0 / 2.5  # each statistic is interpolated, then divided
    assert w.noise_scales(np.array([9000.0]))[0] == 800.0


def test_efficiency_and_goodput_share_one_formula() -> None:
    w = _workload()
    batches = np.array([32, 64, 512, 4096])
    phi = w.noise_scale(2000.0)
    expected = (phi + 32) / (phi + batches)
    np.testing.assert_allclose(w.efficiency_at(batches, phi), expected, rtol=1e-15)
    assert [w.efficiency(float(b), 2000.0) for b in batches] == list(w.efficiency_at(batches, phi))
    assert w.efficiency(32.0, 2000.0) == 1.0  # at b0 a sample is a sample of progress
    step_s = np.array([0.01, 0.015, 0.05, 0.3])
    rates = w.goodput(batches, step_s, 2000.0)
    np.testing.assert_allclose(rates, batches * expected / step_s, rtol=1e-15)
    assert rates.shape == batches.shape and w.step_progress(64.0, 2000.0) == 64 * expected[1]
