"""Time to a training target under global batch policies: goodput in the simulator.

On a scenario with a ``workload`` (:mod:`lightning_rex.sim.scenarios.workload`), :func:`run_goodput`
runs a global batch policy through the same window loop as every other policy
(:func:`~lightning_rex.sim.engine.engine.run_loop`), on the scenario's noisy step times, and ends
the run when the workload's progress reaches its target. Every step advances the progress by
``B * E(B)`` at the batch in force, and hands the policy that step's gradient norms as
training measures them. The policies:

* ``fixed``: ``B0`` (the scenario's ``global_batch``) throughout, split by rex's controller
  (global batch scaling off): what a user who leaves scaling off gets;
* ``hindsight``: the best fixed batch, found with hindsight by a scan of the noise-free
  curves and the workload (:func:`hindsight_batch`), run from the first step with the
  oracle's plan for it: the limit of any fixed choice;
* ``pollux``: Pollux's goodput-optimal batch, re-chosen every 30 s, with its even split
  (:class:`~lightning_rex.sim.policies.pollux.PolluxPolicy`);
* ``pollux-split``: the same batch choice, each batch split by the oracle's minimax plan
  (:func:`~lightning_rex.sim.policies.builtin.oracle_plan`): what Pollux's choice reaches once the
  split is as good as it gets;
* ``pollux-rex``: the same batch choice, each batch split by rex's own plan controller
  (:class:`~lightning_rex.sim.policies.pollux_rex.PolluxRexPolicy`): rex and it share the
  split and all it costs, so that rex against it measures rex's batch choice alone;
* ``adaptive-oracle``: the goodput-optimal batch and its minimax plan at every step, from
  the true statistics and curves (:class:`~lightning_rex.sim.policies.adaptive_oracle.
  AdaptiveOraclePolicy`): the limit of the goodput problem;
* ``rex``: :class:`~lightning_rex.sim.policies.builtin.RexPolicy` with global batch scaling on over
  the workload's batch range: the :class:`~lightning_rex.core.scaling.scaling_decider.
  ScalingDecider` that :func:`~lightning_rex.core.build.build_decider` builds for training,
  fed the same per-step gradient norms.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from lightning_rex.core.plans.plan import Plan, even_plan
from lightning_rex.driver.config import LoopConfig
from lightning_rex.sim.engine.engine import decider_for, default_loop, run_loop
from lightning_rex.sim.engine.time_parts import LimitCurve, time_parts
from lightning_rex.sim.engine.times import ScenarioTimes
from lightning_rex.sim.policies.adaptive_oracle import AdaptiveOraclePolicy
from lightning_rex.sim.policies.base import Policy, PolicyInfo
from lightning_rex.sim.policies.builtin import EvenPolicy, RexPolicy, oracle_plan, oracle_step_s
from lightning_rex.sim.policies.pollux import PolluxPolicy
from lightning_rex.sim.policies.pollux_rex import PolluxRexPolicy
from lightning_rex.sim.scenarios.scenario import Scenario
from lightning_rex.sim.scenarios.workload import GradientNorms, Workload

__all__ = [
    "BATCH_POLICIES",
    "GoodputResult",
    "hindsight_batch",
    "limit_curve",
    "run_goodput",
]

BATCH_POLICIES = (
    "fixed",
    "hindsight",
    "pollux",
    "pollux-split",
    "pollux-rex",
    "adaptive-oracle",
    "rex",
)
"""The global batch policies :func:`run_goodput` runs."""

_SCAN = 32
"""Batch sizes the hindsight scan tries (geometric over the range, with ``B0``)."""


@dataclass
class GoodputResult:
    """One global batch policy's run to the target (the CLI's JSON fields).

    Attributes:
        scenario: The scenario name.
        seed: The noise seed.
        policy: The policy name.
        time_to_target_s: Simulated seconds to the target, or None when the run's ``steps``
            ended first.
        steps: Steps run.
        reached: Whether the target was reached.
        mean_batch: The global batch averaged over the steps.
        final_batch: The global batch at the end.
        batch_changes: Changes of the global batch applied.
        first_batch_change_step: The first step at another batch than the start's, or None.
        rollbacks: Decisions that rolled a change back (rex's).
        decision_ms_p50: Median wall-clock milliseconds of one window decision (rex, fixed).
        decision_ms_p99: Their 99th percentile.
        batches: ``[first step, global batch]`` of every batch in force.
        time_parts: Where the time to target went, seconds per part
            (:func:`~lightning_rex.sim.engine.time_parts.time_parts`), or None when the
            target was not reached.
    """

    scenario: str
    seed: int
    policy: str
    time_to_target_s: float | None
    steps: int
    reached: bool
    mean_batch: float
    final_batch: int
    batch_changes: int
    first_batch_change_step: int | None
    rollbacks: int
    decision_ms_p50: float
    decision_ms_p99: float
    batches: list[list[int]] = field(default_factory=list)
    time_parts: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields (without scenario, seed and policy, which key them)."""
        data = asdict(self)
        for key in ("scenario", "seed", "policy"):
            data.pop(key)
        return data


def _workload(s: Scenario) -> Workload:
    if s.workload is None:
        raise ValueError(
            f"scenario {s.name!r} has no workload: global batch policies need one (see "
            "lightning_rex.sim.scenarios.workload)"
        )
    return s.workload


def _info(s: Scenario, seed: int, batch: int, batch_range: tuple[int, int] | None) -> PolicyInfo:
    return PolicyInfo(
        batch,
        s.world_size,
        s.window,
        s.min_size,
        tuple(s.max_sizes),
        even_plan(batch, s.world_size),
        int(seed),
        s.epoch_steps,
        s.devices,
        s.shape_change_s,
        s.shape_cache,
        s.comm,
        batch_range,
        None if s.pass_caps is None else tuple(s.pass_caps),
    )


def limit_curve(s: Scenario) -> LimitCurve:
    """The oracle's split's noise-free step times over the scan's grid (and ``B0``).

    The grid is geometric over the workload's batch range, :data:`_SCAN` batches: what
    :func:`hindsight_batch` scans and what :func:`run_goodput`'s time parts take the best
    goodput over.

    Args:
        s: A workload scenario.

    Returns:
        The :class:`~lightning_rex.sim.engine.time_parts.LimitCurve`.

    Raises:
        ValueError: Without a workload.
    """
    low, high = _workload(s).batch_range
    grid = np.r_[np.round(np.geomspace(low, high, _SCAN)).astype(np.int64), s.global_batch]
    return LimitCurve.of(s, grid.tolist())


def hindsight_batch(s: Scenario, limit: LimitCurve | None = None) -> tuple[int, float]:
    """The fixed global batch with the least noise-free time to the target (a scan).

    Every batch of a geometric grid over the workload's range (and ``B0``) runs at the
    oracle's plan for it, on the noise-free curves; its progress per step follows the
    workload's statistics. This is the best fixed choice, made with hindsight.

    Args:
        s: A workload scenario.
        limit: :func:`limit_curve` of ``s``, when already computed.

    Returns:
        ``(batch, seconds to the target)``.

    Raises:
        ValueError: Without a workload, or when no batch reaches the target within the
            scenario's ``steps``.
    """
    workload = _workload(s)
    curve = limit_curve(s) if limit is None else limit
    grid, step_s = curve.batches, curve.step_s
    progress = np.zeros(grid.size)
    steps = np.zeros(grid.size, dtype=np.int64)
    batches = grid.astype(np.float64)
    for _ in range(s.steps):
        live = progress < workload.target_progress
        if not live.any():
            break
        phi = workload.noise_scales(progress)
        progress = np.where(
            live, progress + batches * workload.efficiency_at(batches, phi), progress
        )
        steps += live
    done = progress >= workload.target_progress
    if not done.any():
        raise ValueError(f"no fixed batch reaches the target within {s.steps} steps")
    total = np.where(done, steps * step_s, np.inf)
    best = int(np.argmin(total))
    return int(grid[best]), float(total[best])


def _policy(
    name: str, s: Scenario, seed: int, batch: int
) -> tuple[Policy, PolicyInfo, Plan, LoopConfig]:
    workload = _workload(s)
    if name == "fixed":
        pol: Policy = RexPolicy()
        info = _info(s, seed, s.global_batch, None)
    elif name == "hindsight":
        pol, info = EvenPolicy(), _info(s, seed, batch, None)
        info = PolicyInfo(**{**asdict(info), "initial_plan": oracle_plan(s, batch)})
    elif name == "pollux":
        pol, info = PolluxPolicy(), _info(s, seed, s.global_batch, workload.batch_range)
    elif name == "pollux-split":
        split = functools.cache(functools.partial(oracle_plan, s))
        pol, info = PolluxPolicy(split), _info(s, seed, s.global_batch, workload.batch_range)
    elif name == "pollux-rex":
        pol, info = PolluxRexPolicy(), _info(s, seed, s.global_batch, workload.batch_range)
    elif name == "adaptive-oracle":
        pol, info = AdaptiveOraclePolicy(s), _info(s, seed, s.global_batch, workload.batch_range)
    elif name == "rex":
        pol, info = RexPolicy(), _info(s, seed, s.global_batch, workload.batch_range)
    else:
        raise ValueError(f"unknown batch policy {name!r}; choose from {', '.join(BATCH_POLICIES)}")
    loop = default_loop(s, pol)  # its window is the one rex's controller gets
    info = replace(info, loop_window=loop.window)
    pol.reset(info)
    return pol, info, pol.start_plan or info.initial_plan, loop


def run_goodput(
    s: Scenario,
    policy: str,
    seed: int = 0,
    *,
    hindsight: int | None = None,
    limit: LimitCurve | None = None,
) -> GoodputResult:
    """Run a global batch policy on a workload scenario until its target.

    Args:
        s: The scenario (with a workload).
        policy: One of :data:`BATCH_POLICIES`.
        seed: Seeds the step-time noise and the gradient draws (every policy gets the same).
        hindsight: The hindsight batch, when already scanned (:func:`hindsight_batch`).
        limit: :func:`limit_curve` of ``s``, when already computed (for the time parts).

    Returns:
        The :class:`GoodputResult`.

    Raises:
        ValueError: For an unknown policy or a scenario without a workload.
    """
    workload = _workload(s)
    batch = s.global_batch
    if limit is None:
        limit = limit_curve(s)
    if policy == "hindsight":
        batch = hindsight if hindsight is not None else hindsight_batch(s, limit)[0]
    pol, info, first, loop = _policy(policy, s, seed, batch)
    times = ScenarioTimes(s, seed, first)
    norms = GradientNorms(workload, seed)
    progress = [0.0]
    per_step: list[int] = []

    def after_step(step: int, plan: Plan) -> bool:
        global_batch = sum(plan)
        per_step.append(global_batch)
        local, glob = norms.draw(plan, progress[0])
        pol.observe_gradients(step, local, glob, plan)
        progress[0] += workload.step_progress(global_batch, progress[0])
        pol.observe_progress(min(1.0, progress[0] / workload.target_progress))
        return progress[0] >= workload.target_progress

    res = run_loop(
        sum(first),
        s.world_size,
        s.steps,
        times,
        decider_for(pol),
        loop,
        min_size=s.min_size,
        comm=s.comm,
        initial_plan=first,
        on_step=pol.observe_step,
        devices=s.devices,
        batch_range=info.batch_range,
        after_step=after_step,
        pass_caps=s.pass_caps,
    )
    ran = len(per_step)
    sizes = np.asarray(per_step)
    change = np.flatnonzero(sizes != sizes[0])
    moves = [[0, int(sizes[0])]] + [
        [int(i), int(sizes[i])] for i in np.flatnonzero(np.diff(sizes)) + 1
    ]
    latencies_ms = np.asarray(res.decision_ms) if res.decision_ms else np.zeros(1)
    reached = progress[0] >= workload.target_progress
    known = dict(zip(limit.batches.tolist(), limit.step_s.tolist()))

    def noise_free_s(b: int) -> float:
        if b not in known:
            known[b] = float(oracle_step_s(s, [oracle_plan(s, b)])[0])
        return known[b]

    parts = time_parts(workload, limit, noise_free_s, res.step_s[:ran], sizes) if reached else None
    return GoodputResult(
        scenario=s.name,
        seed=int(seed),
        policy=policy,
        time_to_target_s=float(res.step_s.sum()) if reached else None,
        steps=ran,
        reached=bool(reached),
        mean_batch=float(sizes.mean()),
        final_batch=int(sizes[-1]),
        batch_changes=len(moves) - 1,
        first_batch_change_step=int(change[0]) if change.size else None,
        rollbacks=sum(r["decision"] == "rollback" for r in res.records),
        decision_ms_p50=float(np.percentile(latencies_ms, 50)),
        decision_ms_p99=float(np.percentile(latencies_ms, 99)),
        batches=moves,
        time_parts=parts,
    )
