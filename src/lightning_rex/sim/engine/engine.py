"""The synchronous step loop: noise, events and the window driver (scoring: :mod:`.scoring`).

Every step, every rank's compute time is its noise-free curve at its micro-batch, times the
active event factors, times a mean-one lognormal AR(1) noise factor; the synchronous step
takes the slowest rank's time plus ``comm``. Each step's times go to the same
:class:`~lightning_rex.driver.loop.WindowDriver` that training runs, with all ranks hosted
in this process (:class:`~lightning_rex.driver.protocols.LocalCollectives`) and the plan
schedule as the plan target. So a simulated policy pays what it pays in training: the
warm-up is not measured, a decision is exchanged ``decision_lag`` steps after its window,
a new plan applies from the next step, and the samples measured before it are dropped. The
decider runs inline (``background=False``), as a deterministic stand-in for the training
thread. The noise of a seed does not depend on the policy, so every policy (and the oracle
that sets the limit) runs on the same noise. A scenario's pass caps (its memory, see
:mod:`~lightning_rex.sim.scenarios.memory`) reach the driver as training's do, in every window row's
cap column, and a capped rank's time is the sum of its accumulation passes' times.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.plan import Plan, even_plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec
from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.protocols import Decider, LocalCollectives, ScheduleTarget
from lightning_rex.driver.scheduling import schedule_agreed
from lightning_rex.sim.engine.times import ScenarioTimes
from lightning_rex.sim.policies.base import Policy, PolicyInfo, as_policy, device_keys
from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = ["LoopRun", "Trace", "decider_for", "default_loop", "run_loop", "simulate"]

StepTimes = Callable[[int, np.ndarray], np.ndarray]
StepHook = Callable[[int, np.ndarray, Plan], "Plan | None"]
AfterStep = Callable[[int, Plan], bool]


@dataclass
class Trace:
    """What one policy did in one run (:func:`~lightning_rex.sim.engine.scoring.metrics` scores it).

    Attributes:
        policy: The policy's name.
        window_step_s: Mean synchronous step time of every ``window``-step chunk of the run.
        total_time_s: Simulated seconds of the whole run.
        changes: ``(first step, new plan, plan before)`` for every plan change.
        decision_ms: Wall-clock milliseconds of every decision (one per window).
        rollbacks: Rollbacks among the decisions.
        final_plan: The plan in force at the end.
        records: The driver's window records, as training writes them.
        profile_s: Simulated seconds of the profiling steps the policy asked for before
            training (included in ``total_time_s``).
        shape_change_s_total: Seconds charged for new micro-batch shapes, summed over ranks.
    """

    policy: str
    window_step_s: list[float]
    total_time_s: float
    changes: list[tuple[int, Plan, Plan]]
    decision_ms: list[float]
    rollbacks: int
    final_plan: Plan
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    profile_s: float = 0.0
    shape_change_s_total: float = 0.0


class PolicyDecider:
    """A baseline policy (a plan or None per window) as the driver's decider.

    Args:
        policy: The policy; a plan it returns that differs from the window's is a proposal.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def observe(self, window: Window) -> Decision:
        """Ask the policy.

        Args:
            window: The window.

        Returns:
            A propose with the policy's plan, or a hold.
        """
        new = self.policy.observe(window)
        plan = None if new is None else tuple(int(b) for b in new)
        measured = float(window.medians.max())
        if plan is None or plan == window.plan:
            return Decision("hold", None, None, measured, None, "", window.step_end)
        return Decision("propose", plan, None, measured, None, self.policy.name, window.step_end)

    def decline(self) -> None:
        """Baselines keep no expectation of their own."""

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        """Baselines take their bounds from :class:`PolicyInfo`."""

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        """Baselines take their pass caps from :class:`PolicyInfo`."""

    def state_dict(self) -> dict[str, Any]:
        """No state is saved."""
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """No state to restore."""

    def rank_model_summary(self) -> dict[str, list[float]]:
        """Baselines fit no rank model."""
        return {}

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        """Baselines fit no rank model."""
        return None


