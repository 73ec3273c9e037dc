"""The window driver with fake collectives and fake plan targets: no processes, no Lightning.

Ranks are either all hosted in one process (LocalCollectives, as in the simulator) or one
per thread (ThreadCollectives, as in training); step times are injected.
"""

from __future__ import annotations

import json
import math
import pickle
import warnings
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from tests.helpers.fakes import ThreadCollectives, run_threads

from lightning_rex.core.decide.controller import Controller, Decision
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.saved import StateError
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec
from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.errors import RexRankError
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.protocols import (
    Collectives,
    LocalCollectives,
    PlanTarget,
    ScheduleTarget,
)

RATES = (3000.0, 1000.0)


def _noise(rank: int, step: int) -> float:
    u = (zlib.crc32(f"{rank}:{step}".encode()) % 10_000 + 0.5) / 10_000
    return math.exp(0.05 * math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * u * 7.3))


def affine(rank: int, step: int, b: int) -> float:
    return (0.002 + b / RATES[rank]) * _noise(rank, step)


def controller(plan: Plan, bounds: SizeBounds) -> Controller:
    n = len(plan)
    return Controller(
        sum(plan), n, min_size=bounds.min_size, max_sizes=bounds.caps(n), initial_plan=plan
    )


def make(
    collectives: Collectives,
    target: PlanTarget | None = None,
    decider: Any = controller,
    **config: Any,
) -> tuple[WindowDriver, ScheduleTarget]:
    target = target or ScheduleTarget(PlanSchedule((32, 32), 64))
    assert isinstance(target, ScheduleTarget)
    cfg = {"window": 10, "warmup": 10, "background": False, **config}
    window = WindowSpec(
        cfg.pop("window"),
        cfg.pop("looks", 1),
        cfg.pop("warmup"),
        cfg.pop("max_warmup", WindowSpec.max_warmup),
    )
    driver = WindowDriver(
        LoopConfig(window, **cfg),
        collectives,
        target,
        decider,
        check_decider_state=Controller.check_state,
    )
    return driver, target


def drive(
    driver: WindowDriver,
    target: ScheduleTarget,
    steps: range,
    ranks: list[int],
    fn: Any = affine,
    each: Any = None,
) -> None:
    for step in steps:
        target.now = step
        if each is not None:
            each(step)
        plan = target.plan_schedule.plan_at(step)
        driver.record(step, [fn(r, step, plan[r]) for r in ranks])


def strip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    skip = ("time", "run_id", "resumed_from", "window_wall_s", "global_samples_per_s")
    return [{k: v for k, v in r.items() if k not in skip} for r in records]


def test_windows_exchange_and_plans_follow_the_schedule() -> None:
    driver, target = make(LocalCollectives(2))
    driver.start(0, ["cpu", "cpu"])
    drive(driver, target, range(100), [0, 1])
    recs = driver.records
    assert recs[0]["window"] == [10, 20]  # the warm-up is not measured
    assert recs[0]["decision"] == "propose" and recs[0]["effective_step"] == 25  # lag 5, +1
    entries = target.plan_schedule.entries
    assert entries[0] == (0, (32, 32)) and entries[1] == (25, tuple(recs[0]["new_plan"]))
    assert entries[1][1][0] > entries[1][1][1]  # the slow rank gets fewer samples
    assert recs[1]["window"] == [25, 35]  # samples before the new plan were dropped
    assert all(r["plan_changes"] >= 1 for r in recs)


def test_one_rank_per_thread_gives_the_same_records_as_all_ranks_in_one_process() -> None:
    local, _ = make(LocalCollectives(2))
    local.start(0, ["cpu", "cpu"])
    drive(local, _, range(120), [0, 1])

    def rank(r: int, c: ThreadCollectives) -> list[dict[str, Any]]:
        driver, target = make(c)
        driver.start(0, ["cpu"])
        drive(driver, target, range(120), [r])
        driver.finish()
        return driver.records

    out = run_threads(2, rank)
    assert not any(isinstance(o, BaseException) for o in out), out
    assert strip(out[0]) == strip(local.records) and out[1] == []
    assert len(local.records) >= 5


