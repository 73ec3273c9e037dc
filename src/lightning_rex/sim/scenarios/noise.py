"""Multiplicative per-rank step-time noise for the cluster simulator (numpy only).

Every rank's step time is multiplied by a mean-one factor. Its logarithm is a sum of
independent AR(1) processes (components), each started from its stationary distribution;
component ``i`` has stationary variance ``share_i * sigma**2`` with
``sigma**2 = log(1 + cv**2)``, so the factor ``exp(sum - sigma**2 / 2)`` is lognormal with
mean one and coefficient of variation ``cv``, and the lag-``h`` autocorrelation of its log is
``sum_i share_i * ar1_i**h``. Optional spikes then multiply a rank's factor by ``factor``
with probability ``prob``, independently per rank and step.

With one component of share 1 and no spikes, :class:`NoiseProcess` consumes the generator
and computes exactly (bit for bit) as the simulator's original single AR(1) noise did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NoiseComponent", "NoiseProcess", "Spikes"]


@dataclass(frozen=True)
class NoiseComponent:
    """One AR(1) component of the log noise factor.

    Attributes:
        share: Fraction of the total log-variance this component carries (> 0; the shares
            of a process sum to 1).
        ar1: Lag-1 autocorrelation of the component, in ``[0, 1)``.
    """

    share: float
    ar1: float


@dataclass(frozen=True)
class Spikes:
    """Independent per-rank, per-step slowdown spikes.

    Attributes:
        prob: Probability, in ``[0, 1]``, that a rank's step is a spike.
        factor: Multiplier (> 0) applied to a spiked step's time.
    """

    prob: float
    factor: float


def _validate(
    n_ranks: int, cv: float, components: Sequence[NoiseComponent], spikes: Spikes | None
) -> None:
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    if not (math.isfinite(cv) and cv >= 0):
        raise ValueError(f"noise.cv must be finite and >= 0, got {cv}")
    if len(components) == 0:
        raise ValueError("noise.components must have at least one component, got none")
    for index, component in enumerate(components):
        if not (math.isfinite(component.share) and component.share > 0):
            raise ValueError(f"noise.components[{index}].share must be > 0, got {component.share}")
        if not 0 <= component.ar1 < 1:
            raise ValueError(
                f"noise.components[{index}].ar1 must be in [0, 1), got {component.ar1}"
            )
    total = math.fsum(c.share for c in components)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"noise.components shares must sum to 1, got {total:.12g}")
    if spikes is not None:
        if not 0 <= spikes.prob <= 1:
            raise ValueError(f"noise.spikes.prob must be in [0, 1], got {spikes.prob}")
        if not (math.isfinite(spikes.factor) and spikes.factor > 0):
            raise ValueError(f"noise.spikes.factor must be > 0, got {spikes.factor}")


class NoiseProcess:
    """Per-rank multiplicative step-time noise, drawn a chunk of steps at a time.

    Generator use, in order: at construction, ``rng.standard_normal(n_ranks)`` once per
    component (its initial state); at each :meth:`next_chunk` of ``k`` steps,
    ``rng.standard_normal((n_ranks, k))`` once per component, then, with spikes only,
    ``rng.random((n_ranks, k))``. The same generator state and chunk sizes therefore give
    the same factors.
    """

    def __init__(
        self,
        n_ranks: int,
        cv: float,
        components: Sequence[NoiseComponent],
        spikes: Spikes | None,
        rng: np.random.Generator,
    ) -> None:
        """Validate the parameters and draw each component's stationary initial state.

        Args:
            n_ranks: Number of ranks (>= 1); each has its own independent noise.
            cv: Coefficient of variation of the lognormal factor (finite, >= 0).
            components: The AR(1) components of the log factor (at least one; shares > 0
                summing to 1 within 1e-9; each ``ar1`` in ``[0, 1)``).
            spikes: Optional spikes applied on top of the lognormal factor, or None.
            rng: Generator all draws come from; it is advanced by this constructor and by
                every :meth:`next_chunk`.

        Raises:
            ValueError: If a parameter is out of range; the message names the field.
        """
        comps = tuple(components)
        _validate(n_ranks, cv, comps, spikes)
        self.n_ranks = int(n_ranks)
        self.cv = float(cv)
        self.components = comps
        self.spikes = spikes
        self._rng = rng
        # The original simulator scaled the initial state with cv**2 and the chunks with
        # cv * cv; the two can differ in the last bit, so both are kept for exactness.
        sigma0 = float(np.sqrt(np.log1p(self.cv**2)))
        self._sigma = float(np.sqrt(np.log1p(self.cv * self.cv)))
        self._states = [
            rng.standard_normal(self.n_ranks) * (math.sqrt(c.share) * sigma0) for c in comps
        ]

    def next_chunk(self, k: int) -> np.ndarray:
        """Draw the next ``k`` steps' factors for every rank, advancing the state.

        Args:
            k: Number of steps (>= 0).

        Returns:
            Array of shape ``(n_ranks, k)``: the mean-one lognormal factor of each rank at
            each step, times ``spikes.factor`` where a spike occurred.

        Raises:
            ValueError: If ``k`` is negative.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        sigma = self._sigma
        total: np.ndarray | None = None
        for component, state in zip(self.components, self._states):
            rho = float(component.ar1)
            sigma_i = math.sqrt(component.share) * sigma
            shocks = (
                self._rng.standard_normal((self.n_ranks, k)) * sigma_i * np.sqrt(1.0 - rho * rho)
            )
            out = np.empty((self.n_ranks, k))
            level = state
            for step in range(k):
                level = rho * level + shocks[:, step]
                out[:, step] = level
            state[:] = level
            total = out if total is None else total + out
        assert total is not None  # at least one component (validated)
        factors = np.exp(total - 0.5 * sigma * sigma)
        if self.spikes is not None:
            hit = self._rng.random((self.n_ranks, k)) < self.spikes.prob
            factors[hit] *= self.spikes.factor
        return factors
