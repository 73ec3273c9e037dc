"""Rescaling policies the simulator can drive, all behind one interface.

Every policy subclasses :class:`~lightning_rex.sim.policies.base.PolicyBase` (the hooks the engine
calls, with no-op defaults; see :mod:`lightning_rex.sim.policies.base`); the oracle also has
``plan_at(step) -> Plan``, which the engine consults at every step so that it can switch
exactly at event boundaries. :func:`make_policy` builds one by name, the published peers
(:mod:`~lightning_rex.sim.policies.lbb`, :mod:`~lightning_rex.sim.policies.omnilearn`) included.

Built in: ``even`` (what DDP does), ``static`` (LBB-like: profile two windows, fit an affine
time per rank, solve once), ``proportional`` (OmniLearn-like:
``db_r = -(b_r / t_r)(t_r - mean t)`` once a window, with a 20% deadband), ``throughput``
(memory-blind: shares proportional to each rank's throughput measured under the even plan,
set once), ``rex`` (the decider :func:`~lightning_rex.core.build.build_decider` builds, as in
training: the driver runs it itself) and ``oracle`` (knows the noise-free curves, the events
and the pass caps, and re-plans at every event boundary, outside the loop: it sets the
limit).

Pass caps (a scenario's memory, :mod:`~lightning_rex.sim.scenarios.memory`) bound no policy's
plan: a rank given more than its cap accumulates, and the engine times its passes. Only the oracle
and rex price that; the baselines are memory-blind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_rex.core import build
from lightning_rex.core.plans.minimax import (
    affine_plan,
    minimax_plan,
    plan_from_device_rates,
    repair_plan,
    resolve_bounds,
)
from lightning_rex.core.plans.plan import Plan, even_plan, round_fractions
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window import Window
from lightning_rex.driver.protocols import Decider
from lightning_rex.sim.policies.base import Policy, PolicyBase, PolicyInfo, device_keys
from lightning_rex.sim.policies.lbb import LBBPolicy
from lightning_rex.sim.policies.omnilearn import OmniLearnPolicy
from lightning_rex.sim.scenarios.scenario import Scenario

__all__ = [
    "EvenPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyInfo",
    "ProportionalPolicy",
    "RexPolicy",
    "StaticPolicy",
    "ThroughputPolicy",
    "make_policy",
    "oracle_plan",
    "oracle_step_s",
]


def _bounds(info: PolicyInfo) -> tuple[np.ndarray, np.ndarray]:
    return resolve_bounds(info.world_size, info.global_batch, info.min_size, info.max_sizes)


def fit_plan(sizes: np.ndarray, info: PolicyInfo) -> Plan:
    """Round real sizes to an integer plan summing to ``B`` inside the bounds.

    Args:
        sizes: Desired real sizes, shape ``(N,)``.
        info: The run's bounds.

    Returns:
        The nearest feasible plan (largest remainder, then :func:`repair_plan`).
    """
    low, high = _bounds(info)
    want = np.asarray(sizes, dtype=np.float64)
    shares = want / want.sum() * info.global_batch
    for _ in range(info.world_size):  # clip to the caps, re-share the excess in proportion
        clipped = np.clip(shares, low, high)
        excess = info.global_batch - clipped.sum()
        free = (clipped < high) & (clipped > low) if excess > 0 else (clipped > low)
        if abs(excess) < 1e-9 or not free.any():
            shares = clipped
            break
        clipped[free] += excess * clipped[free] / clipped[free].sum()
        shares = clipped
    plan = np.asarray(
        round_fractions(list(shares / shares.sum()), info.global_batch, info.min_size)
    )
    return tuple(int(b) for b in repair_plan(plan, info.global_batch, low, high))


class EvenPolicy(PolicyBase):
    """DDP: the even split, never changed."""

    name = "even"

    def reset(self, info: PolicyInfo) -> None:
        """Nothing to prepare."""

    def observe(self, window: Window) -> Plan | None:
        """Never rescale."""
        return None


class StaticPolicy(PolicyBase):
    """LBB-like: profile at the start, fit, solve once.

    Window 0 (even plan) gives a proportional estimate; window 1 runs that plan, so every rank
    has two sizes; an affine time per rank is fitted from the two points and the minimax plan
    is applied for the rest of the run.
    """

    name = "static"

    def reset(self, info: PolicyInfo) -> None:
        """Start profiling."""
        self.info = info
        self.points: list[tuple[np.ndarray, np.ndarray]] = []

    def observe(self, window: Window) -> Plan | None:
        """Profile for two windows, then solve once."""
        if len(self.points) >= 2:
            return None
        self.points.append((np.asarray(window.plan, dtype=np.float64), window.medians.copy()))
        if len(self.points) == 1:
            sizes, times = self.points[0]
            return fit_plan(sizes / times, self.info)
        (sizes0, times0), (sizes1, times1) = self.points
        # Two sizes identify an affine time only when they differ enough; otherwise (and for a
        # non-positive slope) fall back to the proportional model through the last point.
        moved = np.abs(sizes1 - sizes0) >= np.maximum(2.0, 0.1 * sizes0)
        slope = np.where(
            moved, (times1 - times0) / np.where(moved, sizes1 - sizes0, 1.0), times1 / sizes1
        )
        slope = np.where(slope > 0, slope, times1 / sizes1)
        over = np.maximum(times1 - slope * sizes1, 0.0)
        low, high = _bounds(self.info)
        return affine_plan(over, slope, self.info.global_batch, low, high)


class ProportionalPolicy(PolicyBase):
    """OmniLearn-like proportional control once a window, with a 20% deadband.

    Args:
        deadband: No change while every rank's median is within this fraction of the mean.
    """

    name = "proportional"

    def __init__(self, deadband: float = 0.2) -> None:
        self.deadband = float(deadband)

    def reset(self, info: PolicyInfo) -> None:
        """Remember the bounds."""
        self.info = info

    def observe(self, window: Window) -> Plan | None:
        """Apply ``db_r = -(b_r / t_r)(t_r - mean t)`` when outside the deadband."""
        t = window.medians
        mean = float(t.mean())
        if float(np.max(np.abs(t - mean))) <= self.deadband * mean:
            return None
        b = np.asarray(window.plan, dtype=np.float64)
        new = b - (b / t) * (t - mean)
        plan = fit_plan(np.maximum(new, 1e-9), self.info)
        return plan if plan != window.plan else None


class ThroughputPolicy(PolicyBase):
    """Memory-blind proportional split: shares in proportion to measured throughput.

    After the first window (under the even plan) each rank gets a share of ``B`` in
    proportion to the samples per second it measured there (``b_r / t_r``), within the hard
    bounds, and the plan is kept for the rest of the run. It ignores the ranks' memory: a
    rank given more than its pass cap accumulates (the engine times its passes).
    """

    name = "throughput"

    def reset(self, info: PolicyInfo) -> None:
        """Wait for the first window."""
        self.info = info
        self.done = False

    def observe(self, window: Window) -> Plan | None:
        """Split in proportion to the first window's throughputs, once."""
        if self.done:
            return None
        self.done = True
        rates = np.asarray(window.plan, dtype=np.float64) / window.medians
        plan = fit_plan(rates, self.info)
        return plan if plan != window.plan else None


