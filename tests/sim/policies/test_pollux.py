"""Pollux re-implemented: its throughput model and fit, its batch choice, and the split."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers.workload import workload_scenario

from lightning_rex.sim.engine.goodput import run_goodput
from lightning_rex.sim.policies.base import PolicyInfo
from lightning_rex.sim.policies.builtin import oracle_plan
from lightning_rex.sim.policies.pollux import (
    PolluxPolicy,
    Throughput,
    fit_grad_time,
    fit_throughput,
)
from lightning_rex.sim.scenarios.schema import load_scenario, scenario_from_dict

_INFO = PolicyInfo(32, 4, 30, 1, (None,) * 4, (8,) * 4, 0, batch_range=(32, 512))


def test_the_grad_time_fit_recovers_a_line_and_starts_half_and_half() -> None:
    m = np.array([8.0, 16.0, 64.0])
    a, b = fit_grad_time(m, 0.01 + 0.002 * m, np.ones(3))
    assert (a, b) == pytest.approx((0.01, 0.002), rel=1e-3)
    assert fit_grad_time(np.array([8.0]), np.array([0.04]), np.ones(1)) == (0.02, 0.0025)


@pytest.mark.parametrize("gamma", [1.0, 3.0])
def test_the_throughput_fit_recovers_the_sync_term_and_its_overlap(gamma: float) -> None:
    true = Throughput(0.01, 0.002, 0.03, gamma)
    m = np.array([4.0, 8.0, 16.0, 32.0, 64.0])
    fit = fit_throughput(m, true.grad_time(m), true.iteration_time(m), np.ones(5))
    assert fit.iteration_time(m) == pytest.approx(true.iteration_time(m), rel=0.01)
    if gamma == 1.0:  # no overlap: the all-reduce adds its whole time
        assert fit.t_sync == pytest.approx(0.03, rel=0.01) and fit.gamma < 1.1
    else:  # overlap shrinks the iteration below compute + sync
        assert fit.gamma > 1.5
        assert np.all(fit.iteration_time(m) < fit.grad_time(m) + fit.t_sync)


def test_the_throughput_fit_counts_accumulation_steps() -> None:
    true = Throughput(0.01, 0.002, 0.02, 1.0)
    m = np.array([16.0, 32.0, 32.0])
    acc = np.array([0, 0, 2])  # the last batch runs three passes of 32
    fit = fit_throughput(m, true.grad_time(m), true.iteration_time(m, acc), np.ones(3), acc)
    assert fit.t_sync == pytest.approx(0.02, rel=0.01)
    assert fit.iteration_time(32.0, 2) == pytest.approx(3 * 0.074 + 0.02, rel=0.01)
    # with one size, nothing tells overlap apart: gamma stays 1
    one = fit_throughput(m[:1], true.grad_time(m[:1]), true.iteration_time(m[:1]), np.ones(1))
    assert one.gamma == 1.0 and one.t_sync == pytest.approx(0.02)


def test_pollux_chooses_the_goodput_optimal_batch_and_splits_evenly() -> None:
    pol = PolluxPolicy()
    pol.reset(_INFO)
    assert pol.name == "pollux" and pol.start_plan is None
    assert pol.choose() is None  # no noise estimate yet
    # compute 0.01 + 0.002 m per replica, no all-reduce
    pol._times = {b: [(0.01 + 0.002 * b / 4, 0.01 + 0.002 * b / 4)] for b in (32, 128)}
    for _ in range(50):
        pol.observe_gradients(0, 2.0, 0.5, (8, 8, 8, 8))  # |G|^2 = 0: noise only
    assert pol.phi == float("inf") and pol.choose() == 512
    for _ in range(2000):
        pol.observe_gradients(0, 2.0, 1.0, (8, 8, 8, 8))  # |G|^2 = 2/3, tr(Sigma) = 32/3
    assert pol.phi == pytest.approx(16.0)
    # goodput B / (0.01 + 0.002 B / 4) x (16 + 32) / (16 + B) is largest at the smallest B
    assert pol.choose() == 32 and pol.plan_for(510) == (128, 128, 127, 127)
    assert pol.model is not None and pol.model.beta_grad == pytest.approx(0.002, rel=1e-3)
    with pytest.raises(ValueError, match="batch range"):
        PolluxPolicy().reset(PolicyInfo(32, 4, 30, 1, (None,) * 4, (8,) * 4, 0))


def _split(b: int) -> tuple[int, ...]:  # twice as much to the first two ranks
    q = b // 6
    return (2 * q, 2 * q, q, b - 5 * q)


def test_memory_bounds_the_batch_or_makes_it_accumulate() -> None:
    caps = (256, 256, 128, 128)
    hard = PolicyInfo(32, 4, 30, 1, caps, (8,) * 4, 0, batch_range=(32, 2048))
    even, split = PolluxPolicy(), PolluxPolicy(_split)
    even.reset(hard)
    split.reset(hard)
    assert even.batches[-1] == 512  # four times the smallest cap
    assert split.batches[-1] == 768  # an uneven split fills every cap
    part = PolicyInfo(32, 4, 30, 1, (None, 256, None, 128), (8,) * 4, 0, batch_range=(32, 2048))
    even.reset(part)
    split.reset(part)
    assert even.batches[-1] == 512  # one capped replica bounds an even split
    assert split.batches[-1] == 2048  # an uncapped rank takes what the caps do not
    soft = PolicyInfo(
        32, 4, 30, 1, (None,) * 4, (8,) * 4, 0, batch_range=(32, 2048), pass_caps=caps
    )
    even.reset(soft)
    split.reset(soft)
    assert even.batches[-1] == 2048  # soft caps: past 4 x 128 the replicas accumulate
    # 513 puts its extra sample on a 256 replica; 515 one on a 128, which takes two passes
    assert even.accumulation(np.array([512, 513, 515, 2048])).tolist() == [0, 0, 1, 3]
    # the split's passes: 2048 -> (682, 682, 341, 343) against (256, 256, 128, 128)
    assert split.accumulation(np.array([768, 2048])).tolist() == [0, 2]


def test_soft_memory_reaches_pollux_in_a_goodput_run(monkeypatch: pytest.MonkeyPatch) -> None:
    d = workload_scenario()
    for r in d["ranks"]:
        r["mem_cap"], r["memory_bytes"] = None, 2e9
    d["memory"] = {"fixed_bytes": 0.0, "per_sample_bytes": 2e7}  # 100 samples a pass
    s = scenario_from_dict(d)
    assert s.pass_caps == [100] * 4
    seen: list[PolicyInfo] = []
    reset = PolluxPolicy.reset

    def spy(self: PolluxPolicy, info: PolicyInfo) -> None:
        seen.append(info)
        reset(self, info)

    monkeypatch.setattr(PolluxPolicy, "reset", spy)
    assert run_goodput(s, "pollux", 0).reached
    assert seen and seen[0].pass_caps == (100,) * 4


def test_pollux_split_is_pollux_s_choice_under_the_oracle_s_split() -> None:
    s = scenario_from_dict(workload_scenario())
    seen: list[int] = []

    def split(b: int) -> tuple[int, ...]:
        seen.append(b)
        return oracle_plan(s, b)

    pol = PolluxPolicy(split)
    pol.reset(_INFO)
    assert pol.name == "pollux-split" and pol.start_plan == oracle_plan(s, 32)
    assert pol.plan_for(256) == oracle_plan(s, 256) and seen == [32, 256]
    gns = load_scenario("gns-slow-8")  # long enough for several 30 s periods
    even, uneven = run_goodput(gns, "pollux", 0), run_goodput(gns, "pollux-split", 0)
    assert even.reached and uneven.reached and uneven.batch_changes >= 1
    assert even.time_to_target_s is not None and uneven.time_to_target_s is not None
    # the fast ranks take more of every batch: sooner to the target
    assert uneven.time_to_target_s < even.time_to_target_s
