"""The gradient noise scale under uneven plans, and what it says about the global batch.

**The estimator.** Let every sample's gradient have mean ``G`` and covariance ``Sigma`` (the
gradient noise), and let rank ``r`` compute the mean gradient ``g_r`` of its ``b_r`` samples,
so that the global gradient is ``g = sum_r (b_r / B) g_r``. For independent samples

    E |g_r|^2 = |G|^2 + tr(Sigma) / b_r        E |g|^2 = |G|^2 + tr(Sigma) / B.

Pollux (Qiao et al., OSDI 2021, sec. 3.1) and McCandlish et al. (*An Empirical Model of
Large-Batch Training*, 2018, app. A.1) combine one small and one large batch size; with
equal micro-batches the per-replica norms all have the small size. Under an uneven plan they
do not, so take the size-weighted mean of the local squared norms,

    A = sum_r (b_r / B) |g_r|^2,     E A = |G|^2 + N tr(Sigma) / B,

(one scalar all-reduce of ``b_r |g_r|^2``). Then

    S_hat = B (A - |g|^2) / (N - 1)      G_hat = (N |g|^2 - A) / (N - 1)

are unbiased for ``tr(Sigma)`` and ``|G|^2`` whatever the plan: ``E[A - |g|^2] = (N - 1)
tr(Sigma) / B`` and ``E[N |g|^2 - A] = (N - 1) |G|^2``. With equal micro-batches they are
Pollux's estimators. They need no per-sample gradient, only each rank's local gradient norm
before the all-reduce and the global one after it.

Each step's pair is noisy (``G_hat`` can be negative), so the two are smoothed separately
with an exponential moving average and their ratio is the **noise scale**
``phi = tr(Sigma) / |G|^2`` (McCandlish's ``B_simple``). Steps whose norms are not finite (an
AMP overflow step, which the scaler skips too) are left out.

**Statistical efficiency** (Pollux, eq. 4): relative to a base batch ``B0``, a step at ``B``
makes ``(phi + B0) / (phi + B)`` times the progress per sample, and **goodput** is throughput
times that. **Learning-rate rules**: ``linear`` (``B / B0``), ``sqrt`` and AdaScale's gain
(Johnson et al., *AdaScale SGD*, ICML 2020): ``(tr(Sigma) / B0 + |G|^2) / (tr(Sigma) / B +
|G|^2)``, between 1 and ``B / B0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "LR_RULES",
    "LrRule",
    "NoiseScale",
    "lr_factor",
    "noise_estimates",
    "statistical_efficiency",
]

LrRule = Literal["linear", "sqrt", "adascale"]
LR_RULES: tuple[str, ...] = ("linear", "sqrt", "adascale")


def noise_estimates(
    weighted_local_sq: float, global_sq: float, sizes: Sequence[int]
) -> tuple[float, float]:
    """One step's unbiased estimates of ``|G|^2`` and ``tr(Sigma)`` (module docstring).

    Args:
        weighted_local_sq: ``A = sum_r (b_r / B) |g_r|^2``, each ``g_r`` the *mean* gradient
            of rank ``r``'s micro-batch.
        global_sq: ``|g|^2``, the squared norm of the mean gradient over the global batch.
        sizes: The plan of the step, ``b_r`` per rank (at least two ranks).

    Returns:
        ``(G_hat, S_hat)``: the estimates of ``|G|^2`` and ``tr(Sigma)``.

    Raises:
        ValueError: For fewer than two ranks or a size below 1.
    """
    n = len(sizes)
    if n < 2:
        raise ValueError(f"the noise scale needs at least two ranks, got {n}")
    if min(sizes) < 1:
        raise ValueError(f"sizes must be >= 1, got {list(sizes)}")
    b = float(sum(sizes))
    s_hat = b * (weighted_local_sq - global_sq) / (n - 1)
    g_hat = (n * global_sq - weighted_local_sq) / (n - 1)
    return g_hat, s_hat


def statistical_efficiency(batch: float, base_batch: float, phi: float) -> float:
    """Progress per sample at ``batch`` relative to ``base_batch`` (Pollux, eq. 4).

    Args:
        batch: The global batch ``B``.
        base_batch: The base batch ``B0`` the learning rate was tuned for.
        phi: The noise scale ``tr(Sigma) / |G|^2`` (>= 0).

    Returns:
        ``(phi + B0) / (phi + B)``: 1 at ``B0``, below 1 for larger batches.
    """
    phi = max(0.0, float(phi))
    return (phi + base_batch) / (phi + batch)


def lr_factor(
    rule: LrRule, batch: float, base_batch: float, grad_sq: float = 1.0, noise: float = 0.0
) -> float:
    """The factor on the base learning rate at global batch ``batch``.

    Args:
        rule: ``"linear"``, ``"sqrt"`` or ``"adascale"``.
        batch: The global batch ``B``.
        base_batch: The base batch ``B0``.
        grad_sq: ``|G|^2`` (AdaScale only).
        noise: ``tr(Sigma)`` (AdaScale only).

    Returns:
        ``B / B0``, ``sqrt(B / B0)``, or AdaScale's gain.

    Raises:
        ValueError: For an unknown rule.
    """
    scale = batch / base_batch
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "adascale":
        g, s = max(0.0, grad_sq), max(0.0, noise)
        if g + s <= 0.0:
            return 1.0
        return (s / base_batch + g) / (s / batch + g)
    raise ValueError(f"lr_rule must be one of {LR_RULES}, got {rule!r}")


@dataclass
class NoiseScale:
    """Exponential moving averages of ``|G|^2`` and ``tr(Sigma)``, step by step.

    Args:
        decay: The EMA's weight on the past per step (0.99: about 100 steps of memory).

    Attributes:
        grad_sq: The smoothed ``|G|^2`` (bias-corrected), or None before the first step.
        noise: The smoothed ``tr(Sigma)``, or None before the first step.
        steps: Steps taken in.
        skipped: Steps left out for non-finite norms.
    """

    decay: float = 0.99
    grad_sq: float | None = None
    noise: float | None = None
    steps: int = 0
    skipped: int = 0
    _g: float = 0.0
    _s: float = 0.0
    _w: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    def update(self, weighted_local_sq: float, global_sq: float, sizes: Sequence[int]) -> bool:
        """Take one step's norms in.

        Args:
            weighted_local_sq: ``sum_r (b_r / B) |g_r|^2`` (mean gradients).
            global_sq: ``|g|^2`` of the global mean gradient.
            sizes: The step's plan.

        Returns:
            False when the step was skipped (a norm not finite), else True.
        """
        if not (math.isfinite(weighted_local_sq) and math.isfinite(global_sq)):
            self.skipped += 1
            return False
        g, s = noise_estimates(weighted_local_sq, global_sq, sizes)
        d = self.decay
        self._g = d * self._g + (1 - d) * g
        self._s = d * self._s + (1 - d) * s
        self._w = d * self._w + (1 - d)
        self.grad_sq, self.noise = self._g / self._w, self._s / self._w
        self.steps += 1
        return True

    @property
    def phi(self) -> float | None:
        """The noise scale ``tr(Sigma) / |G|^2`` (inf while ``|G|^2 <= 0``), or None."""
        if self.grad_sq is None or self.noise is None:
            return None
        if self.grad_sq <= 0.0:
            return math.inf
        return max(0.0, self.noise) / self.grad_sq

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "decay": self.decay,
            "g": self._g,
            "s": self._s,
            "w": self._w,
            "steps": self.steps,
            "skipped": self.skipped,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Args:
            d: The saved state.
        """
        self.decay = float(d["decay"])
        self._g, self._s, self._w = float(d["g"]), float(d["s"]), float(d["w"])
        self.steps, self.skipped = int(d["steps"]), int(d["skipped"])
        if self._w > 0:
            self.grad_sq, self.noise = self._g / self._w, self._s / self._w
        else:
            self.grad_sq = self.noise = None
