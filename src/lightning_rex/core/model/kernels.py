"""``SplineKernel``: a finite-rank GPyTorch kernel on normalized cubic B-spline features.

``k(x, x') = phi(x)^T phi(x')`` where ``phi`` is the vector of ``num_basis`` clamped cubic
B-splines on ``[lower, upper]`` (uniform interior knots), divided by its Euclidean norm.
Raw clamped B-splines have ``phi(x)^T phi(x) = 1`` at the domain ends but about 0.45 inside,
which makes the prior variance largest at the boundary and drives acquisitions there; after
normalization ``k(x, x) = 1`` everywhere. Wrap it in :class:`gpytorch.kernels.ScaleKernel`
for a learned scale (the ``W = s^2 I`` of ``phi^T W phi``).

With ``log_scale=True`` the B-splines live on ``log x`` over ``[log lower, log upper]``: the
knots are spaced by a constant *ratio* of batch sizes, so a knee at 24 samples and a memory
wall at 240 get the same resolution.

The features are differentiable in ``x`` (Cox-de Boor recursion in torch), so acquisition
functions can be optimised by gradient. :meth:`SplineKernel.features` is public because the
rank time model uses the same feature map for closed-form Bayesian linear regression.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch

__all__ = ["SplineKernel", "bspline_basis"]


def bspline_basis(
    x: torch.Tensor, num_basis: int, lower: float = 0.0, upper: float = 1.0
) -> torch.Tensor:
    """Clamped cubic B-spline basis (not normalized), differentiable in ``x``.

    Args:
        x: Points, any shape; values are clamped to ``[lower, upper]``.
        num_basis: Number of basis functions (>= 4).
        lower: Left end of the domain.
        upper: Right end of the domain.

    Returns:
        Shape ``x.shape + (num_basis,)``; rows are non-negative and sum to 1.

    Raises:
        ValueError: If ``num_basis < 4`` or ``upper <= lower``.
    """
    if num_basis < 4:
        raise ValueError(f"num_basis must be >= 4 for cubic splines, got {num_basis}")
    if not upper > lower:
        raise ValueError(f"upper ({upper}) must be greater than lower ({lower})")
    degree = 3
    n_inner = num_basis - degree + 1
    inner = torch.linspace(lower, upper, n_inner, dtype=x.dtype, device=x.device)
    knots = torch.cat([inner[:1].repeat(degree), inner, inner[-1:].repeat(degree)])
    span = upper - lower
    x_clamped = x.clamp(lower, upper - 1e-9 * span).unsqueeze(-1)
    left, right = knots[:-1], knots[1:]
    basis = ((x_clamped >= left) & (x_clamped < right)).to(x.dtype)
    for order in range(1, degree + 1):
        t_i, t_ip = knots[: -(order + 1)], knots[order:-1]
        t_i1, t_ip1 = knots[1:-order], knots[order + 1 :]
        den_left = t_ip - t_i
        den_right = t_ip1 - t_i1
        w_left = torch.where(
            den_left > 0, (x_clamped - t_i) / torch.where(den_left > 0, den_left, 1.0), 0.0
        )
        w_right = torch.where(
            den_right > 0, (t_ip1 - x_clamped) / torch.where(den_right > 0, den_right, 1.0), 0.0
        )
        basis = w_left * basis[..., :-1] + w_right * basis[..., 1:]
    return basis


class SplineKernel(gpytorch.kernels.Kernel):
    """Finite-rank kernel on norm-normalized cubic B-spline features of a 1-d input.

    Args:
        num_basis: Number of B-spline basis functions (>= 4); more captures sharper knees.
        lower: Left end of the input domain (inputs are normalized batch sizes, so 0).
        upper: Right end of the input domain (1).
        log_scale: Place the B-splines on ``log x`` (then ``lower`` must be positive).
        **kwargs: Passed to :class:`gpytorch.kernels.Kernel` (e.g. ``batch_shape``).
    """

    has_lengthscale = False

    def __init__(
        self,
        num_basis: int = 10,
        lower: float = 0.0,
        upper: float = 1.0,
        log_scale: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if log_scale and not lower > 0:
            raise ValueError(f"log_scale needs lower > 0, got {lower}")
        if num_basis < 4:
            raise ValueError(f"num_basis must be >= 4 for cubic splines, got {num_basis}")
        if not upper > lower:
            raise ValueError(f"upper ({upper}) must be greater than lower ({lower})")
        self.num_basis = int(num_basis)
        self.lower = float(lower)
        self.upper = float(upper)
        self.log_scale = bool(log_scale)
        self._cache: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The normalized feature map ``phi(x) / ||phi(x)||``.

        Args:
            x: Inputs of shape ``(..., n, 1)`` or ``(..., n)``.

        Returns:
            Shape ``(..., n, num_basis)``; every row has unit norm.
        """
        if x.dim() >= 1 and x.shape[-1] == 1:
            x = x.squeeze(-1)
        cacheable = not (x.requires_grad and torch.is_grad_enabled())
        if cacheable and self._cache is not None:
            # Hyperparameter fits evaluate the kernel on the same training inputs many times.
            # The cache holds the input itself, so its memory cannot be reused by another.
            old, version, feats = self._cache
            same = (
                old.data_ptr() == x.data_ptr()
                and old.shape == x.shape
                and old.stride() == x.stride()
                and old.dtype == x.dtype
                and x._version == version
            )
            if same:
                return feats
        if self.log_scale:
            log_x = torch.log(x.clamp_min(self.lower))
            phi = bspline_basis(log_x, self.num_basis, math.log(self.lower), math.log(self.upper))
        else:
            phi = bspline_basis(x, self.num_basis, self.lower, self.upper)
        out = phi / phi.norm(dim=-1, keepdim=True)
        if cacheable:
            self._cache = (x, x._version, out)
        return out

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        diag: bool = False,
        last_dim_is_batch: bool = False,
        **params: Any,
    ) -> torch.Tensor:
        """Evaluate ``phi(x1) phi(x2)^T``.

        Args:
            x1: Shape ``(..., n, 1)``.
            x2: Shape ``(..., m, 1)``.
            diag: Return only the diagonal (``n == m``).
            last_dim_is_batch: Not supported; must be False.
            **params: Ignored.

        Returns:
            Shape ``(..., n, m)``, or ``(..., n)`` when ``diag``.
        """
        if last_dim_is_batch:
            raise NotImplementedError("SplineKernel does not support last_dim_is_batch")
        phi1 = self.features(x1)
        phi2 = self.features(x2)
        if diag:
            return (phi1 * phi2).sum(-1)
        return phi1 @ phi2.transpose(-1, -2)
