import gpytorch
import torch

from lightning_rex.core.model.kernels import SplineKernel, bspline_basis

X = torch.linspace(0, 1, 41, dtype=torch.float64).unsqueeze(-1)


def test_raw_basis_is_partition_of_unity_with_uneven_variance():
    phi = bspline_basis(X.squeeze(-1), 10)
    torch.testing.assert_close(phi.sum(-1), torch.ones(41, dtype=torch.float64))
    var = (phi * phi).sum(-1)
    assert var[0] > 0.99 and var[-1] > 0.99 and var[1:-1].min() < 0.5


def test_normalized_prior_variance_is_flat():
    k = SplineKernel(8)
    torch.testing.assert_close(k(X, diag=True), torch.ones(41, dtype=torch.float64))
    torch.testing.assert_close(k(X).to_dense().diagonal(), torch.ones(41, dtype=torch.float64))


def test_psd():
    k = gpytorch.kernels.ScaleKernel(SplineKernel(12))
    x = torch.rand(60, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eig = torch.linalg.eigvalsh(k(x).to_dense())
    assert eig.min() > -1e-10
    assert (eig > 1e-8).sum() <= 12  # finite rank


def test_gradients_flow_to_inputs():
    k = SplineKernel(10)
    x = torch.tensor([[0.13], [0.5], [0.77]], dtype=torch.float64, requires_grad=True)
    out = k(x, X).to_dense().sum()
    out.backward()
    assert x.grad is not None
    assert torch.isfinite(x.grad).all() and (x.grad.abs() > 0).all()


def test_batched_inputs_and_validation():
    k = SplineKernel(6, batch_shape=torch.Size([3]))
    xb = torch.rand(3, 5, 1, dtype=torch.float64)
    assert k(xb).to_dense().shape == (3, 5, 5)
    for bad in ({"num_basis": 3}, {"lower": 1.0, "upper": 0.0}):
        try:
            SplineKernel(**bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_feature_cache_never_serves_stale_values():
    k = SplineKernel(8)
    a = torch.linspace(0, 1, 7, dtype=torch.float64).unsqueeze(-1)
    fa = k.features(a)
    assert k.features(a) is fa
    a.mul_(0.5)  # in-place change bumps the version
    torch.testing.assert_close(k.features(a), SplineKernel(8).features(a))
    b = torch.linspace(0.2, 0.9, 7, dtype=torch.float64).unsqueeze(-1)
    torch.testing.assert_close(k.features(b), SplineKernel(8).features(b))
