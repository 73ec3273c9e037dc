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
AMP overflow step, which the scaler skips too) are left out, and an outlier step (a loss
spike) is clipped against the recent steps' median before it enters the averages
(:class:`NoiseScale`).

**Statistical efficiency** (Pollux, eq. 4): relative to a base batch ``B0``, a step at ``B``
makes ``(phi + B0) / (phi + B)`` times the progress per sample, and **goodput** is throughput
times that. **Learning-rate rules**: ``linear`` (``B / B0``), ``sqrt`` and AdaScale's gain
(Johnson et al., *AdaScale SGD*, ICML 2020): ``(tr(Sigma) / B0 + |G|^2) / (tr(Sigma) / B +
|G|^2)``, between 1 and ``B / B0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from lightning_rex.core.saved import StateError, matrix, real, whole
from lightning_rex.core.saved import field as state_field

__all__ = [
    "FROZEN_AFTER",
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
    num_ranks = len(sizes)
    if num_ranks < 2:
        raise ValueError(f"the noise scale needs at least two ranks, got {num_ranks}")
    if min(sizes) < 1:
        raise ValueError(f"sizes must be >= 1, got {list(sizes)}")
    global_batch = float(sum(sizes))
    s_hat = global_batch * (weighted_local_sq - global_sq) / (num_ranks - 1)
    g_hat = (num_ranks * global_sq - weighted_local_sq) / (num_ranks - 1)
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
        clamped_grad, clamped_noise = max(0.0, grad_sq), max(0.0, noise)
        if clamped_grad + clamped_noise <= 0.0:
            return 1.0
        return (clamped_noise / base_batch + clamped_grad) / (clamped_noise / batch + clamped_grad)
    raise ValueError(f"lr_rule must be one of {LR_RULES}, got {rule!r}")


_ROBUST_WINDOW = 64
"""Per-step estimates kept to clip the next one against (their median and MAD)."""
_ROBUST_MIN = 8
"""Estimates needed before clipping starts."""
_ROBUST_WIDTH = 6.0
"""Clip at the recent median plus or minus this many robust standard deviations."""
FROZEN_AFTER = 3
"""Consecutive steps without finite norms after which the estimate counts as frozen."""


def _clip(x: float, recent: Sequence[float]) -> float:
    """``x`` clipped to the recent estimates' median +- ``_ROBUST_WIDTH`` robust sds."""
    if len(recent) < _ROBUST_MIN:
        return x
    arr = np.asarray(recent, dtype=np.float64)
    center = float(np.median(arr))
    spread = 1.4826 * float(np.median(np.abs(arr - center)))
    if spread <= 0.0:
        return x
    return min(max(x, center - _ROBUST_WIDTH * spread), center + _ROBUST_WIDTH * spread)


@dataclass
class NoiseScale:
    """Exponential moving averages of ``|G|^2`` and ``tr(Sigma)``, step by step.

    Each step's pair of estimates is first clipped to the median of the last 64 steps'
    estimates plus or minus six robust standard deviations (1.4826 times the median absolute
    deviation), once eight are known: one step's loss spike (a bad batch, a rank's
    transient fault) multiplies a squared gradient norm by orders of magnitude and would
    otherwise hold the averages for thousands of steps. The raw estimates are what is kept,
    so a real change of the statistics moves the median and is followed within about half
    that window. For the noise model's (near Gaussian) estimates the clip is six standard
    deviations away and changes nothing.

    Args:
        decay: The EMA's weight on the past per step (0.99: about 100 steps of memory).

    Attributes:
        grad_sq: The smoothed ``|G|^2`` (bias-corrected), or None before the first step.
        noise: The smoothed ``tr(Sigma)``, or None before the first step.
        steps: Steps taken in.
        skipped: Steps left out for non-finite norms.
        stale: Consecutive steps left out up to now (0 after a usable step).
        clipped: Steps whose estimates were clipped as outliers.
    """

    decay: float = 0.99
    grad_sq: float | None = None
    noise: float | None = None
    steps: int = 0
    skipped: int = 0
    stale: int = 0
    clipped: int = 0
    _g: float = 0.0
    _s: float = 0.0
    _w: float = 0.0
    _recent: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    @property
    def recent(self) -> list[tuple[float, float]]:
        """The last (at most 64) steps' raw ``(|G|^2, tr(Sigma))`` estimates, oldest first."""
        return list(self._recent)

    def interval(self, confidence: float, min_steps: int) -> tuple[float, float] | None:
        """The noise scale's one-sided ``confidence`` bounds from the recent raw estimates.

        The means of the per-step ``|G|^2`` and ``tr(Sigma)`` estimates, each within ``z``
        standard errors, give the smallest and the largest ratio; inf where ``|G|^2``'s
        bound is not positive.

        Args:
            confidence: One-sided confidence of each bound (0.5 to 1).
            min_steps: The fewest estimates to bound from (at least 2).

        Returns:
            ``(low, high)``, or None with fewer than ``min_steps`` recent estimates.
        """
        rows = np.asarray(self._recent, dtype=np.float64)
        if rows.shape[0] < max(2, min_steps):
            return None
        mean = rows.mean(axis=0)
        stderr = rows.std(axis=0, ddof=1) / math.sqrt(rows.shape[0])
        z = NormalDist().inv_cdf(confidence)
        g_lo, g_hi = mean[0] - z * stderr[0], mean[0] + z * stderr[0]
        s_lo, s_hi = max(0.0, mean[1] - z * stderr[1]), max(0.0, mean[1] + z * stderr[1])
        low = s_lo / g_hi if g_hi > 0 else math.inf
        high = s_hi / g_lo if g_lo > 0 else math.inf
        return low, high

    @property
    def frozen(self) -> bool:
        """Whether the last ``FROZEN_AFTER`` or more steps had no finite norms."""
        return self.stale >= FROZEN_AFTER

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
            self.stale += 1
            return False
        g_raw, s_raw = noise_estimates(weighted_local_sq, global_sq, sizes)
        if not (math.isfinite(g_raw) and math.isfinite(s_raw)):  # an overflow in between
            self.skipped += 1
            self.stale += 1
            return False
        grad_est = _clip(g_raw, [r[0] for r in self._recent])
        noise_est = _clip(s_raw, [r[1] for r in self._recent])
        self.clipped += int(grad_est != g_raw or noise_est != s_raw)
        self._recent = [*self._recent[-(_ROBUST_WINDOW - 1) :], (g_raw, s_raw)]
        decay = self.decay
        self._g = decay * self._g + (1 - decay) * grad_est
        self._s = decay * self._s + (1 - decay) * noise_est
        self._w = decay * self._w + (1 - decay)
        self.grad_sq, self.noise = self._g / self._w, self._s / self._w
        self.steps += 1
        self.stale = 0
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
            "stale": self.stale,
            "clipped": self.clipped,
            "recent": [list(r) for r in self._recent],
        }

    @staticmethod
    def check_state(d: Any, name: str = "noise") -> dict[str, Any]:
        """Check a saved state without loading it.

        Args:
            d: A dictionary from :meth:`state_dict`.
            name: Its dotted name, for errors.

        Returns:
            The state, normalised (fields that older checkpoints lack get their defaults).

        Raises:
            StateError: Naming the field: a decay outside ``[0, 1)``, averages that are not
                finite, a weight outside ``[0, 1]``, or counts that are not integers >= 0.
        """
        decay = real(state_field(d, "decay", name), f"{name}.decay")
        if not 0.0 <= decay < 1.0:
            raise StateError(f"{name}.decay", f"must be in [0, 1), got {decay}")
        weight = real(state_field(d, "w", name), f"{name}.w")
        if not 0.0 <= weight <= 1.0:
            raise StateError(f"{name}.w", f"must be a weight in [0, 1], got {weight}")
        recent = d.get("recent", [])
        rows = matrix(recent, f"{name}.recent", None, 2) if recent else []
        if len(rows) > _ROBUST_WINDOW:
            raise StateError(f"{name}.recent", f"must hold at most {_ROBUST_WINDOW} estimates")
        return {
            "decay": decay,
            "g": real(state_field(d, "g", name), f"{name}.g"),
            "s": real(state_field(d, "s", name), f"{name}.s"),
            "w": weight,
            "steps": whole(state_field(d, "steps", name), f"{name}.steps", 0),
            "skipped": whole(state_field(d, "skipped", name), f"{name}.skipped", 0),
            "stale": whole(d.get("stale", 0), f"{name}.stale", 0),
            "clipped": whole(d.get("clipped", 0), f"{name}.clipped", 0),
            "recent": [(r[0], r[1]) for r in rows],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, after checking it.

        Args:
            d: The saved state.

        Raises:
            StateError: Naming the field (see :meth:`check_state`).
        """
        state = self.check_state(d)
        self.decay = state["decay"]
        self._g, self._s, self._w = state["g"], state["s"], state["w"]
        self.steps, self.skipped = state["steps"], state["skipped"]
        self.stale, self.clipped = state["stale"], state["clipped"]
        self._recent = list(state["recent"])
        if self._w > 0:
            self.grad_sq, self.noise = self._g / self._w, self._s / self._w
        else:
            self.grad_sq = self.noise = None
