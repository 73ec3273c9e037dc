import numpy as np
import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.kernels import ConstantKernel, LinearKernel, ScaleKernel
from gpytorch.means import LinearMean

from lightning_rex.core.model.kernels import SplineKernel
from lightning_rex.core.model.posterior import optimistic_quantile
from lightning_rex.core.model.time_model import RankTimeModel


def fitted_model():
    m = RankTimeModel(3, 192, 190, memory=5.0)
    rng = np.random.default_rng(1)
    plans = [(64, 64, 64), (40, 70, 82), (90, 50, 52), (30, 100, 62), (70, 60, 62)]
    rates = np.array([900.0, 1500.0, 2000.0])
    for p in plans:
        b = np.asarray(p, dtype=float)
        knee = np.where(b < 48, 48.0, b)  # under-filled below 48 samples: non-affine
        m.add(p, (0.004 + knee / rates) * np.exp(rng.normal(0, 0.03, 3)), 2e-3)
    m.outputscale = 0.05**2
    return m


def botorch_exact_gp(m, r):
    """BoTorch's SingleTaskGP with the same kernel, prior mean, noise and data as rank r."""
    b, y, v = m._data()
    c0 = 1.0 / m.first_u[r]
    k = m.kernel
    covar = (
        ConstantKernel()
        + LinearKernel()
        + ScaleKernel(SplineKernel(k.num_basis, k.lower, k.upper, log_scale=True))
    )
    covar.kernels[0].constant = torch.tensor(m.overhead_prior_sd**2, dtype=torch.float64)
    covar.kernels[1].variance = torch.tensor((m.slope_prior_sd * c0 / m.b_ref) ** 2)
    covar.kernels[2].outputscale = torch.tensor(m.outputscale)
    mean = LinearMean(1)
    mean.weights.data.fill_(c0 / m.b_ref)
    mean.bias.data.fill_(0.0)
    gp = SingleTaskGP(
        b[r].unsqueeze(-1),
        y[r].unsqueeze(-1),
        train_Yvar=v[r].unsqueeze(-1),
        covar_module=covar,
        mean_module=mean,
        outcome_transform=None,
    ).to(torch.float64)
    gp.eval()
    return gp


def test_posterior_equals_botorch_exact_gp():
    """The closed form inside SplineAffineModel is the exact GP: the mean agrees with
    SingleTaskGP's to 1e-6 relative and the variance to 1e-6 relative or 1e-9 absolute,
    on sizes 1 to 190."""
    m = fitted_model()
    model = m.posterior_model()
    grid = torch.arange(1, 191, dtype=torch.float64).unsqueeze(-1)
    post = model.posterior(grid)
    assert isinstance(post, GPyTorchPosterior)
    assert post.mean.shape == (3, 190, 1)
    for r in range(3):
        gp = botorch_exact_gp(m, r)
        with torch.no_grad():
            ref = gp.posterior(grid)
        ours_mean = post.mean[r, :, 0].detach() / m.scale[r]
        ours_var = post.variance[r, :, 0].detach() / m.scale[r] ** 2
        np.testing.assert_allclose(ours_mean.numpy(), ref.mean[:, 0].numpy(), rtol=1e-6)
        # the smallest variances differ by ~1e-9 absolute (GPyTorch's solves)
        np.testing.assert_allclose(
            ours_var.numpy(), ref.variance[:, 0].numpy(), rtol=1e-6, atol=1e-9
        )


def test_quantile_is_botorchs_and_grid_prediction_reads_the_posterior():
    m = fitted_model()
    post = m.posterior_model().posterior(torch.arange(1.0, 191.0).unsqueeze(-1))
    q = optimistic_quantile(post, 1.5)
    sd = post.variance.squeeze(-1).sqrt()
    np.testing.assert_allclose(q.numpy(), (post.mean.squeeze(-1) - 1.5 * sd).numpy(), rtol=1e-9)
    assert torch.equal(optimistic_quantile(post, 0.0), post.mean.squeeze(-1))
    mean, quant = m.predict_grid(np.arange(1, 191), kappa=1.5, var_points=190)
    # the planner reads the mixture of the tiles' BoTorch posteriors, by each rank's weights
    want_mean, want_q = np.zeros_like(mean), np.zeros_like(quant)
    mixture = m.mixture()
    np.testing.assert_allclose(sum(w for _, w in mixture), 1.0, rtol=1e-12)
    for model, w in mixture:
        p = model.posterior(torch.arange(1.0, 191.0).unsqueeze(-1))
        want_mean += w[:, None] * p.mean.squeeze(-1).numpy()
        want_q += w[:, None] * optimistic_quantile(p, 1.5).numpy()
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12)
    np.testing.assert_allclose(quant, want_q, rtol=1e-9)
    np.testing.assert_allclose(m.predict((64, 64, 64)), mean[:, 63], rtol=1e-12)
    # a smooth curve: no tile is the most probable, and it carries almost all the weight
    assert (m.tile == 1).all() and (m.tile_weights[:, 0] > 0.9).all()


def test_posterior_model_refuses_what_it_does_not_model():
    model = fitted_model().posterior_model()
    x = torch.ones(2, 1)
    with pytest.raises(NotImplementedError):
        model.posterior(x, observation_noise=True)
    with pytest.raises(NotImplementedError):
        model.posterior(x, output_indices=[1])
    assert model.num_outputs == 1 and model.batch_shape == torch.Size([3])
    with pytest.raises(RuntimeError, match="no observations"):
        RankTimeModel(2, 10, 9).posterior_model()


@pytest.mark.parametrize("per_rank", [False, True])
def test_marginal_posterior_has_the_posteriors_mean_and_variances(per_rank: bool) -> None:
    model = fitted_model().posterior_model()
    x = torch.arange(1.0, 191.0, 7.0).unsqueeze(-1)
    if per_rank:  # each rank at its own sizes
        x = torch.stack([x, x + 1.0, x * 2.0])
    full, marginal = model.posterior(x), model.marginal_posterior(x)
    torch.testing.assert_close(marginal.mean, full.mean, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(marginal.variance, full.variance, rtol=1e-9, atol=1e-15)
    q = torch.tensor(0.1, dtype=torch.float64)
    torch.testing.assert_close(marginal.quantile(q), full.quantile(q), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("per_rank", [False, True])
def test_a_size_known_exactly_reads_gpytorchs_floor_without_a_warning(per_rank: bool) -> None:
    """A rank with (next to) no posterior variance: the quantile sees GPyTorch's floor."""
    import warnings

    from gpytorch.settings import min_variance

    model = fitted_model().posterior_model()
    model.weights_root = model.weights_root * 1e-9  # a rank measured ever so often
    model._cov = None
    x = torch.arange(1.0, 191.0, 7.0).unsqueeze(-1)
    if per_rank:
        x = torch.stack([x, x + 1.0, x * 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # GPyTorch's NumericalWarning
        post = model.marginal_posterior(x)
        q = optimistic_quantile(post, 2.0)
    floor = min_variance.value(torch.float64)
    torch.testing.assert_close(post.variance, torch.full_like(post.variance, floor))
    torch.testing.assert_close(q, post.mean.squeeze(-1) - 2.0 * floor**0.5)
