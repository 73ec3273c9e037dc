import numpy as np
import pytest

from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.scaling.step_times import StepTimes, steady_times
from lightning_rex.core.window import Window

N, B0 = 4, 64


def test_steady_times_leave_out_the_one_off_steps():
    t = np.array([0.05, 0.5, 0.05, 0.06, 0.05, 0.12])  # a new shape's step, and one > 2x
    assert steady_times(t).tolist() == [0.05, 0.05, 0.06, 0.05]
    # fewer than two would remain: all are kept
    assert steady_times(np.array([0.05, 0.5, 0.6])).tolist() == [0.05, 0.5, 0.6]


def test_measured_times_drop_a_first_step_and_add_the_median_overhead():
    steps = StepTimes(Controller(B0, N, seed=0))
    rank = np.full((N, 10), 0.04)
    rank[:, 0] = 0.07  # the first step of new shapes, under the one-off threshold
    # 10 steps, a mean of 0.043 s, in 0.53 s of wall clock: 0.010 s a step outside them
    first = steps.measured(Window(rank, (16,) * N, 0, 10, wall_s=0.5 + 0.03), first=True)
    assert first.size == 9
    assert first == pytest.approx(0.04 + steps.overhead_s)
    assert steps.overhead_s == pytest.approx(0.010, abs=1e-9)
    again = steps.measured(Window(rank, (16,) * N, 10, 20))  # no wall clock: overhead kept
    assert again.size == 10 and again[0] == pytest.approx(0.07 + steps.overhead_s)


def test_predictions_are_kept_until_forgotten_and_inf_beyond_the_bounds():
    ctl = Controller(B0, N, seed=0, max_global_batch=1024)
    steps = StepTimes(ctl)
    rng = np.random.default_rng(0)
    for start in range(0, 90, 30):  # the rank model's first windows
        t = 0.02 + np.asarray(ctl.plan)[:, None] / 1000.0 * np.exp(rng.normal(0, 0.03, (N, 30)))
        ctl.observe(Window(t, ctl.plan, start, start + 30))
    first = steps.predict(256)
    assert np.isfinite(first) and first > 0
    steps.wait.observe(np.full((N, 30), 0.05) * np.exp(rng.normal(0, 0.5, (N, 30))))
    assert steps.predict(256) == first  # kept: the model has not taken a window since
    steps.forget()
    assert steps.predict(256) > first  # remade with the wait for a noisier slowest rank
    ctl.set_bounds(1, [24] * N)  # 96 samples at most
    steps.forget()
    assert steps.predict(256) == float("inf")
    assert np.isfinite(steps.predict(96)) and np.isfinite(steps.predict_plan((24,) * N))


def test_a_better_split_is_offered_only_past_the_least_gain():
    # one rank twice as fast as the others: the even plan is well off the model's best
    ctl = Controller(B0, N, seed=0, max_global_batch=1024)
    steps = StepTimes(ctl)
    rng = np.random.default_rng(1)
    speed = np.array([2.0] + [1.0] * (N - 1))[:, None]
    for start in range(0, 90, 30):
        t = 0.02 + np.asarray(ctl.plan)[:, None] / (1000.0 * speed)
        ctl.observe(Window(t * np.exp(rng.normal(0, 0.02, (N, 30))), ctl.plan, start, start + 30))
    even = (B0 // N,) * N
    better = steps.better_split(even, 0.02)
    assert better is not None
    best, now, then = better
    assert sum(best) == B0 and best[0] > max(best[1:])  # the fast rank takes more
    assert now >= then * 1.02
    assert steps.better_split(best, 0.02) is None  # the best plan has nothing better
    assert steps.better_split(even, now / then) is None  # a gain it does not reach
    ctl.set_bounds(1, [24] * N)  # 96 samples at most: a batch of 128 has no plan
    steps.forget()
    assert steps.better_split((32,) * N, 0.02) is None