def test_a_failure_on_one_rank_is_raised_on_every_rank_within_a_window() -> None:
    def rank(r: int, c: ThreadCollectives) -> tuple[int, BaseException | None]:
        driver, target = make(c)
        driver.start(0, ["cpu"])
        last = -1

        def each(step: int) -> None:
            nonlocal last
            last = step
            if r == 1 and step == 33:
                with driver.guard("writing a sample"):
                    raise OSError("disk on fire")

        try:
            drive(driver, target, range(100), [r], each=each)
        except RexRankError as err:
            return last, err
        return last, None

    out = run_threads(2, rank)
    (s0, e0), (s1, e1) = out
    assert isinstance(e0, RexRankError) and isinstance(e1, RexRankError)
    # windows [10, 20), then [25, 35) after the plan change at 25: the gather at 34
    assert s0 == s1 == 34  # the same step on both, within one window
    for e in (e0, e1):
        assert e.rank == 1 and "OSError: disk on fire" in str(e) and "rank 1" in str(e)
    assert isinstance(e1.__cause__, OSError) and e0.__cause__ is None


class _Exploding(Controller):
    def observe(self, window: Window) -> Decision:
        if self.windows_seen == 1:
            raise FloatingPointError("posterior is not positive definite")
        return super().observe(window)


@pytest.mark.parametrize("background", [False, True])
def test_an_error_in_rank_0s_decider_reaches_every_rank_at_the_exchange(background: bool) -> None:
    def exploding(plan: Plan, bounds: SizeBounds) -> Controller:
        return _Exploding(sum(plan), len(plan), initial_plan=plan)

    def rank(r: int, c: ThreadCollectives) -> tuple[int, BaseException | None]:
        driver, target = make(c, decider=exploding, background=background)
        driver.start(0, ["cpu"])
        steps = [-1]
        try:
            drive(driver, target, range(200), [r], each=steps.append)
            driver.finish()  # a thread still computing at the end: its error is not lost
        except RexRankError as err:
            return steps[-1], err
        return steps[-1], None

    (s0, e0), (s1, e1) = run_threads(2, rank)
    assert isinstance(e0, RexRankError) and isinstance(e1, RexRankError)
    assert s0 == s1
    if not background:  # inline: at the exchange of the second window, [25, 35) + lag 5
        assert s0 == 39
    assert e0.rank == e1.rank == 0
    assert "FloatingPointError: posterior is not positive definite" in str(e1)


def test_monitor_only_recommends_and_changes_nothing() -> None:
    target = ScheduleTarget(PlanSchedule((32, 32), 64), frozen=True)
    driver, _ = make(LocalCollectives(2), target, apply_plans=False)
    driver.start(0, ["cpu", "cpu"])
    drive(driver, target, range(100), [0, 1])
    kinds = [r["decision"] for r in driver.records]
    assert "recommend" in kinds and "propose" not in kinds
    assert target.plan_schedule.changes == 0
    rec = next(r for r in driver.records if r["decision"] == "recommend")
    assert rec["new_plan"][0] > rec["new_plan"][1] and rec["effective_step"] is None
    assert not rec["adaptive"]


def test_bad_samples_are_dropped_and_counted_not_fatal() -> None:
    def with_nan(r: int, step: int, b: int) -> float:
        return math.nan if (r == 1 and step == 15) else (0.0 if step == 16 else affine(r, step, b))

    driver, target = make(LocalCollectives(2))
    driver.start(0, ["cpu", "cpu"])
    with pytest.warns(RuntimeWarning, match=r"first: rank 1, step 15"):
        drive(driver, target, range(30), [0, 1], fn=with_nan)
    first = driver.records[0]
    assert first["window"] == [10, 20] and first["dropped_samples"] == 3  # NaN, 0.0 and 0.0
    assert driver.dropped == 3


