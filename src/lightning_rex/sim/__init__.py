"""The cluster simulator: runs the training loop's window driver on simulated step times.

``run(scenario, policy, seed) -> SimResult`` simulates one policy on a scenario (a
:class:`Scenario`, see :func:`load_scenario` for files and presets) and scores it against the
oracle on the same noise. Every policy is driven through
:class:`~lightning_rex.driver.loop.WindowDriver`, so it pays what training pays (warm-up,
decision lag, samples dropped after a change). Policies follow the interface documented in
:mod:`lightning_rex.sim.policies.builtin`; the published peers are :class:`LBBPolicy` and
:class:`OmniLearnPolicy`; :func:`run_loop` runs the loop on any per-rank step times.
"""

from lightning_rex.sim.cli import simulate as cli
from lightning_rex.sim.engine.engine import (
    LoopRun,
    PolicyDecider,
    Trace,
    default_loop,
    run_loop,
    simulate,
)
from lightning_rex.sim.engine.scoring import SimResult, metrics, run, scored_run
from lightning_rex.sim.policies.base import Policy, PolicyBase, PolicyInfo
from lightning_rex.sim.policies.builtin import (
    EvenPolicy,
    OraclePolicy,
    ProportionalPolicy,
    RexPolicy,
    StaticPolicy,
    make_policy,
)
from lightning_rex.sim.policies.lbb import LBBPolicy
from lightning_rex.sim.policies.omnilearn import OmniLearnPolicy
from lightning_rex.sim.scenarios.presets import PRESETS
from lightning_rex.sim.scenarios.scenario import Scenario, ScenarioError
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict

__all__ = [
    "PRESETS",
    "EvenPolicy",
    "LBBPolicy",
    "LoopRun",
    "OmniLearnPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyBase",
    "PolicyDecider",
    "PolicyInfo",
    "ProportionalPolicy",
    "RexPolicy",
    "Scenario",
    "ScenarioError",
    "SimResult",
    "StaticPolicy",
    "Trace",
    "cli",
    "default_loop",
    "load_scenario",
    "make_policy",
    "metrics",
    "run",
    "run_loop",
    "scenario_from_dict",
    "scored_run",
    "simulate",
]