class _Timed:
    """Time every decision of a decider (wall-clock milliseconds)."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.ms: list[float] = []

    def observe(self, window: Window) -> Decision:
        start = time.perf_counter()
        decision = self.decider.observe(window)
        self.ms.append((time.perf_counter() - start) * 1e3)
        return decision

    def decline(self) -> None:
        self.decider.decline()

    def set_bounds(self, min_size: int, max_sizes: Sequence[int | None] | None) -> None:
        self.decider.set_bounds(min_size, max_sizes)

    def set_pass_caps(self, pass_caps: Sequence[int | None] | None) -> None:
        self.decider.set_pass_caps(pass_caps)

    def state_dict(self) -> dict[str, Any]:
        return self.decider.state_dict()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.decider.load_state_dict(d)

    def rank_model_summary(self) -> dict[str, list[float]]:
        return self.decider.rank_model_summary()

    def even_split_estimate(self) -> tuple[float, float, float] | None:
        return self.decider.even_split_estimate()


@dataclass
class LoopRun:
    """What :func:`run_loop` returns.

    Attributes:
        step_s: Every step's synchronous time (slowest rank plus ``comm``), seconds.
        schedule: The plan schedule's entries at the end.
        records: The driver's window records.
        decision_ms: Wall-clock milliseconds of every decision.
    """

    step_s: np.ndarray
    schedule: list[tuple[int, Plan]]
    records: list[dict[str, Any]]
    decision_ms: list[float]


def run_loop(
    global_batch: int,
    world_size: int,
    steps: int,
    step_times: StepTimes,
    decider: Decider,
    loop: LoopConfig,
    *,
    min_size: int = 1,
    comm: float = 0.0,
    initial_plan: Plan | None = None,
    on_step: StepHook | None = None,
    devices: Sequence[str | None] | None = None,
    batch_range: tuple[int, int] | None = None,
    after_step: AfterStep | None = None,
    pass_caps: Sequence[int | None] | None = None,
) -> LoopRun:
    """Drive the window loop through ``steps`` steps on per-rank times from a function.

    The scenario engine and replays of recorded times both run through here, so a run of
    the simulator is a run of the training loop with other step times.

    Args:
        global_batch: ``B``.
        world_size: ``N``.
        steps: The number of steps.
        step_times: ``step_times(step, plan)`` gives every rank's own compute time at
            ``step`` under ``plan`` (an int array of shape ``(N,)``), shape ``(N,)`` seconds.
        decider: Decides on windows (rank 0's).
        loop: The window loop's settings.
        min_size: The smallest micro-batch.
        comm: Seconds added to every synchronous step.
        initial_plan: The plan at step 0; default the even plan.
        on_step: Called after every step with ``(step, times, plan)``; a plan it returns
            applies from the next step, with no lag (a per-step rule that runs between
            steps on every rank, such as LBB's).
        devices: Each rank's device label (training's device keys), or None (one kind).
        batch_range: ``(min, max)`` global batches plans may sum to (global batch scaling),
            or None: every plan sums to ``global_batch``.
        after_step: Called after every step with ``(step, plan)``; True ends the run there
            (a workload's target reached). ``step_s`` then holds the steps run.
        pass_caps: Each rank's pass cap (memory), reported in every window row as
            training's ranks report theirs, or None (no caps).

    Returns:
        The run.
    """
    first = initial_plan or even_plan(global_batch, world_size)
    schedule = PlanSchedule(first, global_batch, SizeBounds(min_size), batch_range=batch_range)
    target = ScheduleTarget(schedule)
    timed = _Timed(decider)
    clock = [0.0]
    collectives = LocalCollectives(world_size)
    driver = WindowDriver(
        loop,
        collectives,
        target,
        lambda plan, bounds: timed,
        clock=lambda: clock[0],
        caps=None if pass_caps is None else (lambda: list(pass_caps)),
    )
    labels = [None] * world_size if devices is None else list(devices)
    driver.start(0, device_keys(labels))
    out = np.empty(steps)
    ran = steps
    plan_arr, plan = np.asarray(schedule.plan_at(0)), schedule.plan_at(0)
    for step in range(steps):
        target.now = step
        now = schedule.plan_at(step)
        if now is not plan:
            plan, plan_arr = now, np.asarray(now)
        rank_times = step_times(step, plan_arr)
        out[step] = float(rank_times.max()) + comm
        clock[0] += out[step]
        driver.record(step, rank_times)
        if on_step is not None and step + 1 < steps:
            new = on_step(step, rank_times, plan)
            if new is not None and tuple(new) != plan:  # through the plan target, as training
                schedule_agreed(collectives, target, new, step + 1)
        if after_step is not None and after_step(step, plan):
            ran = step + 1
            break
    driver.finish()
    return LoopRun(out[:ran], schedule.entries, driver.records, timed.ms)


def default_loop(
    scenario: Scenario,
    policy: Policy | None = None,
    *,
    warmup: int | None = None,
    decision_lag: int | None = None,
    max_warmup: int | None = None,
) -> LoopConfig:
    """The window loop the simulator runs: training's defaults, with the scenario's window.

    Args:
        scenario: The scenario.
        policy: The policy; its ``looks_for(window)`` (looks per window) sets how often the
            loop gathers; None: once per window.
        warmup: Unmeasured steps at the start; None for training's default (1).
        decision_lag: Steps from a gather to the exchange; None for ``segment // 2``.
        max_warmup: The most steps the warm-up lasts while steps get faster; None for
            training's default (see :class:`~lightning_rex.driver.config.LoopConfig`).

    Returns:
        ``window`` from the scenario, the policy's looks, inline decisions.

    Raises:
        ValueError: For settings the loop rejects (see
            :class:`~lightning_rex.driver.config.LoopConfig`).
    """
    window = WindowSpec(
        scenario.window,
        1 if policy is None else int(policy.looks_for(scenario.window)),
        WindowSpec.warmup if warmup is None else warmup,
        WindowSpec.max_warmup if max_warmup is None else max_warmup,
    )
    return LoopConfig(
        window,
        decision_lag=decision_lag,
        background=False,
        estimate=False,  # the engine knows the true times: the oracle is its baseline
    )


def decider_for(policy: Policy) -> Decider:
    """The decider the window loop drives for a policy: rex's own, or the policy's windows.

    Args:
        policy: The policy (reset).

    Returns:
        The decider.
    """
    own = policy.decider()  # rex: the decider the builder made, driven as in training
    return own if own is not None else PolicyDecider(policy)


def simulate(
    scenario: Scenario, policy: Policy, seed: int, *, loop: LoopConfig | None = None
) -> Trace:
    """Run one policy through a scenario, on the training loop's driver.

    Args:
        scenario: The scenario.
        policy: The policy (reset here).
        seed: Seeds the noise (and is passed to the policy).
        loop: The window loop's settings; default :func:`default_loop`.

    Returns:
        The :class:`Trace`.
    """
    world_size = scenario.world_size
    plan = even_plan(scenario.global_batch, world_size)
    policy = as_policy(policy)
    loop = loop or default_loop(scenario, policy)  # its window is the one rex's controller gets
    info = PolicyInfo(
        scenario.global_batch,
        world_size,
        scenario.window,
        scenario.min_size,
        tuple(scenario.max_sizes),
        plan,
        int(seed),
        scenario.epoch_steps,
        scenario.devices,
        scenario.shape_change_s,
        scenario.shape_cache,
        pass_caps=None if scenario.pass_caps is None else tuple(scenario.pass_caps),
        loop_window=loop.window,
    )
    policy.reset(info)
    if policy.knows_the_curves:
        times = ScenarioTimes(scenario, seed, policy.plan_at(0))
        return _oracle(scenario, policy, times)
    times = ScenarioTimes(scenario, seed, plan)
    profile_s, first = _profile(policy, times)
    first = first if first is not None else policy.start_plan
    res = run_loop(
        scenario.global_batch,
        world_size,
        scenario.steps,
        times,
        decider_for(policy),
        loop,
        min_size=scenario.min_size,
        comm=scenario.comm,
        initial_plan=first,
        on_step=policy.observe_step,
        devices=scenario.devices,
        pass_caps=scenario.pass_caps,
    )
    changes = [(st, p, prev) for (_, prev), (st, p) in itertools.pairwise(res.schedule)]
    return Trace(
        policy.name,
        _chunks(res.step_s, scenario.window),
        float(res.step_s.sum()) + profile_s,
        changes,
        res.decision_ms,
        sum(r["decision"] == "rollback" for r in res.records) + policy.rollbacks,
        res.schedule[-1][1],
        res.records,
        profile_s,
        times.shape_change_s_total,
    )


def _profile(policy: Policy, times: ScenarioTimes) -> tuple[float, Plan | None]:
    """Run the profiling steps a policy asks for; returns their seconds and its first plan."""
    ask = policy.profiling_plan()
    if ask is None:
        return 0.0, None
    sizes = np.asarray(ask, dtype=np.int64).reshape(-1, times.s.world_size)
    measured = times.profile(sizes)
    first = policy.observe_profile(sizes, measured)
    # profiling runs each rank on its own (no all-reduce): a step lasts its slowest rank
    seconds = float(measured.max(axis=1).sum()) if len(measured) else 0.0
    return seconds, None if first is None else tuple(int(b) for b in first)


def _oracle(s: Scenario, oracle: Policy, times: ScenarioTimes) -> Trace:
    """The oracle switches at every event boundary, with no loop, lag or measurement."""
    out = np.empty(s.steps)
    for step in range(s.steps):
        out[step] = float(times(step, np.asarray(oracle.plan_at(step))).max()) + s.comm
    final = oracle.plan_at(s.steps - 1)
    return Trace(
        oracle.name,
        _chunks(out, s.window),
        float(out.sum()),
        [],
        [],
        0,
        tuple(final),
        shape_change_s_total=times.shape_change_s_total,
    )


def _chunks(step_s: np.ndarray, window: int) -> list[float]:
    return [float(step_s[i : i + window].mean()) for i in range(0, step_s.size, window)]