class RexPolicy(PolicyBase):
    """The REX core, built and driven exactly as training builds and drives it.

    The decider comes from :func:`~lightning_rex.core.build.build_decider`, the function
    :class:`~lightning_rex.RexCallback` calls, with the run's seed, window and device labels.

    Args:
        looks: Looks per window; None for training's default
            (:func:`~lightning_rex.core.settings.default_looks` of the scenario's window, 3
            for a window of 30). The simulator's loop gathers a segment every
            ``window // looks`` steps for this policy, and the controller may act before a
            window is whole.
        settings: The decision parameters; :class:`~lightning_rex.core.settings.
            DecisionSettings` defaults when None.
        prior: Rates per device identity (``sim:<device>``, as the simulator's records name
            them), for the first plan, as ``RexCallback(prior=...)`` gives training's
            (:func:`~lightning_rex.driver.prior.load_prior`); here it is in force from step 0
            (training's from the first step the loader has not yet prepared).
        **overrides: Fields of ``settings`` to replace (``persistence=3``, ...).
    """

    name = "rex"

    def __init__(
        self,
        looks: int | None = None,
        settings: DecisionSettings | None = None,
        prior: dict[str, list[float]] | None = None,
        **overrides: Any,
    ) -> None:
        settings = replace(settings or DecisionSettings(), **overrides)
        if looks is not None:
            settings = replace(settings, window=replace(settings.window, looks=looks))
        self.settings = settings
        self.prior = prior

    def looks_for(self, window: int) -> int:
        """Looks per window for a scenario's window (what the simulator's loop gathers).

        Args:
            window: Steps per window.

        Returns:
            The ``looks`` asked for, or training's default for that window.
        """
        return self.settings.window.for_steps(window).looks_per_window

    def reset(self, info: PolicyInfo) -> None:
        """Build a fresh decider for the run (the one builder training uses)."""
        # the scenario's shape cost is known here (training measures it at every change)
        settings = replace(
            self.settings,
            seed=info.seed,
            window=info.loop_window or self.settings.window.for_steps(info.window),
            shape_change_s=info.shape_change_s,
            shape_cache=info.shape_cache,
        )
        if info.batch_range is not None and settings.global_batch is None:
            # a workload scenario's batch range: global batch scaling with its defaults
            low, high = info.batch_range
            settings = replace(settings, global_batch=GlobalBatchScaling(low, high))
        bounds = SizeBounds(info.min_size).with_caps(info.max_sizes)
        self.start_plan = None
        if self.prior is not None:  # the plan training's driver computes from the prior
            self.start_plan = plan_from_device_rates(
                self.prior,
                device_keys(info.devices),
                info.global_batch,
                info.min_size,
                bounds.caps(info.world_size),
            )
        self.controller = build.build_decider(
            settings,
            self.start_plan or info.initial_plan,
            info.global_batch,
            bounds,
            info.devices,
        )

    def observe_gradients(
        self, step: int, weighted_local_sq: float, global_sq: float, plan: Plan
    ) -> None:
        """Hand a step's gradient norms to the global batch scaler (when it is on).

        Args:
            step: The step just run.
            weighted_local_sq: ``sum_r (b_r / B) |g_r|^2`` of the ranks' mean gradients.
            global_sq: ``|g|^2`` of the global mean gradient.
            plan: The plan it ran under.
        """
        if isinstance(self.controller, ScalingDecider):
            self.controller.add_gradient_norms(weighted_local_sq, global_sq, plan)

    def observe_progress(self, done: float) -> None:
        """Tell the global batch scaler how much of the run is done (when it is on).

        Args:
            done: The fraction of the workload's target reached, in ``[0, 1]``.
        """
        if isinstance(self.controller, ScalingDecider):
            self.controller.set_progress(done)

    def decider(self) -> Decider:
        """The controller the builder made: the loop drives it as training does.

        Returns:
            The decider (the controller, or the controller and the batch scaler).
        """
        return self.controller


