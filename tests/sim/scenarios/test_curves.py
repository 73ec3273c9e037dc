import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.interpolate import CubicSpline

from lightning_rex.sim.scenarios.curves import TableCurve, affine_times, memory_wall_factor

POINTS = [(1, 0.010), (8, 0.012), (32, 0.020), (64, 0.035), (128, 0.070)]
# a flat stretch between b=2 and b=4: a cubic spline wiggles there, PCHIP must not
FLAT = [(1, 1.0), (2, 2.0), (3, 2.0), (4, 2.0), (5, 3.0)]


# ---------------------------------------------------------------- TableCurve


def test_table_passes_exactly_through_every_point():
    c = TableCurve(POINTS)
    bs = np.array([p[0] for p in POINTS], dtype=float)
    ts = np.array([p[1] for p in POINTS])
    np.testing.assert_allclose(c(bs), ts, rtol=0, atol=1e-15)
    for b, t in POINTS:
        assert float(c(b)) == pytest.approx(t, abs=1e-15)


def test_table_monotone_between_points_for_monotone_data():
    c = TableCurve(POINTS)
    y = c(np.linspace(1, 128, 5001))
    assert np.all(np.diff(y) >= 0)
    assert y.min() >= POINTS[0][1] and y.max() <= POINTS[-1][1]


def test_pchip_does_not_overshoot_where_a_cubic_spline_does():
    x = [p[0] for p in FLAT]
    y = [p[1] for p in FLAT]
    grid = np.linspace(2, 4, 401)
    spline_dev = np.abs(CubicSpline(x, y)(grid) - 2.0).max()
    assert spline_dev > 1e-2  # the data really do make a cubic spline overshoot
    np.testing.assert_allclose(TableCurve(FLAT)(grid), 2.0, rtol=0, atol=1e-12)
    assert np.all(np.diff(TableCurve(FLAT)(np.linspace(1, 5, 801))) >= 0)


def test_table_flat_below_first_point():
    c = TableCurve([(4, 0.5), (8, 0.9), (16, 1.5)])
    np.testing.assert_array_equal(c(np.array([0.0, 1.0, 2.0, 3.5, 4.0])), 0.5)


def test_table_linear_above_last_point_with_last_segment_slope():
    c = TableCurve(POINTS)
    slope = (0.070 - 0.035) / (128 - 64)
    assert float(c(200)) == pytest.approx(0.070 + slope * 72, rel=1e-12)
    assert float(c(1000)) == pytest.approx(0.070 + slope * 872, rel=1e-12)
    # and not, e.g., the slope of the whole table or a pchip extrapolation
    assert float(c(1000)) != pytest.approx(0.070 + (0.070 - 0.010) / 127 * 872, rel=1e-3)


def test_table_extrapolation_never_below_smallest_time():
    c = TableCurve([(1, 0.1), (2, 0.5), (4, 0.3)])  # last segment slope -0.1
    assert float(c(5)) == pytest.approx(0.2, rel=1e-12)  # still on the line
    assert float(c(6)) == pytest.approx(0.1, rel=1e-12)  # reaches the floor
    np.testing.assert_allclose(c(np.array([7.0, 10.0, 1e6])), 0.1, rtol=0, atol=0)


def test_table_call_keeps_shape_and_dtype():
    c = TableCurve(POINTS)
    b = np.arange(1, 13).reshape(3, 4)
    out = c(b)
    assert out.shape == (3, 4) and out.dtype == np.float64
    assert c(7.0).shape == ()


def test_table_points_round_trip_through_json():
    c = TableCurve([[1, 0.01], [np.int64(8), np.float64(0.02)]])
    assert c.points == ((1.0, 0.01), (8.0, 0.02))
    assert all(type(v) is float for p in c.points for v in p)
    again = TableCurve(json.loads(json.dumps(c.points)))
    assert again.points == c.points
    np.testing.assert_array_equal(again(np.arange(1, 20)), c(np.arange(1, 20)))


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ([], "at least 2 points"),
        ([(1, 0.1)], "at least 2 points"),
        ([(1, 0.1), (1, 0.2)], "point 1: b values must be strictly increasing"),
        ([(1, 0.1), (4, 0.2), (3, 0.3)], "point 2: b values must be strictly increasing"),
        ([(1, 0.1), (2, 0.0)], "time must be finite and > 0"),
        ([(1, -0.1), (2, 0.2)], "time must be finite and > 0"),
        ([(1, 0.1), (2, math.nan)], "time must be finite and > 0"),
        ([(1, 0.1), (2, math.inf)], "time must be finite and > 0"),
        ([(0.5, 0.1), (2, 0.2)], "b must be finite and >= 1"),
        ([(0, 0.1), (2, 0.2)], "b must be finite and >= 1"),
        ([(1, 0.1), (math.nan, 0.2)], "b must be finite and >= 1"),
        ([(1, 0.1), (2, 0.2, 3)], "must be a pair"),
        ([(1, 0.1), (2,)], "must be a pair"),
        ([(1, 0.1), 2.0], "must be a pair"),
        ([(1, 0.1), "ab"], "must be a pair"),
        ([(1, 0.1), (2, "0.2")], "pair of numbers"),
        ([(1, 0.1), (True, 0.2)], "pair of numbers"),
    ],
)
def test_bad_tables_raise_naming_the_problem(points, match):
    with pytest.raises(ValueError, match=match):
        TableCurve(points)


