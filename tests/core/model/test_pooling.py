"""Partial pooling by device group: one solve per group equals the per-rank formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rex.core.model.pooling import pooled_posterior, solve


def _dense(phi, y, prec, m0, p0, group, min_group):  # type: ignore[no-untyped-def]
    """The pooled posterior written rank by rank (every rank solves its group's sums)."""
    n, d = m0.shape
    mu = torch.zeros(n, d, dtype=torch.float64)
    cov = torch.zeros(n, d, d, dtype=torch.float64)
    gram = phi.transpose(-1, -2) @ (prec.unsqueeze(-1) * phi)
    data = (phi * (prec * y).unsqueeze(-1)).sum(-2)
    prior = torch.diag_embed(1.0 / p0)
    rhs = m0 / p0
    levels, se2s, curves = {}, {}, {}
    for r in range(n):
        members = np.flatnonzero(group == group[r])
        if len(members) < min_group:
            m, c = solve(prior[r : r + 1], rhs[r : r + 1], gram[r : r + 1], data[r : r + 1])
            mu[r], cov[r] = m[0], c[0]
            continue
        m, c = solve(
            prior[r : r + 1],
            rhs[r : r + 1],
            gram[members].sum(0, keepdim=True),
            data[members].sum(0, keepdim=True),
        )
        curves[r] = (m[0], c[0])
        fit = (phi[r] * m[0]).sum(-1).clamp_min(1e-12)
        w = prec[r] * y[r] * y[r]
        se2s[r] = float(1.0 / w.sum())
        levels[r] = float((w * torch.log(y[r] / fit)).sum()) * se2s[r]
    for r, (m, c) in curves.items():
        members = np.flatnonzero(group == group[r])
        lv = np.array([levels[k] for k in members])
        tau2 = max(lv.var(ddof=1) - np.mean([se2s[k] for k in members]), 0.0)
        f = np.exp(lv.mean() + (levels[r] - lv.mean()) * tau2 / (tau2 + se2s[r]))
        mu[r], cov[r] = m * f, c * f * f
    return mu, cov


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_posterior_matches_the_rank_by_rank_formula(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # groups of 6 and 4 (pooled), of 2 and 1 (not), and a pooled group whose members hold
    # two priors (each solves the group's sums under its own)
    group = np.array([0] * 6 + [6] * 4 + [10, 10, 12] + [13] * 5)
    n, w, d = len(group), 7, 5
    phi = torch.as_tensor(rng.uniform(0.1, 2.0, (n, w, d)))
    y = torch.as_tensor(rng.uniform(0.5, 2.0, (n, w)))
    prec = torch.as_tensor(rng.uniform(1.0, 50.0, (n, w)))
    m0 = torch.as_tensor(np.tile(rng.normal(0, 1, d), (n, 1)))
    p0 = torch.ones(n, d, dtype=torch.float64)
    p0[13:15] = 2.0  # two of the last group's five members hold a wider prior
    mu, cov = pooled_posterior(phi, y, prec, m0, p0, group, 4)
    ref_mu, ref_cov = _dense(phi, y, prec, m0, p0, group, 4)
    torch.testing.assert_close(mu, ref_mu, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cov, ref_cov, rtol=1e-10, atol=1e-12)


def test_no_pooled_group_solves_each_rank_alone() -> None:
    rng = np.random.default_rng(3)
    n, w, d = 5, 4, 3
    phi = torch.as_tensor(rng.uniform(0.1, 2.0, (n, w, d)))
    y = torch.as_tensor(rng.uniform(0.5, 2.0, (n, w)))
    prec = torch.ones(n, w, dtype=torch.float64)
    m0, p0 = torch.zeros(n, d, dtype=torch.float64), torch.ones(n, d, dtype=torch.float64)
    mu, cov = pooled_posterior(phi, y, prec, m0, p0, np.arange(n), 4)
    ref_mu, ref_cov = _dense(phi, y, prec, m0, p0, np.arange(n), 4)
    torch.testing.assert_close(mu, ref_mu)
    torch.testing.assert_close(cov, ref_cov)
