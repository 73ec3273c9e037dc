"""The cluster simulator: drives :mod:`lightning_rex.core` exactly as training does.

``run(scenario, policy, seed) -> SimResult`` simulates one policy on a scenario (a
:class:`Scenario`, see :func:`load_scenario` for files and presets) and scores it against the
oracle on the same noise. Policies follow the interface documented in
:mod:`lightning_rex.sim.policies`.
"""

from lightning_rex.sim import cli
from lightning_rex.sim.engine import SimResult, Trace, metrics, run, simulate
from lightning_rex.sim.policies import (
    EvenPolicy,
    OraclePolicy,
    Policy,
    PolicyInfo,
    ProportionalPolicy,
    RexPolicy,
    StaticPolicy,
    make_policy,
)
from lightning_rex.sim.presets import PRESETS
from lightning_rex.sim.scenario import Scenario, ScenarioError, load_scenario, scenario_from_dict

__all__ = [
    "PRESETS",
    "EvenPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyInfo",
    "ProportionalPolicy",
    "RexPolicy",
    "Scenario",
    "ScenarioError",
    "SimResult",
    "StaticPolicy",
    "Trace",
    "cli",
    "load_scenario",
    "make_policy",
    "metrics",
    "run",
    "scenario_from_dict",
    "simulate",
]
