import json

import numpy as np
import pytest

from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.saved import StateError


def affine(b, a, rate):
    return a + np.asarray(b, dtype=float) / rate


def test_cold_start_one_observation_per_rank():
    m = RankTimeModel(4, 256, 253)
    med = np.array([0.02, 0.04, 0.03, 0.05])
    m.add((64, 64, 64, 64), med, 1e-4)
    np.testing.assert_allclose(m.predict((64, 64, 64, 64)), med, rtol=0.02)
    mean, sd = m.predict_grid(np.arange(1, 254))
    assert mean.shape == sd.shape == (4, 253)
    assert np.all(np.diff(mean[:, 10:200], axis=1) > 0)  # prior slope is positive
    assert sd[:, 200].min() > sd[:, 63].max()  # uncertain away from the data


def test_recovers_affine_curves_and_tightens():
    rates = np.array([1000.0, 2000.0, 3000.0])
    a = np.array([0.004, 0.006, 0.002])
    m = RankTimeModel(3, 300, 298)
    rng = np.random.default_rng(0)
    plans = [(100, 100, 100), (60, 120, 120), (50, 90, 160), (80, 110, 110)]
    sds = []
    for p in plans * 3:
        m.add(p, affine(p, a, rates) * np.exp(rng.normal(0, 0.005, 3)), 0.005**2)
        sds.append(m.predict_grid(np.arange(1, 299))[1][:, 150].mean())
    s = m.summary()
    np.testing.assert_allclose(s["rate"], rates, rtol=0.1)
    np.testing.assert_allclose(m.predict((70, 90, 140)), affine((70, 90, 140), a, rates), rtol=0.02)
    assert sds[-1] < sds[0]


def test_fit_hyperparameters_with_botorch_and_state_round_trip():
    m = RankTimeModel(6, 600, 595, seed=3)
    rng = np.random.default_rng(2)
    rates = rng.uniform(500, 3000, 6)
    for _ in range(5):
        p = tuple(int(x) for x in np.round(rng.dirichlet(np.ones(6)) * 500 + 16))
        m.add(p, (0.003 + np.maximum(p, 40) / rates) * np.exp(rng.normal(0, 0.02, 6)), 4e-4)
    s = m.fit_hyperparameters()
    assert 1e-6 <= s <= 0.25
    assert m.n_fits == 1
    d = json.loads(json.dumps(m.state_dict()))
    m2 = RankTimeModel(6, 600, 595, seed=3)
    m2.load_state_dict(d)
    g = np.arange(1, 596)
    for a, b in zip(m.predict_grid(g), m2.predict_grid(g)):
        np.testing.assert_array_equal(a, b)


def test_forget_relearns_a_changed_rank():
    m = RankTimeModel(2, 200, 199)
    for p in [(100, 100), (80, 120), (120, 80)] * 3:
        m.add(p, affine(p, 0.002, np.array([2000.0, 2000.0])), 1e-6)
    p = (100, 100)
    slowed = affine(p, 0.002, np.array([2000.0, 2000.0])) * np.array([1.0, 1.5])
    m.add(p, slowed, 1e-6)
    before = m.predict(p)[1]
    m.forget([1], keep_last=1)
    after = m.predict(p)[1]
    assert abs(after - slowed[1]) < 0.2 * abs(before - slowed[1])


def test_scales_to_4096_ranks():
    n, b = 4096, 4096 * 64
    m = RankTimeModel(n, b, 640)
    rng = np.random.default_rng(0)
    rates = rng.uniform(400, 2600, n)
    for k in range(6):
        p = np.full(n, 64) + (k % 3 - 1) * 8
        m.add(tuple(p), 0.005 + p / rates, 1e-4)
    # its speed is a benchmark: simulate --scenario mixed-4096 reports decision latency
    mean, sd = m.predict_grid(np.arange(1, 641))
    assert mean.shape == (n, 640) and np.isfinite(sd).all()


