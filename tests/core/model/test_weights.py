"""The weight posterior's pure parts: units, regression data, prior and the per-tile solve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rex.core.model.pooling import device_groups, leave_groups
from lightning_rex.core.model.tiles import HYPOTHESES, PADS
from lightning_rex.core.model.weights import (
    first_units,
    tile_posteriors,
    weight_prior,
    window_data,
)


def test_a_pooled_group_shares_one_unit_and_a_small_one_keeps_its_own() -> None:
    group = device_groups(["a"] * 4 + ["b", "b"], 6)
    times = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 7.0])
    sizes = np.array([8.0, 8.0, 16.0, 16.0, 8.0, 8.0])
    scale, first_u = first_units(sizes, times, group, 8.0, 4)
    np.testing.assert_allclose(scale, [2.5, 2.5, 2.5, 2.5, 5.0, 7.0])  # group a: its median
    np.testing.assert_allclose(first_u, [1.5, 1.5, 1.5, 1.5, 1.0, 1.0])
    assert scale is not times  # the caller's medians are not written through


def test_window_data_decays_old_windows_and_drops_those_before_a_change_point() -> None:
    sizes = np.full((2, 3), 4.0)
    medians = np.array([[1.0, 1.0, 2.0], [3.0, 3.0, 3.0]])
    scale = np.array([1.0, 3.0])
    rel_var = [1e-4, 1e-4, 1e-4]
    cutoff = np.array([0, 12])  # rank 1 changed at window 12: windows 10 and 11 no longer count
    _, rel, kept = window_data(sizes, medians, rel_var, scale, 10, cutoff, None)
    _, _, decayed = window_data(sizes, medians, rel_var, scale, 10, cutoff, 2.0)
    np.testing.assert_allclose(rel.numpy(), [[1.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    # relative noise: a window twice as slow has twice the noise in these units
    assert kept[0, 2] == pytest.approx(4 * kept[0, 0])
    np.testing.assert_allclose(kept[1, :2].numpy(), 1e8 * 1e-4)
    np.testing.assert_allclose((decayed / kept)[0].numpy(), np.exp(np.array([2.0, 1.0, 0.0]) / 2.0))


def test_the_prior_is_proportional_through_the_first_window() -> None:
    mean, var = weight_prior(np.array([0.5, 2.0]), 3, 0.3, 0.5, 0.01)
    assert mean.shape == var.shape == (2, PADS.stop + 3)
    np.testing.assert_allclose(mean[:, 1].numpy(), [2.0, 0.5])  # slope 1 / u: t(u) = u / u0
    assert float(mean[:, 0].abs().max()) == 0.0 and float(mean[:, PADS.stop :].abs().max()) == 0
    np.testing.assert_allclose(var[:, 0].numpy(), 0.09)
    np.testing.assert_allclose(var[:, 1].numpy(), [1.0, 0.0625])
    np.testing.assert_allclose(var[:, PADS.stop :].numpy(), 0.01)


def test_each_rank_takes_the_posterior_of_its_most_probable_tile() -> None:
    rng = np.random.default_rng(0)
    n_ranks, n_windows, n_basis = 3, 6, 2
    sizes = torch.as_tensor(rng.integers(4, 40, (n_ranks, n_windows)).astype(float))
    phi = torch.zeros(n_ranks, n_windows, PADS.stop + n_basis, dtype=torch.float64)
    phi[..., 0], phi[..., 1] = 1.0, sizes / 16.0
    times = 0.1 + sizes / 16.0
    prec = torch.full((n_ranks, n_windows), 1e4, dtype=torch.float64)
    prior = weight_prior(np.full(n_ranks, 1.0), n_basis, 0.3, 0.5, 1e-4)
    tile = HYPOTHESES.index((8, 1))
    weights = np.zeros((n_ranks, len(HYPOTHESES)))
    weights[:, 0] = [1.0, 0.3, 0.0]
    weights[:, tile] = [0.0, 0.7, 1.0]
    group = device_groups(None, n_ranks)
    posteriors, (mean, cov) = tile_posteriors(
        phi, sizes, times, prec, prior, weights, group, 16.0, 4
    )
    assert sorted(posteriors) == [(1, 1), (8, 1)]
    torch.testing.assert_close(mean[0], posteriors[(1, 1)][0][0])
    torch.testing.assert_close(mean[1:], posteriors[(8, 1)][0][1:])
    torch.testing.assert_close(cov[2], posteriors[(8, 1)][1][2])


def test_ranks_that_leave_their_groups_hand_the_lead_on() -> None:
    group = device_groups(["a", "a", "a", None, "b"], 5)
    np.testing.assert_array_equal(group, [0, 0, 0, 3, 4])
    leave_groups(group, [0])
    np.testing.assert_array_equal(group, [0, 1, 1, 3, 4])
    with pytest.raises(ValueError, match="groups must have 5 labels"):
        device_groups(["a"], 5)
