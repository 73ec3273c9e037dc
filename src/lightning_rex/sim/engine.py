"""The synchronous step loop: noise, events, windows, and the metrics of a run.

Per window of ``K`` steps, every rank's compute time is its noise-free curve at its
micro-batch, times the active event factors, times a mean-one lognormal AR(1) noise factor;
the synchronous step takes the slowest rank's time plus ``comm``. The window's ``N x K`` times
go to the policy as a :class:`~lightning_rex.core.window.Window`, exactly as the Lightning
callback will hand them to the controller, and a plan the policy returns is applied from the
next window. The noise of a seed does not depend on the policy, so every policy (and the
oracle that sets the limit) runs on the same noise.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lightning_rex.core.plan import Plan, even_plan
from lightning_rex.core.window import Window
from lightning_rex.sim.policies import OraclePolicy, Policy, PolicyInfo, make_policy
from lightning_rex.sim.scenario import Scenario

__all__ = ["SimResult", "Trace", "metrics", "run", "simulate"]


@dataclass
class Trace:
    """What one policy did in one run (the raw material of :func:`metrics`).

    Attributes:
        policy: The policy's name.
        window_step_s: Mean synchronous step time of every window.
        total_time_s: Simulated seconds of the whole run.
        changes: ``(window index, new plan, plan before)`` for every plan change, by the
            window from which it applies.
        decision_ms: Wall-clock milliseconds of every ``observe`` call.
        rollbacks: Rollbacks the policy reports.
        final_plan: The plan in force at the end.
    """

    policy: str
    window_step_s: list[float]
    total_time_s: float
    changes: list[tuple[int, Plan, Plan]]
    decision_ms: list[float]
    rollbacks: int
    final_plan: Plan


@dataclass
class SimResult:
    """The metrics of one policy on one scenario and seed (the CLI's JSON fields).

    Attributes:
        scenario: The scenario name.
        seed: The noise seed.
        policy: The policy name.
        throughput: Samples per simulated second over the whole run.
        limit_throughput: The oracle's throughput on the same seed.
        efficiency: ``throughput / limit_throughput``.
        time_to_90pct_windows: Index (0-based) of the first window whose mean step time is
            within ``1 / 0.9`` of the oracle's in the same window, or None.
        rescales: Plan changes (0 for even and oracle).
        rollbacks: Rollbacks among them.
        false_rescales: Plan changes while no event is active and the plan's noise-free step
            time is already within 2% of the oracle's.
        detection_delay_windows: Per event, windows from the event's start to the first plan
            change after it (None if none).
        decision_ms_p50: Median wall-clock time of one ``observe`` call.
        decision_ms_p99: Its 99th percentile.
        final_plan: The plan at the end of the run.
        window_step_s: Per-window mean step times (not part of the JSON output).
    """

    scenario: str
    seed: int
    policy: str
    throughput: float
    limit_throughput: float
    efficiency: float
    time_to_90pct_windows: int | None
    rescales: int
    rollbacks: int
    false_rescales: int
    detection_delay_windows: list[int | None]
    decision_ms_p50: float
    decision_ms_p99: float
    final_plan: list[int]
    window_step_s: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields of the CLI schema."""
        d = asdict(self)
        for k in ("scenario", "seed", "policy", "window_step_s"):
            d.pop(k)
        return d


def _noise(
    rng: np.random.Generator, state: np.ndarray, k: int, cv: float, rho: float
) -> np.ndarray:
    """Advance the per-rank AR(1) log-noise ``k`` steps; returns factors, updates ``state``."""
    sigma = float(np.sqrt(np.log1p(cv * cv)))
    e = rng.standard_normal((state.size, k)) * sigma * np.sqrt(1.0 - rho * rho)
    out = np.empty((state.size, k))
    x = state
    for j in range(k):
        x = rho * x + e[:, j]
        out[:, j] = x
    state[:] = x
    return np.exp(out - 0.5 * sigma * sigma)


def simulate(scenario: Scenario, policy: Policy, seed: int) -> Trace:
    """Run one policy through a scenario.

    Args:
        scenario: The scenario.
        policy: The policy (reset here).
        seed: Seeds the noise (and is passed to the policy).

    Returns:
        The :class:`Trace`.
    """
    s = scenario
    n = s.world_size
    plan = even_plan(s.global_batch, n)
    policy.reset(
        PolicyInfo(s.global_batch, n, s.window, s.min_size, tuple(s.max_sizes), plan, int(seed))
    )
    oracle = policy if isinstance(policy, OraclePolicy) else None
    rng = np.random.default_rng(int(seed))
    sigma = float(np.sqrt(np.log1p(s.noise.cv**2)))
    state = rng.standard_normal(n) * sigma
    rate = np.array([r.rate for r in s.ranks])
    over = np.array([r.overhead_s for r in s.ranks])
    knee = np.array([r.knee for r in s.ranks])
    bounds = sorted({0, s.steps} | {e.start for e in s.events} | {e.end for e in s.events})
    win_steps: list[float] = []
    changes: list[tuple[int, Plan, Plan]] = []
    decision_ms: list[float] = []
    total = 0.0
    for w, start in enumerate(range(0, s.steps, s.window)):
        end = min(start + s.window, s.steps)
        k = end - start
        noise = _noise(rng, state, k, s.noise.cv, s.noise.ar1)
        times = np.empty((n, k))
        cuts = [start] + [b for b in bounds if start < b < end] + [end]
        for a, b in itertools.pairwise(cuts):
            p = np.asarray(oracle.plan_at(a) if oracle is not None else plan)
            times[:, a - start : b - start] = ((over + np.maximum(p, knee) / rate) * s.factors(a))[
                :, None
            ]
        times *= noise
        steps = times.max(axis=0) + s.comm
        total += float(steps.sum())
        win_steps.append(float(steps.mean()))
        window_plan = oracle.plan_at(start) if oracle is not None else plan
        t0 = time.perf_counter()
        new = policy.observe(Window(times, window_plan, start, end))
        decision_ms.append((time.perf_counter() - t0) * 1e3)
        if oracle is None and new is not None:
            new = tuple(int(b) for b in new)
            if new != plan:
                changes.append((w + 1, new, plan))
                plan = new
    final = oracle.plan_at(s.steps - 1) if oracle is not None else plan
    return Trace(
        policy.name,
        win_steps,
        total,
        changes,
        decision_ms,
        int(getattr(policy, "rollbacks", 0)),
        tuple(final),
    )


def metrics(scenario: Scenario, trace: Trace, oracle: Trace, seed: int) -> SimResult:
    """Compute the :class:`SimResult` of a trace against the oracle's trace on the same seed.

    Args:
        scenario: The scenario both ran.
        trace: The policy's trace.
        oracle: The oracle's trace.
        seed: The seed.

    Returns:
        The result.
    """
    s = scenario
    samples = s.global_batch * s.steps
    thr = samples / trace.total_time_s
    lim = samples / oracle.total_time_s
    t90 = next(
        (
            i
            for i, (a, b) in enumerate(zip(trace.window_step_s, oracle.window_step_s))
            if a <= b / 0.9
        ),
        None,
    )
    ref = OraclePolicy(s)
    ref.reset(
        PolicyInfo(
            s.global_batch,
            s.world_size,
            s.window,
            s.min_size,
            tuple(s.max_sizes),
            even_plan(s.global_batch, s.world_size),
            seed,
        )
    )
    false = 0
    for w, _new, before in trace.changes:
        step = w * s.window
        if s.event_active(step):
            continue
        cur = float(s.compute_times(np.asarray(before), step).max()) + s.comm
        best = float(s.compute_times(np.asarray(ref.plan_at(step)), step).max()) + s.comm
        false += cur <= best * 1.02
    delays: list[int | None] = []
    for e in s.events:
        w0 = e.start // s.window
        after = [w for w, _, _ in trace.changes if w * s.window > e.start]
        delays.append(after[0] - w0 if after else None)
    ms = np.asarray(trace.decision_ms) if trace.decision_ms else np.zeros(1)
    no_rescale = trace.policy in ("even", "oracle")
    return SimResult(
        scenario=s.name,
        seed=int(seed),
        policy=trace.policy,
        throughput=float(thr),
        limit_throughput=float(lim),
        efficiency=float(thr / lim),
        time_to_90pct_windows=t90,
        rescales=0 if no_rescale else len(trace.changes),
        rollbacks=trace.rollbacks,
        false_rescales=0 if no_rescale else int(false),
        detection_delay_windows=[None] * len(s.events) if no_rescale else delays,
        decision_ms_p50=float(np.percentile(ms, 50)),
        decision_ms_p99=float(np.percentile(ms, 99)),
        final_plan=list(trace.final_plan),
        window_step_s=trace.window_step_s,
    )


def run(
    scenario: Scenario, policy: Policy | str, seed: int = 0, *, oracle: Trace | None = None
) -> SimResult:
    """Simulate a policy and score it against the oracle on the same seed.

    Args:
        scenario: The scenario.
        policy: A policy object (see :mod:`lightning_rex.sim.policies`) or a built-in name.
        seed: The noise seed.
        oracle: A precomputed oracle trace for this scenario and seed, to save its run.

    Returns:
        The :class:`SimResult`.
    """
    pol = make_policy(policy, scenario) if isinstance(policy, str) else policy
    if oracle is None:
        oracle = simulate(scenario, OraclePolicy(scenario), seed)
    trace = oracle if isinstance(pol, OraclePolicy) else simulate(scenario, pol, seed)
    return metrics(scenario, trace, oracle, seed)