def curve_model(curve, sizes, n=2, reps=3, seed=0):
    """A model fitted on windows where every rank runs ``curve`` at each of ``sizes``."""
    m = RankTimeModel(n, 64 * n, 64 * n - n + 1, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(reps):
        for b in sizes:
            plan = (int(b),) + (64 * n - int(b),) * (n > 1)
            if n > 2:
                plan = (int(b),) * (n - 1) + (64 * n - int(b) * (n - 1),)
            med = np.array([curve(p) for p in plan]) * np.exp(rng.normal(0, 0.01, n))
            m.add(plan, med, 1e-4)
    m.fit_hyperparameters()
    return m


def test_spline_recovers_a_knee():
    """An under-filled GPU: flat below 24 samples, affine above. An affine fit would put the
    time at 8 samples far below the truth; with the fitted spline residual the posterior mean
    stays within 10% of it over the sizes measured, and the knee (the hinge that best fits the
    posterior mean) lies within one knot ratio of 24 (1.53x: 16 basis functions over
    b_ref/16..16 b_ref, clipped here to 4..127)."""
    true = lambda b: 0.004 + 0.0005 * max(b, 24)  # noqa: E731
    sizes = [8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96]
    m = curve_model(true, sizes, n=2)
    assert m.outputscale > 1e-4  # the residual acts: well above its 1e-6 floor
    grid = np.arange(8, 97)  # the sizes measured
    mean, _ = m.predict_grid(grid)
    rel = mean[0] / np.array([true(b) for b in grid])
    assert np.abs(rel - 1).max() < 0.10

    # the knee of the posterior mean: the c whose hinge a + s * max(b, c) fits it best
    def misfit(c):
        x = np.stack([np.ones_like(grid), np.maximum(grid, c)], axis=1).astype(float)
        coef = np.linalg.lstsq(x, mean[0], rcond=None)[0]
        return float(np.sum((x @ coef - mean[0]) ** 2))

    knee = min(range(8, 80), key=misfit)
    assert 24 / 1.53 <= knee <= 24 * 1.53


def test_spline_recovers_a_staircase_edge():
    """A tile edge: time jumps 30% past 64 samples. A cubic spline cannot jump; it places
    the rise within one knot ratio (1.53x) of the edge, and is within 8% of the truth at
    sizes at least one knot interval away from it."""
    true = lambda b: 0.01 * (1.3 if b > 64 else 1.0) + 0.0001 * b  # noqa: E731
    sizes = [16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128]
    m = curve_model(true, sizes, n=2)
    assert m.outputscale > 1e-4
    grid = np.arange(16, 129)
    mean, _ = m.predict_grid(grid)
    slope = np.gradient(mean[0], grid)
    edge = grid[np.argmax(slope)]
    assert 64 / 1.53 <= edge <= 64 * 1.53
    far = (grid <= 64 / 1.53) | (grid >= 64 * 1.53)
    rel = mean[0] / np.array([true(b) for b in grid])
    assert np.abs(rel[far] - 1).max() < 0.08


def test_device_groups_pool_evidence_and_a_changed_rank_leaves():
    """64 ranks of two device types: pooled, identical ranks' predictions stay within 5% of
    each other, and the worst rank's error is several times smaller than with one curve per
    rank; a rank that is truly different keeps its own speed (partial pooling)."""
    n, rng = 64, np.random.default_rng(4)
    kind = np.arange(n) % 2
    rate = np.where(kind == 0, 3000.0, 1000.0)
    labels = ["A100" if k == 0 else "T4" for k in kind]
    errs = {}
    for groups in (None, labels):
        m = RankTimeModel(n, 64 * n, 64 * n - n + 1, groups=groups)
        for plan in ([64] * n, list(np.where(kind == 0, 96, 32))):
            for _ in range(3):
                med = (0.002 + np.asarray(plan) / rate) * np.exp(rng.normal(0, 0.05, n))
                m.add(tuple(int(b) for b in plan), med, 0.05**2)
        pred = m.predict(tuple([80] * n))
        errs[groups is None] = np.abs(pred / (0.002 + 80 / rate) - 1).max()
        if groups is not None:
            for k in (0, 1):  # partial pooling: identical ranks follow their group
                assert np.ptp(pred[kind == k]) / pred[kind == k].mean() < 0.05
            m.forget([2], keep_last=1)
            assert m.group[2] == 2 and m.group[4] == 0
            d = json.loads(json.dumps(m.state_dict()))
            m2 = RankTimeModel(n, 64 * n, 64 * n - n + 1, groups=groups)
            m2.load_state_dict(d)
            assert list(m2.group) == list(m.group)
    assert errs[False] * 3 < errs[True]
    with pytest.raises(ValueError, match="groups must have"):
        RankTimeModel(4, 64, 61, groups=["a"])


def test_partial_pooling_keeps_a_truly_different_member():
    """Unit-to-unit spread: one of 16 same-label ranks is 10% faster. Its group widens its
    prior by the members' spread, so its own windows move it to within 3% of its speed."""
    n, rng = 16, np.random.default_rng(9)
    rate = np.full(n, 2000.0)
    rate[0] *= 1.1
    m = RankTimeModel(n, 64 * n, 64 * n - n + 1, groups=["V100"] * n)
    for plan in ([64] * n, [72] * 8 + [56] * 8):
        for _ in range(6):
            med = (0.003 + np.asarray(plan) / rate) * np.exp(rng.normal(0, 0.02, n))
            m.add(tuple(plan), med, 0.02**2)
    pred = m.predict(tuple([64] * n))
    truth = 0.003 + 64 / rate
    assert abs(pred[0] / truth[0] - 1) < 0.03
    assert np.abs(pred[1:] / truth[1:] - 1).max() < 0.03


def test_forget_detaches_a_group_leader_and_keeps_the_rest_together():
    m = RankTimeModel(6, 384, 379, groups=["a"] * 6)
    m.add((64,) * 6, np.full(6, 0.03), 1e-4)
    m.forget([0], keep_last=1)
    assert list(m.group) == [0, 1, 1, 1, 1, 1]
    m.forget([1, 3], keep_last=1)
    assert list(m.group) == [0, 1, 2, 3, 2, 2]
    d = m.state_dict()
    d["group"] = [1, 0, 2, 3, 2, 2]
    with pytest.raises(StateError, match="group"):
        m.load_state_dict(d)