class OraclePolicy(PolicyBase):
    """Knows the noise-free curves and the events; re-plans at every event boundary.

    The curves are the scenario's step times, accumulation passes included
    (:meth:`~lightning_rex.sim.scenarios.scenario.Scenario.time_table`): the oracle is memory-aware.

    Args:
        scenario: The scenario being run.
    """

    name = "oracle"
    knows_the_curves = True

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._cache: dict[tuple[float, ...], Plan] = {}

    def reset(self, info: PolicyInfo) -> None:
        """Remember the bounds."""
        self.info = info

    def plan_at(self, step: int) -> Plan:
        """The minimax plan for the noise-free curves in force at ``step``."""
        factors = self.scenario.factors(step)
        key = tuple(float(x) for x in factors)
        if key not in self._cache:
            low, high = _bounds(self.info)

            def times_at(sizes: np.ndarray) -> np.ndarray:
                return self.scenario.time_table(sizes, step)

            self._cache[key] = minimax_plan(times_at, self.info.global_batch, low, high)
        return self._cache[key]

    def observe(self, window: Window) -> Plan | None:
        """The engine asks :meth:`plan_at` instead."""
        return None


def oracle_plan(scenario: Scenario, batch: int) -> Plan:
    """The minimax plan for ``batch`` on the scenario's noise-free curves at step 0.

    Args:
        scenario: The scenario (its ranks, size bounds and curves).
        batch: The global batch.

    Returns:
        :class:`OraclePolicy`'s plan for ``batch`` at step 0.
    """
    scen = scenario
    oracle = OraclePolicy(scen)
    oracle.reset(
        PolicyInfo(
            batch,
            scen.world_size,
            scen.window,
            scen.min_size,
            tuple(scen.max_sizes),
            even_plan(batch, scen.world_size),
            0,
        )
    )
    return oracle.plan_at(0)


def oracle_step_s(scenario: Scenario, plans: Sequence[Plan]) -> np.ndarray:
    """Each plan's noise-free synchronous step time at step 0: slowest rank plus ``comm``.

    Args:
        scenario: The scenario.
        plans: The plans to time.

    Returns:
        Seconds per step, shape ``(len(plans),)``.
    """
    return np.array(
        [float(scenario.compute_times(np.asarray(p), 0).max()) + scenario.comm for p in plans]
    )


def make_policy(name: str, scenario: Scenario) -> Policy:
    """Build a built-in policy by name.

    Args:
        name: One of ``even``, ``static``, ``proportional``, ``throughput``, ``lbb``,
            ``omnilearn``, ``rex``, ``oracle``.
        scenario: The scenario (the oracle needs it).

    Returns:
        A fresh policy.

    Raises:
        ValueError: For an unknown name.
    """
    if name == "even":
        return EvenPolicy()
    if name == "static":
        return StaticPolicy()
    if name == "proportional":
        return ProportionalPolicy()
    if name == "throughput":
        return ThroughputPolicy()
    if name == "rex":
        return RexPolicy()
    if name == "oracle":
        return OraclePolicy(scenario)
    if name in ("lbb", "omnilearn"):
        return LBBPolicy() if name == "lbb" else OmniLearnPolicy()
    raise ValueError(
        f"unknown policy {name!r}; choose from even, static, proportional, throughput, lbb, "
        "omnilearn, rex, oracle"
    )
