import json

import numpy as np
import torch

from lightning_rex.core.kernels import SplineKernel
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


def test_closed_form_equals_gp_posterior():
    """With the affine part pinned, the batched regression is exactly the spline-kernel GP."""
    m = RankTimeModel(2, 100, 99, overhead_prior_sd=1e-9, slope_prior_sd=1e-9, memory=1e9)
    rng = np.random.default_rng(1)
    plans = [(50, 50), (30, 70), (70, 30), (40, 60)]
    for p in plans:
        m.add(p, np.array([0.01, 0.02]) * (1 + rng.normal(0, 0.05, 2)), 1e-3)
    grid = np.arange(1, 100)
    mean, sd = m.predict_grid(grid, var_points=99)
    s2 = m.outputscale
    k = SplineKernel(m.kernel.num_basis)
    for r in range(2):
        b = torch.tensor([p[r] for p in plans], dtype=torch.float64)
        y = torch.tensor([row[r] for row in m.medians], dtype=torch.float64) / m.scale[r]
        prior = b / m.b_ref / m.first_u[r]
        kxx = s2 * k(b.unsqueeze(-1) / 99).to_dense() + 1e-3 * torch.eye(4, dtype=torch.float64)
        g = torch.tensor(grid, dtype=torch.float64)
        ksx = s2 * k(g.unsqueeze(-1) / 99, b.unsqueeze(-1) / 99).to_dense()
        post = g / m.b_ref / m.first_u[r] + ksx @ torch.linalg.solve(kxx, y - prior)
        var = s2 - (ksx * torch.linalg.solve(kxx, ksx.T).T).sum(-1)
        np.testing.assert_allclose(mean[r] / m.scale[r], post.numpy(), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(
            sd[r] / m.scale[r], var.clamp_min(0).sqrt().numpy(), rtol=1e-4, atol=1e-7
        )


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