def test_bad_table_message_names_the_point():
    with pytest.raises(ValueError, match=r"point 2: b values must be strictly increasing"):
        TableCurve([(1, 0.1), (4, 0.2), (3, 0.3)])


@st.composite
def monotone_tables(draw):
    bs = sorted(draw(st.sets(st.integers(1, 4096), min_size=2, max_size=10)))
    t0 = draw(st.floats(1e-4, 10.0))
    steps = draw(st.lists(st.floats(0.0, 5.0), min_size=len(bs) - 1, max_size=len(bs) - 1))
    ts = np.concatenate([[t0], t0 + np.cumsum(steps)])
    return [(b, float(t)) for b, t in zip(bs, ts)]


@settings(max_examples=200, deadline=None)
@given(monotone_tables())
def test_table_monotone_property(points):
    c = TableCurve(points)
    top = 2 * points[-1][0]
    grid = np.union1d(np.linspace(1, top, 4001), np.arange(1, top + 1))
    y = c(grid)
    assert np.all(np.isfinite(y))
    assert np.all(np.diff(y) >= -1e-12 * max(1.0, float(y.max())))
    np.testing.assert_allclose(c(np.array([p[0] for p in points])), [p[1] for p in points])


# ---------------------------------------------------------------- affine_times


def test_affine_without_tile_is_the_affine_form():
    b = np.arange(0, 100)
    out = affine_times(b, overhead_s=0.004, rate=2000.0, knee=32)
    np.testing.assert_allclose(out, 0.004 + np.maximum(b, 32) / 2000.0, rtol=1e-15)
    assert out.dtype == np.float64


def test_tile_staircase():
    rate = 1000.0
    t = affine_times(np.arange(1, 18), overhead_s=0.002, rate=rate, knee=0, tile=8)
    np.testing.assert_allclose(t[:8], 0.002 + 8 / rate, rtol=1e-15)  # b = 1..8
    assert t[8] - t[7] == pytest.approx(8 / rate, rel=1e-12)  # b = 9 jumps by a tile
    np.testing.assert_allclose(t[8:16], 0.002 + 16 / rate, rtol=1e-15)  # b = 9..16
    assert t[16] == pytest.approx(0.002 + 24 / rate, rel=1e-12)


def test_tile_applies_after_the_knee():
    t = affine_times(np.array([1, 10, 16, 17]), overhead_s=0.0, rate=1.0, knee=10, tile=8)
    np.testing.assert_array_equal(t, [16.0, 16.0, 16.0, 24.0])


def test_tile_one_or_nonpositive_is_no_tile():
    b = np.arange(1, 50)
    plain = affine_times(b, overhead_s=0.001, rate=500.0, knee=4)
    for tile in (None, 1, 0, -3):
        np.testing.assert_array_equal(
            affine_times(b, overhead_s=0.001, rate=500.0, knee=4, tile=tile), plain
        )


def test_tile_array_per_rank_broadcasts():
    overhead = np.array([0.001, 0.002, 0.003])
    rate = np.array([1000.0, 2000.0, 500.0])
    knee = np.array([0, 4, 0])
    tile = np.array([8, 0, 4])
    b = np.arange(1, 21)[:, None]  # (20, 1) against per-rank (3,)
    out = affine_times(b, overhead_s=overhead, rate=rate, knee=knee, tile=tile)
    assert out.shape == (20, 3)
    for r in range(3):
        one = affine_times(
            b[:, 0],
            overhead_s=overhead[r],
            rate=rate[r],
            knee=knee[r],
            tile=int(tile[r]) if tile[r] > 0 else None,
        )
        np.testing.assert_array_equal(out[:, r], one)
    # rank 1 has no tile: strictly affine above its knee
    np.testing.assert_allclose(out[:, 1], 0.002 + np.maximum(np.arange(1, 21), 4) / 2000.0)
    # a plan (one b per rank) gives one time per rank
    plan = affine_times(np.array([9, 9, 9]), overhead_s=overhead, rate=rate, knee=knee, tile=tile)
    np.testing.assert_allclose(plan, [0.001 + 16 / 1000, 0.002 + 9 / 2000, 0.003 + 12 / 500])


