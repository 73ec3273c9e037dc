import math

import numpy as np
import pytest

from lightning_rex.core.scaling.straggler import StragglerWait, rank_log_scale


def test_rank_log_scale_recovers_each_ranks_noise_and_shrugs_off_a_spike():
    rng = np.random.default_rng(0)
    sigma = np.array([0.02, 0.05, 0.1])
    times = 0.04 * np.exp(rng.standard_normal((3, 400)) * sigma[:, None])
    times[1, 7] = 10.0  # a one-off step
    assert rank_log_scale(times) == pytest.approx(sigma, rel=0.12)
    assert rank_log_scale(np.array([[0.1, 0.0, 0.1]]))[0] == 0.0  # not positive: no estimate


def test_without_an_estimate_the_step_is_the_slowest_rank_plus_overhead():
    wait = StragglerWait()
    assert wait.scales is None
    assert wait.step_time(np.array([0.1, 0.3, 0.2]), 0.05) == pytest.approx(0.35)


def test_equal_ranks_wait_for_the_expected_maximum_of_their_noise():
    # two ranks of log noise sigma: E[max of 2 standard normals] = 1 / sqrt(pi)
    rng = np.random.default_rng(1)
    sigma = 0.05
    wait = StragglerWait(draws=4096)
    wait.observe(0.1 * np.exp(rng.standard_normal((2, 2000)) * sigma))
    expected = 0.1 * math.exp(sigma / math.sqrt(math.pi))
    assert wait.step_time(np.array([0.1, 0.1])) == pytest.approx(expected, rel=0.01)
    # a rank far slower than the other is waited for alone: no expected-maximum premium
    assert wait.step_time(np.array([0.1, 0.2])) == pytest.approx(0.2, rel=0.005)
    # and the premium grows with the number of equal ranks
    wide = StragglerWait()
    wide.observe(0.1 * np.exp(rng.standard_normal((64, 200)) * sigma))
    assert wide.step_time(np.full(64, 0.1)) > 0.1 * math.exp(2 * sigma)


def test_another_world_size_starts_the_estimate_afresh_and_short_windows_are_ignored():
    wait = StragglerWait(windows=2)
    wait.observe(np.full((4, 10), 0.1))
    wait.observe(np.full((4, 2), 0.1))  # too few steps for a scale
    assert wait.scales is not None and wait.scales.shape == (4,)
    wait.observe(0.1 * np.exp(np.random.default_rng(0).standard_normal((2, 50)) * 0.1))
    assert wait.scales.shape == (2,) and np.all(wait.scales > 0.05)
    # a plan of another size than the estimate is predicted without the wait
    assert wait.step_time(np.array([0.1, 0.1, 0.1])) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="windows and draws"):
        StragglerWait(windows=0)