def test_a_plan_set_from_outside_restarts_the_window_and_is_adopted() -> None:
    driver, target = make(LocalCollectives(2), background=False)
    driver.start(0, ["cpu", "cpu"])

    def user(step: int) -> None:
        if step == 15:  # mid-window, as strategy.set_plan would
            target.schedule_plan((40, 24), 15)

    drive(driver, target, range(60), [0, 1], each=user)
    first = driver.records[0]
    assert first["window"] == [15, 25] and first["plan"] == [40, 24]
    assert "adopted" in first["reason"]
    assert target.plan_schedule.entries[1] == (15, (40, 24))


def _resume_at(
    save: int, stop: int, round_trip: Any
) -> tuple[WindowDriver, WindowDriver, WindowDriver, ScheduleTarget, ScheduleTarget, Any]:
    """An uninterrupted fit to ``stop``, and one saved at ``save`` (through ``round_trip``)
    and resumed: (full, first, resumed, full's target, resumed's target, the saved state)."""
    full, target = make(LocalCollectives(2))
    full.start(0, ["cpu", "cpu"])
    drive(full, target, range(stop), [0, 1])
    first, t1 = make(LocalCollectives(2))
    first.start(0, ["cpu", "cpu"])
    drive(first, t1, range(save), [0, 1])
    state = round_trip(first.state_dict())
    resumed, t2 = make(LocalCollectives(2))
    t2.plan_schedule.load_state_dict(round_trip(t1.plan_schedule.state_dict()))
    resumed.start(save, ["cpu", "cpu"], state)
    drive(resumed, t2, range(save, stop), [0, 1])
    return full, first, resumed, target, t2, state


def test_a_checkpointed_run_continues_exactly() -> None:
    full, first, resumed, target, t2, _ = _resume_at(57, 150, lambda d: json.loads(json.dumps(d)))
    assert t2.plan_schedule.entries == target.plan_schedule.entries
    assert strip(first.records + resumed.records) == strip(full.records)
    # a resumed fit is a run of its own, linked to the run it continues
    assert resumed.run_id != first.run_id and resumed.resumed_from == first.run_id
    assert {r["resumed_from"] for r in resumed.records} == {first.run_id}


def test_a_pickled_checkpoint_with_a_decision_pending_resumes() -> None:
    # torch.save pickles the state as it is, tuples and all (JSON makes them lists): a save
    # between a gather (step 19) and its exchange (step 24) holds the pending decision
    full, first, resumed, _, _, state = _resume_at(22, 60, lambda d: pickle.loads(pickle.dumps(d)))
    assert state["pending"] and isinstance(state["pending"][0]["info"]["even_step_s"], tuple)
    assert strip(first.records + resumed.records) == strip(full.records)


def _saved_mid_window() -> dict[str, Any]:
    d, t = make(LocalCollectives(2))
    d.start(0, ["cpu", "cpu"])
    drive(d, t, range(44), [0, 1])
    return json.loads(json.dumps(d.state_dict()))


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (lambda s: s["partial"][1].pop(), r"rex_driver.partial\[1\]"),
        (lambda s: s["partial"].pop(), r"rex_driver.partial"),
        (lambda s: s.__setitem__("steps", s["steps"][::-1]), r"rex_driver.steps"),
        (lambda s: s.__setitem__("window_plan", [40, 25]), r"rex_driver.window_plan"),
        (lambda s: s["controller"].pop("min_size"), r"controller.min_size"),
        (lambda s: s["controller"]["model"]["medians"].pop(), r"controller.model.medians"),
        (lambda s: s.__setitem__("version", 1), r"rex_driver.version"),
    ],
)
def test_tampered_state_fails_on_every_rank_before_any_step(tamper: Any, field: str) -> None:
    state = _saved_mid_window()
    tamper(state)

    def rank(r: int, c: ThreadCollectives) -> BaseException | None:
        driver, _ = make(c)
        try:
            driver.start(44, ["cpu"], state)
        except StateError as err:
            return err
        return None

    errors = run_threads(2, rank)
    assert all(isinstance(e, StateError) for e in errors), errors
    assert all(e.field.startswith(field.replace("\\", "")) for e in errors)  # type: ignore[union-attr]
    assert str(errors[0]) == str(errors[1])