# ---------------------------------------------------------------- memory wall


def test_memory_wall_is_one_up_to_start():
    b = np.arange(0, 81)
    np.testing.assert_array_equal(memory_wall_factor(b, mem_cap=100), 1.0)
    np.testing.assert_array_equal(memory_wall_factor(np.arange(0, 31), mem_cap=60, start=0.5), 1.0)
    assert memory_wall_factor(81, mem_cap=100) > 1.0


def test_memory_wall_reaches_factor_at_cap():
    assert float(memory_wall_factor(100, mem_cap=100)) == pytest.approx(2.0, rel=1e-12)
    assert float(memory_wall_factor(512, mem_cap=512, start=0.5, factor=3.5)) == pytest.approx(
        3.5, rel=1e-12
    )
    assert float(memory_wall_factor(512, mem_cap=512, factor=1.0)) == 1.0


def test_memory_wall_grows_faster_than_linear():
    f = memory_wall_factor(np.arange(80, 101), mem_cap=100, start=0.8, factor=2.0)
    d1 = np.diff(f)
    assert np.all(d1 > 0)
    assert np.all(np.diff(d1) > 0)  # increments grow: faster than linear
    # a quadratic in (b - 80): f(90) is a quarter of the way, not half
    assert f[10] == pytest.approx(1.25, rel=1e-12)


def test_memory_wall_broadcasts_per_rank():
    cap = np.array([100, 200, 50])
    b = np.array([[80, 160, 40], [100, 200, 50], [90, 180, 45]])
    f = memory_wall_factor(b, mem_cap=cap, start=0.8, factor=np.array([2.0, 3.0, 5.0]))
    assert f.shape == (3, 3) and f.dtype == np.float64
    np.testing.assert_allclose(f[0], 1.0)
    np.testing.assert_allclose(f[1], [2.0, 3.0, 5.0])
    np.testing.assert_allclose(f[2], [1.25, 1.5, 2.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mem_cap": 0}, "mem_cap"),
        ({"mem_cap": 0.5}, "mem_cap"),
        ({"mem_cap": np.array([100, 0])}, "mem_cap"),
        ({"mem_cap": 100, "start": 0.0}, "start"),
        ({"mem_cap": 100, "start": 1.0}, "start"),
        ({"mem_cap": 100, "start": -0.2}, "start"),
        ({"mem_cap": 100, "start": math.nan}, "start"),
        ({"mem_cap": 100, "factor": 0.5}, "factor"),
        ({"mem_cap": 100, "factor": np.array([2.0, 0.9])}, "factor"),
    ],
)
def test_memory_wall_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory_wall_factor(np.arange(10), **kwargs)


def test_wave_adds_a_coarser_staircase():
    # 30% of the work in waves of 64 samples on top of an 8-sample tile
    b = np.array([8, 9, 64, 65, 72, 128, 129])
    t = affine_times(b, overhead_s=0.0, rate=1.0, knee=0, tile=8, wave=64, wave_share=0.3)
    tiled = np.ceil(b / 8) * 8
    waves = np.ceil(b / 64) * 64
    np.testing.assert_allclose(t, 0.7 * tiled + 0.3 * waves)
    assert t[3] - t[2] == pytest.approx(0.7 * 8 + 0.3 * 64)  # the jump into a second wave
    assert t[4] == pytest.approx(t[3])  # flat inside the tile and the wave


def test_no_wave_or_zero_share_is_the_tile_staircase():
    b = np.arange(1, 200)
    plain = affine_times(b, overhead_s=0.001, rate=500.0, knee=4, tile=8)
    for wave, share in ((None, 0.5), (0, 0.5), (64, 0.0)):
        np.testing.assert_allclose(
            affine_times(
                b, overhead_s=0.001, rate=500.0, knee=4, tile=8, wave=wave, wave_share=share
            ),
            plain,
        )
