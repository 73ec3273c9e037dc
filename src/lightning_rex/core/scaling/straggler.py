"""The straggler wait: a synchronous step lasts its slowest rank's *noisy* time.

The rank model predicts each rank's typical (median) step time at its size, and the slowest
rank's prediction is what a plan is planned on. A synchronous step, though, waits every step
for whichever rank is slowest *that step*: with ``N`` ranks of independent noise, the
measured step sits above the slowest median by about ``sigma`` times the expected maximum of
``N`` standard normals (0.1 in log on 8 balanced ranks with 3% noise, more on 64). That gap
depends on the plan: a balanced plan waits for the noisiest of all ranks, an unbalanced one
mostly for its slowest rank. Left out, it is a residual the goodput model would have to learn
batch by batch, and a batch not yet tried would look faster by it than the one in force.

:class:`StragglerWait` estimates each rank's noise from its own step times (the median
absolute deviation of its log step times, a robust scale, over the recent windows) and
predicts the mean log synchronous step of a plan,

    E[log(max_r m_r exp(sigma_r Z_r) + overhead)],

by Monte Carlo over fixed standard normal draws (common random numbers: the same draws for
every plan, so that plans compare without sampling noise between them).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["StragglerWait", "rank_log_scale"]

_MAD_TO_SD = 1.4826
"""The median absolute deviation of a normal sample times this is its standard deviation."""


def rank_log_scale(times: np.ndarray) -> np.ndarray:
    """Each rank's noise: the robust standard deviation of its log step times.

    Args:
        times: Step times in seconds, shape ``(N, K)``.

    Returns:
        Shape ``(N,)``: ``1.4826 x`` the median absolute deviation of each rank's log times
        (a spike, a one-off step, moves it little); 0 for a rank with a time that is not
        positive.
    """
    values = np.asarray(times, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(values)
    ok = np.all(np.isfinite(logs), axis=1)
    logs = np.where(ok[:, None], logs, 0.0)
    median = np.median(logs, axis=1, keepdims=True)
    return np.asarray(_MAD_TO_SD * np.median(np.abs(logs - median), axis=1))


class StragglerWait:
    """The expected wait for the slowest noisy rank (module docstring).

    Args:
        windows: The recent windows whose noise estimates are kept (their median is used).
        draws: Monte Carlo draws of the ranks' noise.
        seed: The draws' seed.
    """

    def __init__(self, windows: int = 8, draws: int = 256, seed: int = 0) -> None:
        if windows < 1 or draws < 1:
            raise ValueError(f"windows and draws must be >= 1, got {windows} and {draws}")
        self.windows = int(windows)
        self.draws = int(draws)
        self.seed = int(seed)
        self._scales: list[np.ndarray] = []
        self._normals: np.ndarray | None = None

    def observe(self, times: np.ndarray) -> None:
        """Take one window's per-rank step times.

        Args:
            times: Seconds, shape ``(N, K)`` with ``K >= 3``; another ``N`` than before (the
                world changed) starts the estimate afresh. Fewer steps are ignored.
        """
        values = np.asarray(times, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] < 3:
            return
        if self._scales and self._scales[0].shape != (values.shape[0],):
            self._scales = []
        self._scales = [*self._scales, rank_log_scale(values)][-self.windows :]

    def state_dict(self) -> list[list[float]]:
        """JSON-able state: the recent windows' per-rank noise scales."""
        return [scale.tolist() for scale in self._scales]

    def load_state_dict(self, scales: list[list[float]]) -> None:
        """Restore :meth:`state_dict` output (checked by the caller).

        Args:
            scales: Per window, each rank's log noise scale; the last ``windows`` are kept.
        """
        self._scales = [np.asarray(row, dtype=np.float64) for row in scales][-self.windows :]

    @property
    def scales(self) -> np.ndarray | None:
        """Each rank's log noise scale (the median of the recent windows'), or None yet."""
        if not self._scales:
            return None
        return np.asarray(np.median(np.stack(self._scales), axis=0))

    def _draws(self, n_ranks: int) -> np.ndarray:
        if self._normals is None or self._normals.shape[1] != n_ranks:
            rng = np.random.default_rng(self.seed)
            self._normals = rng.standard_normal((self.draws, n_ranks))
        return self._normals

    def step_time(self, rank_times: np.ndarray, overhead_s: float = 0.0) -> float:
        """The geometric mean synchronous step time of ranks with these typical times.

        Args:
            rank_times: Each rank's median step time at its size in the plan, seconds.
            overhead_s: Seconds each step spends outside the ranks' compute.

        Returns:
            ``exp(E[log(max_r t_r exp(sigma_r Z_r) + overhead_s)])``; without a noise
            estimate (or for another number of ranks), the slowest rank plus the overhead.
        """
        typical = np.asarray(rank_times, dtype=np.float64)
        scales = self.scales
        if scales is None or scales.shape != typical.shape or not np.all(typical > 0):
            return float(typical.max()) + overhead_s
        noisy = typical[None, :] * np.exp(self._draws(typical.size) * scales[None, :])
        return math.exp(float(np.log(noisy.max(axis=1) + overhead_s).mean()))