def test_decision_log_metrics_have_no_nan_from_the_driver() -> None:
    driver, target = make(LocalCollectives(2))
    driver.start(0, ["cpu", "cpu"])
    drive(driver, target, range(60), [0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = json.dumps(driver.records, allow_nan=False)
    assert np.isfinite(json.loads(text)[0]["measured_step_ms"])


def test_a_failure_right_after_a_window_is_raised_at_its_exchange() -> None:
    def rank(r: int, c: ThreadCollectives) -> tuple[int, BaseException | None]:
        driver, target = make(c)
        driver.start(0, ["cpu"])
        last = -1

        def each(step: int) -> None:
            nonlocal last
            last = step
            if r == 1 and step == 20:  # the window [10, 20) closed at 19; its exchange is at 24
                with driver.guard("reading a timer"):
                    raise OSError("timer gone")

        try:
            drive(driver, target, range(60), [r], each=each)
        except RexRankError as err:
            assert driver.state_dict() == {}  # a save while handling it starts no collective
            return last, err
        return last, None

    (s0, e0), (s1, e1) = run_threads(2, rank)
    assert isinstance(e0, RexRankError) and isinstance(e1, RexRankError)
    assert s0 == s1 == 24 and "rank 1" in str(e0) and "OSError: timer gone" in str(e0)


def _saved_with_pending() -> dict[str, Any]:
    d, t = make(LocalCollectives(2))
    d.start(0, ["cpu", "cpu"])
    drive(d, t, range(20), [0, 1])  # the window [10, 20) is decided, not yet exchanged
    state = json.loads(json.dumps(d.state_dict()))
    assert state["pending"] and state["pending"][0]["decision"]["plan"] is not None
    return state


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (lambda p: p["decision"].__setitem__("plan", [40, 25]), "decision.plan"),
        (lambda p: p["decision"].__setitem__("plan", [64]), "decision.plan"),
        (lambda p: p["decision"].__setitem__("kind", "hold"), "decision.plan"),
        (lambda p: p["info"].__setitem__("window_samples", "many"), "info.window_samples"),
        (lambda p: p["window"].__setitem__("times", [[0.1]]), "window"),
    ],
)
def test_a_tampered_pending_decision_is_refused(tamper: Any, field: str) -> None:
    state = _saved_with_pending()
    tamper(state["pending"][0])
    driver, _ = make(LocalCollectives(2))
    with pytest.raises(StateError) as err:
        driver.start(20, ["cpu", "cpu"], state)
    assert err.value.field.startswith(f"rex_driver.pending[0].{field}")


def test_a_resume_takes_this_runs_bounds_not_the_checkpoints() -> None:
    state = _saved_mid_window()
    bounds = SizeBounds(min_size=4)
    driver, _ = make(LocalCollectives(2), ScheduleTarget(PlanSchedule((32, 32), 64, bounds)))
    driver.start(44, ["cpu", "cpu"], state)
    assert isinstance(driver.decider, Controller) and driver.decider.bounds.min_size == 4


@pytest.mark.parametrize("bad", [0, 4, 11, 5.5, True, "5"])
def test_first_look_outside_min_steps_to_segment_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="first_look"):
        LoopConfig(WindowSpec(30, 3), first_look=bad)


def test_the_first_look_is_short_and_its_decision_comes_soon() -> None:
    cfg = LoopConfig(WindowSpec(30, 3), first_look=6)
    assert cfg.look(True) == (6, 3) and cfg.look(False) == (10, 5)
    assert LoopConfig(WindowSpec(30, 3)).look(True) == (5, 2)  # min_steps by default
    assert LoopConfig(WindowSpec(30, 1)).look(True) == (30, 15)  # one look: no first look


