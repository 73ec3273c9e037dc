import numpy as np
import pytest

from lightning_rex.core.window import Window


def test_valid_window_exposes_shapes_and_stats():
    t = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 5.0]])
    w = Window(t, (3, 5), 30, 33)
    assert (w.n_ranks, w.n_steps) == (2, 3)
    assert w.times.dtype == np.float64
    np.testing.assert_allclose(w.medians, [2.0, 2.0])
    np.testing.assert_allclose(w.step_max, [2.0, 2.0, 5.0])
    assert w.plan == (3, 5)
    with pytest.raises(ValueError, match="read-only"):
        w.times[0, 0] = 9.0


@pytest.mark.parametrize(
    ("times", "plan", "start", "end", "match"),
    [
        (np.ones(3), (1,), 0, 3, "shape"),
        (np.ones((2, 3)), (1, 1, 1), 0, 3, "one entry per rank"),
        (np.ones((2, 3)), (1, 0), 0, 3, ">= 1"),
        (np.array([[1.0, -1.0]]), (1,), 0, 2, "finite"),
        (np.array([[1.0, np.nan]]), (1,), 0, 2, "finite"),
        (np.ones((1, 2)), (1,), 5, 5, "step_end"),
        (np.ones((0, 2)), (), 0, 2, "at least one"),
    ],
)
def test_invalid_windows_are_rejected(times, plan, start, end, match):
    with pytest.raises(ValueError, match=match):
        Window(times, plan, start, end)


def test_from_lists():
    w = Window.from_lists([[1.0, 1.0], [2.0, 2.0]], [4, 4], step_start=10)
    assert (w.step_start, w.step_end) == (10, 12)


def test_overhead_is_the_wall_clock_outside_the_slowest_rank() -> None:
    t = np.array([[0.02, 0.03], [0.04, 0.01]])  # the slowest rank's: 0.04 + 0.03
    w = Window(t, (4, 4), 10, 12, wall_s=0.09)
    assert w.overhead_s == pytest.approx(0.01)
    assert Window(t, (4, 4), 10, 12).overhead_s is None
    assert Window(t, (4, 4), 10, 12, wall_s=0.05).overhead_s == 0.0  # another clock's grain
    with pytest.raises(ValueError, match="wall_s"):
        Window(t, (4, 4), 10, 12, wall_s=float("nan"))
