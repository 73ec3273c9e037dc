"""Memory in scenarios: pass caps from bytes, steps timed as their passes, the memory preset."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers.cli import run_command

from lightning_rex.core.passes import passes
from lightning_rex.core.plans.filling import water_fill
from lightning_rex.sim.cli.report import paired_ratio
from lightning_rex.sim.engine.engine import simulate
from lightning_rex.sim.engine.scoring import run
from lightning_rex.sim.policies.builtin import OraclePolicy
from lightning_rex.sim.scenarios.scenario import ScenarioError
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict, to_dict

BASE = {
    "global_batch": 48,
    "steps": 300,
    "window": 30,
    "ranks": [
        {"rate": 100.0, "overhead_s": 0.1, "memory_bytes": 40e9},
        {"rate": 50.0, "overhead_s": 0.2, "knee": 4, "memory_bytes": 16e9},
        {"rate": 50.0, "overhead_s": 0.2},
    ],
    "memory": {"fixed_bytes": 4e9, "per_sample_bytes": 2e9},
}


def _with(**top):
    d = json.loads(json.dumps(BASE))
    d.update(top)
    return d


def test_pass_caps_follow_from_the_bytes_and_round_trip():
    s = scenario_from_dict(BASE, name="m")
    assert s.pass_caps == [18, 6, None]
    assert s.max_sizes == [None, None, None]  # soft: no hard bound comes with them
    again = scenario_from_dict(to_dict(s))
    assert again == s and again.pass_caps == s.pass_caps
    assert load_scenario("a100-v100-t4-8").pass_caps is None


@pytest.mark.parametrize(
    ("d", "needle"),
    [
        ({**BASE, "memory": {"per_sample_bytes": 1e9, "spare": 1}}, "unknown key memory.spare"),
        ({**BASE, "memory": {"fixed_bytes": 1e9}}, "memory.per_sample_bytes"),
        ({k: v for k, v in BASE.items() if k != "memory"}, "needs the scenario's memory"),
        (_with(memory={"fixed_bytes": 15e9, "per_sample_bytes": 2e9}), "ranks[1].memory_bytes"),
    ],
)
def test_bad_memory_is_a_clear_error(d, needle):
    with pytest.raises(ScenarioError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        scenario_from_dict(d)


def test_a_capped_rank_takes_the_sum_of_its_passes():
    s = scenario_from_dict(BASE)
    plan = np.array([20, 22, 6])
    got = s.base_times(plan)

    def single(r: int, b: int) -> float:
        return float(s.base_times(np.array([b if i == r else 1 for i in range(3)]))[r])

    want = [
        sum(single(r, p) for p in passes(int(b), c))
        for r, (b, c) in enumerate(zip(plan, s.pass_caps))
    ]
    np.testing.assert_allclose(got, want)
    assert got[1] == pytest.approx(4 * 0.2 + 22 / 50)  # passes of 6, 6, 5 and 5
    assert got[0] == pytest.approx(2 * 0.1 + 20 / 100) and got[2] == pytest.approx(0.2 + 6 / 50)
    table = s.time_table(np.arange(1, 31), 0)
    np.testing.assert_allclose(table[np.arange(3), plan - 1], got)
    assert table[1, 6] - table[1, 5] > 0.2  # a new pass at the cap costs its overhead


def test_the_oracle_prices_accumulation():
    s = load_scenario("fsdp-memory-8")
    oracle = OraclePolicy(s)
    oracle.reset(_info(s))
    plan = np.asarray(oracle.plan_at(0))
    # a planner that ignored the passes would give the small GPUs more than their caps hold
    blind = _single_pass_plan(s)
    step = s.base_times
    assert step(plan).max() < step(np.asarray(blind)).max() * 0.97
    assert step(plan).max() < step(np.full(8, 16)).max() / 2  # the even split accumulates


def _info(s):
    from lightning_rex.core.plans.plan import even_plan
    from lightning_rex.sim.policies.base import PolicyInfo

    plan = even_plan(s.global_batch, s.world_size)
    return PolicyInfo(
        s.global_batch, s.world_size, s.window, s.min_size, tuple(s.max_sizes), plan, 0
    )


def _single_pass_plan(s):
    """The minimax plan on the kinds' one-pass curves, as if memory held any batch."""
    d = to_dict(s)
    del d["memory"]
    for r in d["ranks"]:
        del r["memory_bytes"]
    free = scenario_from_dict(d)
    curves = free.time_table(np.arange(1, s.global_batch + 1), 0)
    n = s.world_size
    return water_fill(
        curves, s.global_batch, np.ones(n, dtype=np.int64), np.full(n, s.global_batch - n + 1)
    )


SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def memory_figures():
    s = load_scenario("fsdp-memory-8")
    out: dict[str, list[float]] = {p: [] for p in ("even", "throughput", "rex", "oracle")}
    for seed in SEEDS:
        oracle = simulate(s, OraclePolicy(s), seed)
        for p in out:
            out[p].append(run(s, p, seed, oracle=oracle).throughput)
    return out


def test_rex_beats_even_and_the_memory_blind_split_and_nears_the_oracle(memory_figures):
    f = memory_figures
    for seed, (rex, even, blind) in enumerate(zip(f["rex"], f["even"], f["throughput"])):
        assert rex > even and rex > blind, f"seed {SEEDS[seed]}"
    assert paired_ratio(f["rex"], f["even"])[0] > 2.0
    assert paired_ratio(f["rex"], f["throughput"])[0] > 1.05
    assert paired_ratio(f["rex"], f["oracle"])[0] >= 0.97


def test_the_cli_reports_rex_against_each_policy_on_memory(capsys):
    argv = ["simulate", "--scenario", "fsdp-memory-8", "--compare", "even,throughput,rex"]
    rc, out, _ = run_command([*argv, "--seeds", "0-1", "--steps", "600", "--json"], capsys)
    assert rc == 0
    mem = json.loads(out)["memory"]
    assert mem["pass_caps"] == [38, 38, 6, 6, 6, 6, 6, 6]
    assert set(mem["rex_over"]) == {"even", "throughput", "oracle"}
    rc, out, _ = run_command([*argv, "--steps", "300"], capsys)
    assert rc == 0 and "pass caps (samples per pass, memory): [38,38,6,6,6,6,6,6]" in out
