"""LBB, re-implemented from its publication (see :class:`LBBPolicy` for the citation).

Warm-up: every rank is timed at 2, 4, ..., 256 samples, a cubic is fitted per rank and
``min(max - min)`` of the predicted times is solved with SLSQP. Then, every step, the
straggler level ``lv = (max - min) / mean`` decides between a one-sample move from the
slowest to the fastest rank and a re-solve on a per-rank line through that step's times.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy.optimize import minimize

from lightning_rex.core.plans.minimax import repair_plan
from lightning_rex.core.plans.plan import Plan
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.peers import StepPolicy

__all__ = [
    "LBB_REPEATS",
    "LBB_SIZES",
    "LBBAction",
    "LBBPolicy",
    "lbb_fit",
    "lbb_imbalance",
    "lbb_move",
    "lbb_online_model",
    "lbb_profile_sizes",
    "lbb_solve",
    "lbb_step",
    "lbb_trimmed_mean",
]

LBB_SIZES: tuple[int, ...] = tuple(2**i for i in range(1, 9))  # 2, 4, ..., 256
LBB_REPEATS = 9
LBBAction = Literal["quiet", "move", "resolve", "hold"]
_poly = np.polynomial.polynomial


def lbb_imbalance(times: np.ndarray) -> float:
    """LBB's straggler level ``lv = (max - min) / mean`` of one step's per-rank times.

    Args:
        times: Per-rank compute times of one step (seconds), shape ``(N,)``.

    Returns:
        The relative spread (0.0 when the mean is not positive).
    """
    values = np.asarray(times, dtype=np.float64)
    return float(np.ptp(values) / values.mean()) if values.mean() > 0 else 0.0


def lbb_step(lv: float, quiet: int, window: int = 30) -> tuple[LBBAction, int]:
    """LBB's per-iteration decision: a state machine on the quiet-step counter.

    In the authors' order: ``lv <= 6%`` is a quiet step and the counter grows; then if
    ``5% < lv <= 15%`` or the counter is below ``window``, one sample moves (a step can be
    quiet and a move); else if ``lv > 15%`` and the counter exceeds ``window``, re-solve and
    reset the counter. So ``lv > 15%`` with the counter exactly ``window`` holds. Our
    reading: ``lv == 0`` is quiet (the authors test ``0 < lv``).

    Args:
        lv: This step's :func:`lbb_imbalance`.
        quiet: Quiet steps seen since the last solve.
        window: Quiet steps needed before a re-solve (30).

    Returns:
        ``(action, quiet)``: ``"move"``, ``"resolve"``, or no change (``"quiet"`` or
        ``"hold"``), and the updated counter.
    """
    if lv <= 0.06:
        quiet += 1
    if 0.05 < lv <= 0.15 or quiet < window:
        return "move", quiet
    if lv > 0.15 and quiet > window:
        return "resolve", 0
    return ("quiet" if lv <= 0.06 else "hold"), quiet


def lbb_move(plan: np.ndarray, times: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """LBB's fine-tuning: one sample from the slowest rank to the fastest.

    Ties go to the lowest rank (as the authors' ``list.index``). Our reading: the move is
    skipped when it would leave the bounds (the authors bound nothing online).

    Args:
        plan: Current sizes, shape ``(N,)``.
        times: This step's per-rank times, shape ``(N,)``.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.

    Returns:
        The new sizes (a copy; unchanged when the move is skipped).
    """
    sizes = np.array(plan, dtype=np.int64)
    slow, fast = int(np.argmax(times)), int(np.argmin(times))
    if slow != fast and sizes[slow] > lo[slow] and sizes[fast] < hi[fast]:
        sizes[slow] -= 1
        sizes[fast] += 1
    return sizes


def lbb_profile_sizes(
    lo: np.ndarray, hi: np.ndarray, sizes: tuple[int, ...] = LBB_SIZES, repeats: int = LBB_REPEATS
) -> list[tuple[int, ...]]:
    """LBB's warm-up sweep: each size ``repeats`` times in a row, on every rank at once.

    Our reading for bounds: rank ``r`` runs ``min(max(b, lo_r), hi_r)``, so a rank capped
    below 256 repeats its cap for the larger sizes (its fit sees fewer distinct sizes).

    Args:
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.
        sizes: The sweep (2, 4, ..., 256).
        repeats: Runs per size (9).

    Returns:
        One per-rank size tuple per profiling step, ``len(sizes) * repeats`` of them.
    """
    rows = [tuple(int(x) for x in np.clip(b, lo, hi)) for b in sizes]
    return [row for row in rows for _ in range(repeats)]


def lbb_trimmed_mean(values: np.ndarray) -> float:
    """The authors' trimmed mean: drop the ``n // 3`` largest and smallest, average the rest.

    For LBB's nine runs: drop the three slowest and three fastest, average the middle three.

    Args:
        values: Repeated timings of one size on one rank.

    Returns:
        The trimmed mean.
    """
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    cut = len(ordered) // 3
    return float(ordered[cut : len(ordered) - cut].mean())


def lbb_fit(sizes: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Fit LBB's cubic ``t_r(b)`` per rank, least squares on one trimmed mean per size.

    A rank with fewer than four distinct sizes gets the highest degree its points allow.

    Args:
        sizes: Profiling sizes, shape ``(P, N)``.
        times: Profiling times (seconds), shape ``(P, N)``.

    Returns:
        Coefficients in increasing order, shape ``(N, 4)``: ``t = c0 + c1 b + c2 b^2 + c3 b^3``.
    """
    size_arr, time_arr = np.asarray(sizes, dtype=np.float64), np.asarray(times, dtype=np.float64)
    coeffs = np.zeros((size_arr.shape[1], 4))
    for rank in range(size_arr.shape[1]):
        distinct = np.unique(size_arr[:, rank])
        means = [lbb_trimmed_mean(time_arr[size_arr[:, rank] == x, rank]) for x in distinct]
        coeffs[rank, : min(4, len(distinct))] = _poly.polyfit(
            distinct, means, min(3, len(distinct) - 1)
        )
    return coeffs


def lbb_online_model(coeffs: np.ndarray | None, plan: np.ndarray, times: np.ndarray) -> np.ndarray:
    """LBB's online (re-solve) model: a line per rank, ``t_r(b) = s_r + b / v_r``.

    Authors over summary: a re-solve does not re-fit the cubic. It keeps the warm-up
    start-up time ``s_r`` (the cubic at ``b = 0.01``) and takes the rate from this step
    alone, ``v_r = b_r / (t_r - s_r)``. Our reading: with no warm-up ``s_r = 0``, and a
    non-positive ``t_r - s_r`` falls back to the line through the origin.

    Args:
        coeffs: Warm-up cubics from :func:`lbb_fit`, or None.
        plan: The sizes this step ran, shape ``(N,)``.
        times: This step's per-rank times (seconds), shape ``(N,)``.

    Returns:
        Line coefficients ``(s_r, 1 / v_r)``, shape ``(N, 2)``.
    """
    sizes, seconds = np.asarray(plan, dtype=np.float64), np.asarray(times, dtype=np.float64)
    start = np.zeros_like(seconds) if coeffs is None else _poly.polyval(0.01, np.asarray(coeffs).T)
    slope = (seconds - start) / sizes
    bad = ~(slope > 0)
    slope[bad], start[bad] = seconds[bad] / sizes[bad], 0.0
    return np.stack([start, slope], axis=1)


def lbb_solve(coeffs: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> Plan:
    """Solve LBB's ``min max_r t_r(b_r) - min_r t_r(b_r)`` with SLSQP, then round.

    Subject to ``sum b = total`` and ``lo <= b <= hi``, started at ``b = 2`` as the authors
    do. Our reading (numerics only): SLSQP gets the same problem in its smooth epigraph form
    (``min s - u``, ``u <= t_r(b_r) <= s``) on times scaled by their mean at the even split,
    as the raw non-smooth objective often stalls it. Rounding is by largest remainder to
    integers summing to ``total`` (the authors round the larger half up and the rest down).

    Args:
        coeffs: Per-rank polynomial coefficients in increasing order, shape ``(N, K)``.
        total: The global batch ``B``.
        lo: Per-rank minimum sizes.
        hi: Per-rank maximum sizes.

    Returns:
        The plan.
    """
    coef = np.asarray(coeffs, dtype=np.float64)
    n_ranks = coef.shape[0]
    dcoef = np.stack([_poly.polyder(ci) for ci in coef])
    ref = float(np.mean(np.abs(_poly.polyval(total / n_ranks, coef.T))))
    norm = 1.0 / ref if ref > 0 else 1.0

    def t(b: np.ndarray) -> np.ndarray:
        return np.asarray(_poly.polyval(b, coef.T, tensor=False)) * norm

    def jac(z: np.ndarray) -> np.ndarray:
        diagonal = np.diag(np.asarray(_poly.polyval(z[:n_ranks], dcoef.T, tensor=False)) * norm)
        one, zero = np.ones((n_ranks, 1)), np.zeros((n_ranks, 1))
        return np.block([[-diagonal, one, zero], [diagonal, zero, -one]])

    grad, a_eq = np.r_[np.zeros(n_ranks), 1.0, -1.0], np.r_[np.ones(n_ranks), 0.0, 0.0][None, :]
    start = np.clip(np.full(n_ranks, 2.0), lo, hi).astype(np.float64)
    bounds = [(float(a), float(b)) for a, b in zip(lo, hi)] + [(None, None)] * 2
    equality = {
        "type": "eq",
        "fun": lambda z: np.r_[z[:n_ranks].sum() - total],
        "jac": lambda z: a_eq,
    }
    ineq = {
        "type": "ineq",
        "fun": lambda z: np.r_[z[n_ranks] - t(z[:n_ranks]), t(z[:n_ranks]) - z[n_ranks + 1]],
    }
    res = minimize(
        lambda z: z[n_ranks] - z[n_ranks + 1],
        np.r_[start, t(start).max(), t(start).min()],
        jac=lambda z: grad,
        method="SLSQP",
        bounds=bounds,
        constraints=[equality, {**ineq, "jac": jac}],
        options={"ftol": 1e-9, "maxiter": 500},
    )
    relaxed = np.clip(np.nan_to_num(res.x[:n_ranks]), lo, hi)
    sizes = np.floor(relaxed).astype(np.int64)
    extra = max(0, min(total - int(sizes.sum()), n_ranks))
    sizes[np.argsort(sizes - relaxed, kind="stable")[:extra]] += 1
    return tuple(int(v) for v in repair_plan(sizes, total, lo, hi))


class LBBPolicy(StepPolicy):
    """LBB: warm-up fit and solve, then per-step fine moves and occasional re-solves.

    F. Yao, Z. Zhang, Z. Ji, B. Liu and H. Gao, "LBB: load-balanced batching for efficient
    distributed learning on heterogeneous GPU cluster", The Journal of Supercomputing 80(9),
    12247-12272 (2024), doi:10.1007/s11227-023-05886-w (code: github.com/FLYING37520/LBB).
    Warm-up (:meth:`profiling_plan`): sizes 2, 4, ..., 256, nine runs each;
    :meth:`observe_profile` fits cubics (:func:`lbb_fit`) and solves (:func:`lbb_solve`).
    Each step follows :func:`lbb_step`; a move is :func:`lbb_move`; a re-solve solves the
    linear model of :func:`lbb_online_model` (authors, not the summary's cubic re-fit).

    Args:
        sizes: The warm-up sweep.
        repeats: Runs per warm-up size.
        window: Quiet steps before a re-solve is allowed.
    """

    name = "lbb"

    def __init__(
        self, sizes: tuple[int, ...] = LBB_SIZES, repeats: int = LBB_REPEATS, window: int = 30
    ) -> None:
        self.sizes, self.repeats, self.window = tuple(sizes), int(repeats), int(window)

    def _start(self, info: PolicyInfo) -> None:
        self.coeffs: np.ndarray | None = None
        self.quiet = self.moves = self.resolves = 0
        self.last_action: LBBAction | None = None

    def profiling_plan(self) -> list[tuple[int, ...]]:
        """The warm-up steps' per-rank sizes (see :func:`lbb_profile_sizes`)."""
        return lbb_profile_sizes(self.lo, self.hi, self.sizes, self.repeats)

    def observe_profile(self, sizes: np.ndarray, times: np.ndarray) -> Plan:
        """Fit the warm-up cubics and solve; the engine applies the plan from step 0.

        Args:
            sizes: The profiling sizes run, shape ``(P, N)``.
            times: Their per-rank compute times (seconds), shape ``(P, N)``.

        Returns:
            The solved plan.
        """
        self.coeffs, self.quiet = lbb_fit(sizes, times), 0
        return lbb_solve(self.coeffs, self.info.global_batch, self.lo, self.hi)

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """Apply the per-iteration rule to one step.

        Args:
            step: The step just run.
            times: Its per-rank compute times (seconds), shape ``(N,)``.
            plan: The plan it ran.

        Returns:
            The plan for ``step + 1``, or None to keep ``plan``.
        """
        step_times, sizes = np.asarray(times, dtype=np.float64), np.asarray(plan, dtype=np.int64)
        action, self.quiet = lbb_step(lbb_imbalance(step_times), self.quiet, window=self.window)
        self.last_action = action
        if action == "move":
            new = tuple(int(x) for x in lbb_move(sizes, step_times, self.lo, self.hi))
            self.moves += new != tuple(plan)
        elif action == "resolve":
            self.resolves += 1
            model = lbb_online_model(self.coeffs, sizes, step_times)
            new = lbb_solve(model, self.info.global_batch, self.lo, self.hi)
        else:
            return None
        return new if new != tuple(plan) else None
