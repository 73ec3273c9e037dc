"""The score of a simulated run: a policy's metrics against the oracle on the same noise.

:func:`run` simulates a policy (:func:`~lightning_rex.sim.engine.engine.simulate`) and scores it;
:func:`metrics` scores a trace: throughput against the oracle's limit, efficiency over the
whole run and at steady state, time to 90% of the limit, rescales, false rescales, the
delay to act on each event, and the decision latency.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lightning_rex.core.plans.plan import even_plan
from lightning_rex.driver.config import LoopConfig
from lightning_rex.sim.engine.engine import Trace, simulate
from lightning_rex.sim.policies.base import Policy, PolicyInfo, as_policy
from lightning_rex.sim.policies.builtin import OraclePolicy, make_policy
from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = ["SimResult", "metrics", "run", "scored_run"]


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
        steady_efficiency: The same ratio over the last 90% of the run's ``window``-step
            chunks (the oracle's time over the policy's): the cold start from the even plan,
            the warm-up and the first decisions' lag left out.
        time_to_90pct_windows: Index (0-based) of the first ``window``-step chunk from which
            every chunk's mean step time stays within ``1 / 0.9`` of the oracle's in the same
            chunk, or None if the last chunk is not.
        rescales: Plan changes the policy made (0 for even and oracle).
        plan_changes: Steps on which any rank's micro-batch size changed.
        shape_change_s_total: Seconds charged for new micro-batch shapes, over all ranks.
        profile_s: Seconds of profiling steps before training (in the throughput).
        rollbacks: Rollbacks among them.
        false_rescales: Plan changes made when the plan before was already within 2% of the
            oracle's noise-free step time for the curves in force at that step (events
            included: the oracle re-plans at every event boundary).
        detection_delay_windows: Per event, windows (``window`` steps, rounded up) from the
            event's start to the first plan change after it (None if none).
        decision_ms_p50: Median wall-clock time of one decision.
        decision_ms_p99: Its 99th percentile.
        final_plan: The plan at the end of the run.
        window_step_s: Per-chunk mean step times (not part of the JSON output).
    """

    scenario: str
    seed: int
    policy: str
    throughput: float
    limit_throughput: float
    efficiency: float
    steady_efficiency: float
    time_to_90pct_windows: int | None
    rescales: int
    plan_changes: int
    shape_change_s_total: float
    profile_s: float
    rollbacks: int
    false_rescales: int
    detection_delay_windows: list[int | None]
    decision_ms_p50: float
    decision_ms_p99: float
    final_plan: list[int]
    window_step_s: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields of the CLI schema."""
        data = asdict(self)
        for key in ("scenario", "seed", "policy", "window_step_s"):
            data.pop(key)
        return data


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
    scen = scenario
    samples = scen.global_batch * scen.steps
    thr = samples / trace.total_time_s
    lim = samples / oracle.total_time_s
    # the first window from which the run stays within 90% of the oracle (a run that falls
    # back below later is not counted as there)
    below = [
        i for i, (a, b) in enumerate(zip(trace.window_step_s, oracle.window_step_s)) if a > b / 0.9
    ]
    n_windows = len(trace.window_step_s)
    t90 = 0 if not below else (below[-1] + 1 if below[-1] + 1 < n_windows else None)
    ref = OraclePolicy(scen)
    ref.reset(
        PolicyInfo(
            scen.global_batch,
            scen.world_size,
            scen.window,
            scen.min_size,
            tuple(scen.max_sizes),
            even_plan(scen.global_batch, scen.world_size),
            seed,
        )
    )
    # every change counts, during events too: the oracle re-plans at event boundaries, so a
    # change is false when the plan before it was already within 2% of the oracle's plan for
    # the curves in force at that step
    false = 0
    for step, _new, before in trace.changes:
        cur = float(scen.compute_times(np.asarray(before), step).max()) + scen.comm
        best = float(scen.compute_times(np.asarray(ref.plan_at(step)), step).max()) + scen.comm
        false += cur <= best * 1.02
    delays: list[int | None] = []
    for event in scen.events:
        after = [st for st, _, _ in trace.changes if st > event.start]
        delays.append(math.ceil((after[0] - event.start) / scen.window) if after else None)
    first = len(trace.window_step_s) // 10
    steady = float(np.sum(oracle.window_step_s[first:]) / np.sum(trace.window_step_s[first:]))
    latencies = np.asarray(trace.decision_ms) if trace.decision_ms else np.zeros(1)
    no_rescale = trace.policy in ("even", "oracle")
    return SimResult(
        scenario=scen.name,
        seed=int(seed),
        policy=trace.policy,
        throughput=float(thr),
        limit_throughput=float(lim),
        efficiency=float(thr / lim),
        steady_efficiency=steady,
        time_to_90pct_windows=t90,
        rescales=0 if no_rescale else len(trace.changes),
        plan_changes=sum(1 for _, new, before in trace.changes if tuple(new) != tuple(before)),
        shape_change_s_total=trace.shape_change_s_total,
        profile_s=trace.profile_s,
        rollbacks=trace.rollbacks,
        false_rescales=0 if no_rescale else int(false),
        detection_delay_windows=[None] * len(scen.events) if no_rescale else delays,
        decision_ms_p50=float(np.percentile(latencies, 50)),
        decision_ms_p99=float(np.percentile(latencies, 99)),
        final_plan=list(trace.final_plan),
        window_step_s=trace.window_step_s,
    )


def scored_run(
    scenario: Scenario,
    policy: Policy | str,
    seed: int = 0,
    *,
    oracle: Trace | None = None,
    loop: LoopConfig | None = None,
) -> tuple[SimResult, Trace]:
    """Simulate a policy and score it against the oracle on the same seed, keeping its trace.

    Args:
        scenario: The scenario.
        policy: A policy object (see :mod:`lightning_rex.sim.policies.builtin`) or a built-in name.
        seed: The noise seed.
        oracle: A precomputed oracle trace for this scenario and seed, to save its run.
        loop: The window loop's settings; default
            :func:`~lightning_rex.sim.engine.engine.default_loop`.

    Returns:
        The :class:`SimResult` and the policy's :class:`~lightning_rex.sim.engine.engine.Trace`
        (with its window records).
    """
    pol = make_policy(policy, scenario) if isinstance(policy, str) else policy
    if oracle is None:
        oracle = simulate(scenario, OraclePolicy(scenario), seed)
    knows = as_policy(pol).knows_the_curves  # scored directly, as the oracle's trace is
    trace = oracle if knows else simulate(scenario, pol, seed, loop=loop)
    return metrics(scenario, trace, oracle, seed), trace


def run(
    scenario: Scenario,
    policy: Policy | str,
    seed: int = 0,
    *,
    oracle: Trace | None = None,
    loop: LoopConfig | None = None,
) -> SimResult:
    """Simulate a policy and score it against the oracle on the same seed.

    Args:
        scenario: The scenario.
        policy: A policy object (see :mod:`lightning_rex.sim.policies.builtin`) or a built-in name.
        seed: The noise seed.
        oracle: A precomputed oracle trace for this scenario and seed, to save its run.
        loop: The window loop's settings; default
            :func:`~lightning_rex.sim.engine.engine.default_loop`.

    Returns:
        The :class:`SimResult`.
    """
    return scored_run(scenario, policy, seed, oracle=oracle, loop=loop)[0]
