import json

import numpy as np

from lightning_rex.core.model import RankTimeModel


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
