"""What a simulator policy is: the information it gets, and the hooks the engine calls.

A policy decides the plan of a simulated run. The engine (:mod:`~lightning_rex.sim.engine.engine`)
calls, on every policy alike:

* ``reset(info)`` once before the run, with a :class:`PolicyInfo`;
* ``profiling_plan()`` and ``observe_profile(sizes, times)``: profiling steps before
  training (LBB), and the first plan they give;
* ``observe(window)`` after every window: a plan returned is a proposal, which the window
  driver applies as training would (at the exchange ``decision_lag`` steps later, from the
  next step); None keeps the plan;
* ``observe_step(step, times, plan)`` after every step: a plan returned applies from the
  next step, through the plan target (the peers' per-step rules);
* ``observe_gradients(step, weighted_local_sq, global_sq, plan)`` after every step of a
  workload scenario: the step's gradient norms, as training measures them (global batch
  policies);
* ``looks_for(window)``: how many times per window the loop gathers;
* ``decider()``: a decider of the policy's own for the loop to drive instead of
  ``observe`` (rex's controller, driven exactly as in training), or None;
* ``knows_the_curves`` and ``plan_at(step)``: a policy that plans from the scenario's true
  curves (the oracle) is scored without the loop;
* ``rollbacks``: rollbacks the policy made itself, reported with the driver's.

The engine asks these, never a policy's class.

:class:`PolicyBase` gives every hook a no-op default; a policy of your own subclasses it and
overrides what it needs, and runs with ``lightning_rex.sim.run(scenario, MyPolicy(), seed)``.
An object that has ``name``, ``reset`` and ``observe`` and any of the other hooks, as
policies were written before the base existed, runs too: :func:`as_policy` gives it the
base's defaults for the hooks it lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec
from lightning_rex.driver.protocols import Decider

__all__ = ["Policy", "PolicyBase", "PolicyInfo", "as_policy", "device_keys"]


def device_keys(devices: Sequence[str | None]) -> list[str]:
    """The simulated ranks' device identities, as training's keys: ``sim:<device>`` or ``sim``.

    Args:
        devices: Each rank's device label, None where unlabelled.

    Returns:
        The keys the driver gathers and the decision log records.
    """
    return ["sim" if d is None else f"sim:{d}" for d in devices]


@dataclass(frozen=True)
class PolicyInfo:
    """What a policy is told before a run.

    Attributes:
        global_batch: The global batch ``B``.
        world_size: The number of ranks ``N``.
        window: Steps per window.
        min_size: The smallest micro-batch.
        max_sizes: Per-rank memory caps (None for none).
        initial_plan: The plan in force at step 0 (the even split).
        seed: The run's seed.
        epoch_steps: Steps per epoch (for policies that act once an epoch).
        devices: Per-rank hardware labels (None where unlabelled).
        shape_change_s: Seconds a rank pays for a size it has not run recently.
        shape_cache: How many distinct recent sizes a rank keeps free.
        comm: Seconds added to every synchronous step.
        batch_range: ``(min, max)`` global batches the policy may move the batch in (a
            workload scenario's batch policies), or None: the global batch is fixed.
        pass_caps: Per-rank pass caps (memory: soft, a larger size accumulates), or None.
        loop_window: The window loop's own window object (steps, looks, warm-up), which
            rex's controller is built with, or None: ``window`` steps with the policy's looks.
    """

    global_batch: int
    world_size: int
    window: int
    min_size: int
    max_sizes: tuple[int | None, ...]
    initial_plan: Plan
    seed: int
    epoch_steps: int = 300
    devices: tuple[str | None, ...] = ()
    shape_change_s: float = 0.0
    shape_cache: int = 8
    comm: float = 0.0
    batch_range: tuple[int, int] | None = None
    pass_caps: tuple[int | None, ...] | None = None
    loop_window: WindowSpec | None = None


class PolicyBase:
    """A policy's defaults: no profiling, no per-step rule, one look per window.

    Subclass it and override what the policy does (at least ``name``, ``reset`` and
    ``observe``).
    """

    name = ""
    rollbacks: int = 0
    start_plan: Plan | None = None
    """The plan at step 0 when the policy chooses it without profiling (None: even)."""
    knows_the_curves: bool = False
    """The policy plans from the scenario's noise-free curves and events (:meth:`plan_at`),
    with no loop, lag or measurement: the engine scores its plans directly (the oracle)."""

    def reset(self, info: PolicyInfo) -> None:
        """Prepare for a run (nothing by default).

        Args:
            info: The run.
        """

    def observe(self, window: Window) -> Plan | None:
        """Never rescale after a window (by default).

        Args:
            window: The window.

        Returns:
            None.
        """
        return None

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        """No per-step rule (by default).

        Args:
            step: The step just run.
            times: Every rank's compute time of the step.
            plan: The plan it ran under.

        Returns:
            None.
        """
        return None

    def observe_gradients(
        self, step: int, weighted_local_sq: float, global_sq: float, plan: Plan
    ) -> None:
        """Ignore the gradient norms (by default).

        Args:
            step: The step just run.
            weighted_local_sq: ``sum_r (b_r / B) |g_r|^2`` of the ranks' mean gradients.
            global_sq: ``|g|^2`` of the global mean gradient.
            plan: The plan it ran under.
        """

    def observe_progress(self, done: float) -> None:
        """Ignore how much of the run is done (by default).

        Args:
            done: The fraction of the workload's target reached, in ``[0, 1]``.
        """

    def profiling_plan(self) -> Any:
        """No profiling (by default).

        Returns:
            None.
        """
        return None

    def observe_profile(self, sizes: np.ndarray, times: np.ndarray) -> Plan | None:
        """No profiling (by default).

        Args:
            sizes: The profiling steps' sizes.
            times: Their times.

        Returns:
            None.
        """
        return None

    def looks_for(self, window: int) -> int:
        """One gather per window (by default).

        Args:
            window: Steps per window.

        Returns:
            1.
        """
        return 1

    def decider(self) -> Decider | None:
        """The decider the window loop drives, when the policy brings its own.

        Returns:
            None by default: the loop drives :meth:`observe` with every window (rex returns
            the controller the builder made, which the loop drives as training does).
        """
        return None

    def plan_at(self, step: int) -> Plan:
        """The plan in force at ``step``, for a policy that knows the curves.

        Args:
            step: The step.

        Returns:
            The plan.

        Raises:
            NotImplementedError: For a policy that decides from its measurements
                (``knows_the_curves`` False).
        """
        raise NotImplementedError(f"policy {self.name!r} decides from its measurements")


#: The policy type the engine drives: every hook of :class:`PolicyBase` (see the module
#: docstring), its defaults where a policy does not override them.
Policy = PolicyBase


class _Duck(PolicyBase):
    """A policy written without the base: its own hooks, the base's defaults for the rest.

    The one place that asks an object which hooks it has: the engine then calls a typed
    interface only.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(inner.name)

    def _hook(self, name: str) -> Any:
        return getattr(self.inner, name, None)

    @property
    def rollbacks(self) -> int:  # type: ignore[override]
        """The rollbacks the policy counts, if it counts any."""
        return int(getattr(self.inner, "rollbacks", 0))

    def reset(self, info: PolicyInfo) -> None:
        self.inner.reset(info)

    def observe(self, window: Window) -> Plan | None:
        return _plan(self.inner.observe(window))

    def observe_step(self, step: int, times: np.ndarray, plan: Plan) -> Plan | None:
        hook = self._hook("observe_step")
        return None if hook is None else _plan(hook(step, times, plan))

    def observe_gradients(
        self, step: int, weighted_local_sq: float, global_sq: float, plan: Plan
    ) -> None:
        hook = self._hook("observe_gradients")
        if hook is not None:
            hook(step, weighted_local_sq, global_sq, plan)

    def observe_progress(self, done: float) -> None:
        hook = self._hook("observe_progress")
        if hook is not None:
            hook(done)

    def profiling_plan(self) -> Any:
        hook = self._hook("profiling_plan")
        return None if hook is None else hook()

    def observe_profile(self, sizes: np.ndarray, times: np.ndarray) -> Plan | None:
        hook = self._hook("observe_profile")
        return None if hook is None else _plan(hook(sizes, times))

    def looks_for(self, window: int) -> int:
        hook = self._hook("looks_for")
        return 1 if hook is None else int(hook(window))

    def decider(self) -> Decider | None:
        hook = self._hook("decider")
        return None if hook is None else hook()


def _plan(p: Any) -> Plan | None:
    return None if p is None else tuple(int(b) for b in p)


def as_policy(policy: Any) -> Policy:
    """The policy with every hook: a :class:`PolicyBase` as it is, anything else wrapped.

    An object with ``name``, ``reset`` and ``observe`` gets the base's defaults for the
    other hooks.

    Args:
        policy: The policy.

    Returns:
        A policy with every hook.
    """
    return policy if isinstance(policy, PolicyBase) else _Duck(policy)