def _looks(plan: Plan, bounds: SizeBounds) -> Controller:
    n = len(plan)
    kinds = ["fast", "fast", "slow", "slow"] if n == 4 else None
    return Controller(
        sum(plan),
        n,
        min_size=bounds.min_size,
        max_sizes=bounds.caps(n),
        initial_plan=plan,
        window=WindowSpec(30, 3),
        groups=kinds,
    )


def _kinds(rank: int, step: int, b: int) -> float:
    return (0.002 + b / RATES[rank // 2]) * _noise(rank, step)


def test_a_fresh_fits_first_gather_is_the_first_look_then_segments() -> None:
    # two device kinds of two ranks each: five steps are evidence enough to act on
    target = ScheduleTarget(PlanSchedule((16, 16, 16, 16), 64))
    driver, _ = make(LocalCollectives(4), target, _looks, window=30, looks=3, first_look=5)
    driver.start(0, ["fast", "fast", "slow", "slow"])
    drive(driver, target, range(60), [0, 1, 2, 3], _kinds)
    first = driver.records[0]
    assert first["window"] == [10, 15]  # after the warm-up, five steps
    assert first["decision"] == "propose" and first["effective_step"] == 17  # lag 2
    assert first["new_plan"][0] > first["new_plan"][2]
    assert all(r["window"][1] - r["window"][0] == 10 for r in driver.records[1:])


def test_a_checkpoint_inside_the_first_look_resumes_it() -> None:
    keys = ["fast", "fast", "slow", "slow"]

    def fit(stop: int, state: Any = None, start: int = 0) -> tuple[WindowDriver, ScheduleTarget]:
        target = ScheduleTarget(PlanSchedule((16, 16, 16, 16), 64))
        d, t = make(LocalCollectives(4), target, _looks, window=30, looks=3, first_look=5)
        if state is not None:
            t.plan_schedule.load_state_dict(state[1])
        d.start(start, keys, None if state is None else state[0])
        drive(d, t, range(start, stop), [0, 1, 2, 3], _kinds)
        return d, t

    full, _ = fit(60)
    first, t1 = fit(12)
    saved = json.loads(json.dumps([first.state_dict(), t1.plan_schedule.state_dict()]))
    assert saved[0]["first_look"] is True
    resumed, _ = fit(60, saved, 12)
    assert strip(first.records + resumed.records) == strip(full.records)
    # a checkpoint from before first looks existed resumes with ordinary gathers
    old = json.loads(json.dumps(saved))
    del old[0]["first_look"]
    legacy, _ = fit(60, old, 12)
    assert legacy.records[0]["window"] == [10, 20]


def test_one_device_kind_has_no_first_look() -> None:
    # ranks of one kind: a 5-step look could only test single ranks, which it cannot do
    driver, target = make(LocalCollectives(2), decider=_looks, window=30, looks=3, first_look=5)
    driver.start(0, ["cpu", "cpu"])
    drive(driver, target, range(40), [0, 1])
    assert driver.records[0]["window"] == [10, 20]


def test_a_prior_gives_a_fresh_fit_its_first_plan_and_a_resume_keeps_its_own() -> None:
    prior = {"fast": [3000.0, 0.002], "slow": [1000.0, 0.002]}  # what RATES measure
    driver, target = make(LocalCollectives(2))
    driver.start(0, ["fast", "slow"], prior=prior)
    first = target.plan_schedule.entries
    assert first[0] == (0, (32, 32)) and first[1][1] == (48, 16)  # b / rate equalised
    drive(driver, target, range(60), [0, 1])
    assert driver.records[0]["plan"] == [48, 16]  # the first window measures the prior's plan
    # a device the prior does not know: the schedule's plan stays (with a warning)
    other, t2 = make(LocalCollectives(2))
    with pytest.warns(UserWarning, match="prior: no rates for device"):
        other.start(0, ["fast", "a100"], prior=prior)
    assert t2.plan_schedule.entries == [(0, (32, 32))]
    # a resume on the same world size keeps its checkpoint's plan, prior or not
    state = json.loads(json.dumps(driver.state_dict()))
    resumed, t3 = make(LocalCollectives(2))
    t3.plan_schedule.load_state_dict(json.loads(json.dumps(target.plan_schedule.state_dict())))
    resumed.start(60, ["fast", "slow"], state, prior={"fast": [1.0, 0.0], "slow": [1e4, 0.0]})
    assert t3.plan_schedule.entries == target.plan_schedule.entries


def test_a_prior_missing_a_device_warns_on_a_fresh_start_naming_it() -> None:
    prior = {"fast": [3000.0, 0.002], "slow": [1000.0, 0.002]}
    driver, target = make(LocalCollectives(3), ScheduleTarget(PlanSchedule((22, 21, 21), 64)))
    with pytest.warns(UserWarning) as caught:
        driver.start(0, ["fast", "a100", "a100"], prior=prior)
    (only,) = [w for w in caught if "prior" in str(w.message)]  # once, each device once
    assert str(only.message).startswith(
        "prior: no rates for device(s) ['a100'] of this run (the prior has ['fast', 'slow'])"
    )
    assert target.plan_schedule.entries == [(0, (22, 21, 21))]  # the even split stays
    # a prior that covers every device, or none given: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(LocalCollectives(2))[0].start(0, ["fast", "slow"], prior=prior)
        make(LocalCollectives(2))[0].start(0, ["fast", "a100"])


def test_the_missing_device_warning_is_rank_0s_alone_and_not_on_a_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading
    import types

    from lightning_rex.driver import prior as prior_module

    said: list[tuple[int | None, str]] = []
    ranks: dict[int, int] = {}

    def warn(message: str, *args: Any, **kwargs: Any) -> None:
        said.append((ranks.get(threading.get_ident()), message))

    monkeypatch.setattr(prior_module, "warnings", types.SimpleNamespace(warn=warn))
    prior = {"fast": [3000.0, 0.002]}

    def rank(r: int, c: ThreadCollectives) -> None:
        ranks[threading.get_ident()] = r
        driver, _ = make(c)
        driver.start(0, [("fast", "a100")[r]], prior=prior)  # rank 0's prior on every rank

    assert run_threads(2, rank) == [None, None]
    assert len(said) == 1 and said[0][0] == 0 and "['a100']" in said[0][1]
    # a resume on the same world size keeps its checkpoint's plan: nothing to warn of
    said.clear()
    state = _saved_mid_window()
    resumed, _ = make(LocalCollectives(2))
    resumed.start(44, ["cpu", "cpu"], state, prior=prior)
    assert said == []


# ------------------------------------------------------------------ the warm-up at speed
def _warming_cluster() -> Any:
    from lightning_rex.sim import scenario_from_dict

    fast = {"rate": 3000.0, "overhead_s": 0.002, "device": "fast"}
    slow = {"rate": 1000.0, "overhead_s": 0.002, "device": "slow"}
    kind = [0, 1, 2, 3]  # the fast kind still compiling: 4x for steps 0-2, 2x at step 3
    return scenario_from_dict(
        {
            "global_batch": 256,
            "steps": 300,
            "window": 30,
            "ranks": [fast] * 4 + [slow] * 4,
            "noise": {"cv": 0.05, "ar1": 0.3},
            "events": [
                {"ranks": kind, "start": 0, "end": 4, "factor": 2.0},
                {"ranks": kind, "start": 0, "end": 3, "factor": 2.0},
            ],
        },
        name="warming",
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_the_warm_up_lasts_until_every_rank_is_at_speed(seed: int) -> None:
    from lightning_rex.sim.engine.engine import default_loop, simulate
    from lightning_rex.sim.policies.builtin import RexPolicy

    scen, runs = _warming_cluster(), {}
    for name, max_warmup in (("adaptive", None), ("fixed", 0)):
        pol = RexPolicy()
        runs[name] = simulate(scen, pol, seed, loop=default_loop(scen, pol, max_warmup=max_warmup))
    first = runs["adaptive"].records[0]
    # the first look (steps 1-5) still had the fast kind slowing down: dropped, for all ranks
    assert first["window"][0] == first["warmup_steps"] == 6
    assert first["decision"] == "propose" and first["new_plan"][0] > first["new_plan"][4]
    # a fixed one-step warm-up let the transient into the first look, which hid the imbalance
    fixed = runs["fixed"].records
    assert fixed[0]["window"] == [1, 6] and fixed[0]["decision"] == "hold"
    assert fixed[0]["warmup_steps"] == 1 and all(r["warmup_steps"] is None for r in fixed[1:])
    assert runs["adaptive"].changes[0][0] < runs["fixed"].changes[0][0]
    assert runs["adaptive"].total_time_s < runs["fixed"].total_time_s


def test_a_warm_up_that_never_settles_ends_at_max_warmup() -> None:
    from lightning_rex.sim import scenario_from_dict
    from lightning_rex.sim.engine.engine import default_loop, simulate
    from lightning_rex.sim.policies.builtin import EvenPolicy

    # every rank 2x slower at the start of each 5-step block, for ever: never at speed
    events = [
        {"ranks": list(range(4)), "start": s, "end": s + 2, "factor": 3.0} for s in range(1, 200, 5)
    ]
    scen = scenario_from_dict(
        {
            "global_batch": 32,
            "steps": 200,
            "window": 5,
            "ranks": [{"rate": 1e3}] * 4,
            "events": events,
        },
        name="never",
    )
    pol = EvenPolicy()
    base = default_loop(scen, pol)
    loop = replace(base, window=replace(base.window, max_warmup=41))
    records = simulate(scen, pol, 0, loop=loop).records
    # each block is judged still warming; the one that reaches step 41 is taken all the same
    assert records[0]["window"] == [36, 41] and records[0]["warmup_steps"] == 36


def test_a_checkpoint_inside_the_warm_up_resumes_it() -> None:
    def warming(rank: int, step: int, b: int) -> float:  # rank 1 compiles, then recompiles
        compiling = rank == 1 and 1 <= step % 10 <= 5 and step < 16
        return affine(rank, step, b) * (4.0 if compiling else 1.0)

    def fit(stop: int, state: Any = None, start: int = 0) -> tuple[WindowDriver, ScheduleTarget]:
        d, t = make(LocalCollectives(2), warmup=1)
        if state is not None:
            t.plan_schedule.load_state_dict(state[1])
        d.start(start, ["cpu", "cpu"], None if state is None else state[0])
        drive(d, t, range(start, stop), [0, 1], warming)
        return d, t

    full, _ = fit(60)
    # blocks [1, 11) and [11, 21) each have rank 1 slower in their first half: dropped
    assert full.records[0]["window"] == [21, 31] and full.records[0]["warmup_steps"] == 21
    first, t1 = fit(15)
    saved = json.loads(json.dumps([first.state_dict(), t1.plan_schedule.state_dict()]))
    assert saved[0]["warm_until"] == 200 and saved[0]["fit_start"] == 0
    resumed, _ = fit(60, saved, 15)
    assert not first.records and strip(resumed.records) == strip(full.records)
    # a checkpoint from before the adaptive warm-up resumes with the warm-up over
    old = json.loads(json.dumps(saved))
    del old[0]["warm_until"], old[0]["fit_start"]
    legacy, _ = fit(60, old, 15)
    assert legacy.records[0]["window"] == [11, 21] and legacy.records[0]["warmup_steps"] is None
