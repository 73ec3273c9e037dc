import itertools
import json
import re

import numpy as np
import pytest
from tests.helpers.noise import ar1_lognormal

from lightning_rex.core.decide.controller import Controller, Decision
from lightning_rex.core.window import Window
from lightning_rex.core.window_spec import WindowSpec

RATES = np.array([1000.0, 2000.0, 3000.0, 3000.0])


def window(plan, rng, step, rates=RATES, cv=0.05, factor=None, overhead=0.004):
    base = overhead + np.asarray(plan) / rates
    if factor is not None:
        base = base * factor
    t = base[:, None] * np.exp(rng.normal(0, cv, (len(plan), 30)))
    return Window(t, tuple(plan), step, step + 30)


def drive(c, rng, n, start=0, **kw):
    out = []
    for i in range(n):
        d = c.observe(window(c.plan, rng, start + 30 * i, **kw))
        out.append(d)
    return out


def test_proposes_accepts_and_balances():
    c = Controller(512, 4, seed=0)
    ds = drive(c, np.random.default_rng(0), 8)
    kinds = [d.kind for d in ds]
    # the first plan is validated (an accept, or a refining propose), and it settles
    assert kinds[0] == "propose" and ds[1].validated and kinds[1] in ("accept", "propose")
    assert "accept" in kinds and kinds.count("propose") <= 3
    times = 0.004 + np.array(c.plan) / RATES
    assert times.max() / times.min() < 1.1
    assert sum(c.plan) == 512
    json.dumps([d.to_dict() for d in ds])
    summary = c.rank_model_summary()
    np.testing.assert_allclose(summary["rate"], RATES, rtol=0.25)


def test_refines_at_once_when_the_validated_plan_is_still_imbalanced():
    # a large per-step overhead: the cold-start guess (close to proportional) leaves the slow
    # rank slow; the validation window measures the second size and refines immediately
    rates = np.array([1000.0, 3000.0])
    c = Controller(128, 2, seed=0)
    rng = np.random.default_rng(0)
    first = c.observe(window(c.plan, rng, 0, rates=rates, overhead=0.03))
    assert first.kind == "propose"
    second = c.observe(window(c.plan, rng, 30, rates=rates, overhead=0.03))
    assert second.kind == "propose" and second.validated and "refined" in second.reason
    t = lambda plan: 0.03 + np.asarray(plan) / rates  # noqa: E731
    assert t(second.plan).max() < t(first.plan).max()
    # a balanced validation is a plain accept, also marked validated
    c2 = Controller(128, 2, seed=0)
    c2.observe(window(c2.plan, rng, 0, rates=rates, overhead=0.0))
    d = c2.observe(window(c2.plan, rng, 30, rates=rates, overhead=0.0))
    assert d.kind == "accept" and d.validated
    assert not first.validated


def test_homogeneous_noise_never_rescales():
    c = Controller(256, 8, seed=1)
    rng = np.random.default_rng(1)
    rates = np.full(8, 2000.0)
    for i in range(60):
        d = c.observe(window(c.plan, rng, 30 * i, rates=rates, cv=0.3))
        assert d.kind == "hold"


def test_rollback_keeps_observations_and_restores_plan():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    d = c.observe(window(c.plan, rng, 0))
    assert d.kind == "propose"
    old, new = (128, 128, 128, 128), d.plan
    # the old plan is still in force for one window: hold
    assert c.observe(window(old, rng, 30)).kind == "hold"
    n_obs = c.model.n_obs
    # the new plan turns out far slower than before and than predicted
    bad = c.observe(window(new, rng, 60, factor=np.array([1.0, 4.0, 4.0, 4.0])))
    assert bad.kind == "rollback" and bad.plan == old
    assert c.plan == old and c.model.n_obs == n_obs + 1
    # windows still under the rejected plan are ignored
    assert c.observe(window(new, rng, 90)).kind == "hold"
    assert c.phase == "rolling_back"
    c.observe(window(old, rng, 120))
    assert c.phase == "steady"


def test_a_plan_set_outside_the_controller_is_adopted_and_monitoring_goes_on():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    manual = (200, 150, 81, 81)  # rank 0 (the slowest) is now far too big
    d = c.observe(window(manual, rng, 0))
    assert d.kind == "hold" and "adopted" in d.reason and c.plan == manual
    # the next windows under the user's plan are tested as usual, and acted on
    ds = drive(c, rng, 3, start=30)
    assert ds[0].kind == "propose" and ds[0].plan[0] < manual[0]


def test_a_plan_of_another_global_batch_is_adopted_with_its_batch():
    """The schedule moved B outside the controller (a user's or a test's own change): the
    controller's B follows, so its state stays consistent and a checkpoint of it loads."""
    c = Controller(32, 2, seed=0, max_global_batch=96)
    d = c.observe(window((4, 4), np.random.default_rng(0), 0, rates=RATES[:2]))
    assert "adopted" in d.reason and c.plan == (4, 4) and c.global_batch == 8
    state = json.loads(json.dumps(c.state_dict()))
    Controller.check_state(state, 32, 2)  # the run's first B; the state says 8
    c2 = Controller(32, 2, seed=0, max_global_batch=96)
    c2.load_state_dict(state)
    assert c2.global_batch == 8 and c2.plan == (4, 4)


def test_a_manual_plan_during_validation_or_rollback_is_adopted():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    assert c.observe(window(c.plan, rng, 0)).kind == "propose"
    manual = (64, 128, 160, 160)
    d = c.observe(window(manual, rng, 30))
    assert "adopted" in d.reason and c.phase == "steady" and c.plan == manual


def test_check_state_names_the_field():
    c = Controller(512, 4, seed=0)
    drive(c, np.random.default_rng(0), 3)
    good = json.loads(json.dumps(c.state_dict()))
    Controller.check_state(good, 512, 4)
    cases = {
        "controller.min_size": lambda d: d.pop("min_size"),
        "controller.plan": lambda d: d.__setitem__("plan", [128, 128, 128]),
        "controller.state": lambda d: d.__setitem__("state", "dancing"),
        "controller.recent[0][1]": lambda d: d["recent"][0][1].pop(),
        "controller.model.medians": lambda d: d["model"]["medians"].pop(),
        "controller.model.cutoff": lambda d: d["model"].__setitem__("cutoff", [0]),
        "controller.refit_wanted": lambda d: d.__setitem__("refit_wanted", "yes"),
    }
    for name, tamper in cases.items():
        bad = json.loads(json.dumps(good))
        tamper(bad)
        with pytest.raises(ValueError, match=re.escape(name)):
            Controller(512, 4).load_state_dict(bad)
    with pytest.raises(ValueError, match=r"controller.plan must sum to the global batch B=512"):
        bad = json.loads(json.dumps(good))
        bad["plan"] = [128, 128, 128, 129]
        Controller.check_state(bad, 512, 4)
    with pytest.raises(ValueError, match="controller must be a mapping"):
        Controller.check_state([1, 2], 512, 4)


def test_decisions_round_trip_through_dicts():
    c = Controller(512, 4, seed=0)
    for d in drive(c, np.random.default_rng(0), 4):
        assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    with pytest.raises(ValueError, match=r"decision\.kind"):
        Decision.from_dict({**d.to_dict(), "kind": "maybe"})


def test_set_bounds_is_respected_by_the_next_proposal():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    drive(c, rng, 4)
    while c.phase != "steady":
        c.observe(window(c.plan, rng, 120))
    c.set_bounds(1, [None, None, 140, 140])
    d = c.observe(window(c.plan, rng, 300))
    assert d.kind == "propose"
    assert max(d.plan[2:]) <= 140 and sum(d.plan) == 512
    with pytest.raises(ValueError, match="max_sizes sum to 40, below global_batch=512"):
        c.set_bounds(1, [10, 10, 10, 10])


def test_state_dict_round_trip_gives_identical_continuation():
    rng_a = np.random.default_rng(5)
    a = Controller(512, 4, seed=3)
    drive(a, rng_a, 5)
    # introduce a change so the continuation has decisions to make
    snapshot = json.loads(json.dumps(a.state_dict()))
    rng_state = rng_a.bit_generator.state
    b = Controller(512, 4, seed=3)
    b.load_state_dict(snapshot)
    rng_b = np.random.default_rng()
    rng_b.bit_generator.state = rng_state
    f = np.array([1.0, 1.0, 1.5, 1.0])
    da = [x.to_dict() for x in drive(a, rng_a, 8, start=150, factor=f)]
    db = [x.to_dict() for x in drive(b, rng_b, 8, start=150, factor=f)]
    assert da == db
    assert any(x["kind"] == "propose" for x in da)


def test_deterministic_for_a_seed():
    runs = []
    for _ in range(2):
        c = Controller(512, 4, seed=9)
        runs.append([d.to_dict() for d in drive(c, np.random.default_rng(2), 6)])
    assert runs[0] == runs[1]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        Controller(64, 2, alpha=0)
    with pytest.raises(ValueError, match="initial_plan"):
        Controller(64, 2, initial_plan=(10, 10))
    with pytest.raises(ValueError, match="ranks"):
        Controller(64, 2).observe(window((16, 16, 16, 16), np.random.default_rng(0), 0))
    assert Decision("hold", None, None, None, None, "x").to_dict()["kind"] == "hold"


def test_decline_keeps_the_old_plan():
    c = Controller(512, 4, seed=0)
    d = c.observe(window(c.plan, np.random.default_rng(0), 0))
    assert d.kind == "propose"
    c.decline()
    assert c.plan == (128, 128, 128, 128) and c.phase == "steady"


def test_hyperparameters_are_refitted_from_6_windows_on_and_then_rarely():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    fitted = []
    for i in range(40):
        # persistent changes keep proposals coming
        slow = 1.5 if 10 <= i < 20 else (0.7 if i >= 28 else 1.0)
        factor = np.array([1.0, 1.0, slow, 1.0])
        before = c.model.n_fits
        c.observe(window(c.plan, rng, 30 * i, factor=factor))
        if c.model.n_fits != before:
            fitted.append(c.model.n_added)
    assert fitted and fitted[0] >= 6
    assert all(b >= min(2 * a, a + 20) for a, b in itertools.pairwise(fitted))


def test_a_refit_waits_for_a_decision_that_does_not_plan(monkeypatch):
    """A proposal never also waits for a BoTorch fit: the fit it found due runs next."""
    import lightning_rex.core.decide.changes as controller

    planned = []
    plan = controller.propose_plan
    monkeypatch.setattr(
        controller, "propose_plan", lambda *a, **k: planned.append(1) or plan(*a, **k)
    )
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    kinds = {"fit": [], "plan": []}
    for i in range(40):
        slow = 1.5 if 10 <= i < 20 else (0.7 if i >= 28 else 1.0)
        fits, plans = c.model.n_fits, len(planned)
        c.observe(window(c.plan, rng, 30 * i, factor=np.array([1.0, 1.0, slow, 1.0])))
        if c.model.n_fits != fits:
            kinds["fit"].append(i)
        if len(planned) != plans:
            kinds["plan"].append(i)
    assert len(kinds["fit"]) >= 2 and len(kinds["plan"]) >= 3
    assert not set(kinds["fit"]) & set(kinds["plan"])
    # the first fit is due from the sixth window: the first plan from there finds it due,
    # and the first decision after it that does not plan runs it
    planned = min(i for i in kinds["plan"] if i >= 5)
    assert kinds["fit"][0] == min(i for i in range(planned, 40) if i not in kinds["plan"])


def test_a_fit_left_for_the_next_decision_survives_a_checkpoint():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    for i in range(40):  # up to a proposal that found a fit due
        slow = 1.5 if 10 <= i < 20 else (0.7 if i >= 28 else 1.0)
        c.observe(window(c.plan, rng, 30 * i, factor=np.array([1.0, 1.0, slow, 1.0])))
        if c.state_dict()["refit_wanted"]:
            break
    state = json.loads(json.dumps(c.state_dict()))
    assert state["refit_wanted"]
    resumed = Controller(512, 4, seed=0)
    resumed.load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "refit_wanted"}  # a checkpoint before it
    Controller(512, 4, seed=0).load_state_dict(old)
    fits = resumed.model.n_fits
    for i in range(41, 47):  # both run it in the same decision, and go on alike
        nxt = window(c.plan, rng, 30 * i)
        assert c.observe(nxt) == resumed.observe(nxt)
    assert resumed.model.n_fits > fits and not resumed.state_dict()["refit_wanted"]
    assert json.dumps(c.state_dict()) == json.dumps(resumed.state_dict())


def test_decline_of_an_unapplied_rollback_keeps_the_plan_in_force():
    c = Controller(512, 4, seed=0)
    rng = np.random.default_rng(0)
    d = c.observe(window(c.plan, rng, 0))
    assert d.kind == "propose"
    bad = d.plan
    # the new plan measures far slower than predicted: rolled back
    r = c.observe(window(bad, rng, 30, factor=np.array([3.0, 3.0, 3.0, 3.0])))
    assert r.kind == "rollback" and c.phase == "rolling_back"
    c.decline()  # training ended before the rollback was applied: `bad` stays in force
    assert c.phase == "steady" and c.plan == bad
    assert c.observe(window(bad, rng, 60)).reason != "rollback not yet in force"


def test_bounds_tightened_below_the_plan_in_force_plan_inside_them():
    # the plan in force (33, 67) breaks the new cap of 60: planning must neither index past
    # its size table nor trust the plan's time as a level for the sizes that matter
    rng = np.random.default_rng(0)
    c = Controller(world_size=2, global_batch=100, initial_plan=(80, 20))

    def win(plan, start, slow):
        t = np.array([[0.01 * plan[0] * slow], [0.01 * plan[1]]])
        return Window(
            np.abs(t * (1 + 0.01 * rng.standard_normal((2, 30)))), plan, start, start + 30
        )

    for i in range(4):
        c.observe(win(c.plan, 30 * i, 2))
    assert max(c.plan) > 60
    c.set_bounds(1, [60, 60])
    d = c.observe(win(c.plan, 120, 3))
    assert d.kind == "propose" and max(d.plan) <= 60 and sum(d.plan) == 100


def ar1_window(plan, rng, step, cv=0.10, rho=0.5, factor=1.0, base_s=0.03):
    """Ranks taking ``base_s * factor`` whatever their size, lognormal AR(1) noise (CV ``cv``):
    the plan is a label, and ``factor`` is its true step time relative to the others'."""
    noise = ar1_lognormal(rng, len(plan), 30, cv, rho) * np.exp(np.log1p(cv * cv) / 2)
    return Window(base_s * factor * noise, tuple(plan), step, step + 30)


def segments(w, looks):
    """A 30-step window cut into ``looks`` consecutive segments."""
    k = w.n_steps // looks
    return [
        Window(
            w.times[:, i * k : (i + 1) * k],
            w.plan,
            w.step_start + i * k,
            w.step_start + (i + 1) * k,
        )
        for i in range(looks)
    ]


def validation_rates(factor, trials=100, steady=5, looks=1):
    """Share of trials in which a plan whose true step time is ``factor`` x the old one's
    is rolled back (N=8, window 30, CV 0.10, AR(1) 0.5), and the share that took more than
    one window (with ``looks`` > 1: more than one segment)."""
    rolled, longer = 0, 0
    for trial in range(trials):
        rng = np.random.default_rng(10_000 + trial)
        c = Controller(256, 8, seed=trial, window=WindowSpec(30, looks))
        for w in range(steady):
            for seg in segments(ar1_window(c.plan, rng, 30 * w), looks):
                d = c.observe(seg)
                if w == 0 and d.kind == "propose":
                    c.decline()  # cold start acts on weaker evidence: not this test's subject
                else:
                    assert d.kind == "hold"
        new = (33, 31, *c.plan[2:])
        c.try_plan(new)
        segs = [
            seg
            for w in (steady, steady + 1)
            for seg in segments(ar1_window(new, rng, 30 * w, factor=factor), looks)
        ]
        ds = []
        for seg in segs:
            ds.append(c.observe(seg))
            if ds[-1].kind != "hold":
                break
            assert c.phase == "validating"
        d = ds[-1]
        longer += len(ds) > 1
        assert d.kind in ("rollback", "accept", "propose")
        rolled += d.kind == "rollback"
    return rolled / trials, longer / trials


def test_validation_is_a_non_inferiority_test():
    """A plan truly 5% slower is rolled back in >= 90% of trials; one truly 2% faster is kept
    in >= 90% (margin 2%, confidence 95%; the figures are in the closing note of issue 10)."""
    assert validation_rates(1.05)[0] >= 0.90
    assert validation_rates(0.98)[0] <= 0.10
    # at exactly the margin the nominal rate of keeping is 5%; Newey-West on 30-step windows
    # underestimates the long-run variance, and the measured rate is 12%
    assert validation_rates(1.02)[0] >= 0.85


def test_validation_with_early_looks_keeps_its_guarantees():
    """Three looks per window (training's default): a plan truly 5% slower is still rolled
    back in >= 90% of trials and one truly 2% faster kept in >= 90%; a plan 20% faster is
    accepted after one segment (10 steps) in most trials."""
    assert validation_rates(1.05, looks=3)[0] >= 0.90
    assert validation_rates(0.98, looks=3)[0] <= 0.10
    rolled, longer = validation_rates(0.80, looks=3)
    assert rolled == 0 and longer <= 0.2


def test_try_plan_checks_its_arguments():
    c = Controller(64, 2)
    with pytest.raises(RuntimeError, match="at least one window"):
        c.try_plan((30, 34))
    c.observe(ar1_window(c.plan, np.random.default_rng(0), 0))
    with pytest.raises(ValueError, match="sum"):
        c.try_plan((30, 30))
    c.try_plan((30, 34))
    with pytest.raises(RuntimeError, match="validating"):
        c.try_plan((31, 33))


def test_validation_edge_cases_and_uneven_window_lengths_resume():
    rng = np.random.default_rng(2)
    c = Controller(256, 8, seed=0)
    for w in range(3):
        c.observe(ar1_window(c.plan, rng, 30 * w))
    with pytest.raises(ValueError, match="plan in force"):
        c.try_plan(c.plan)
    new = (33, 31, *c.plan[2:])
    c.try_plan(new)
    short = Window(np.full((8, 1), 0.03), new, 90, 91)
    d = c.observe(short)  # one step cannot be compared: held, not counted as a look
    assert d.kind == "hold" and "too short" in d.reason and c.phase == "validating"
    # windows of different lengths (the driver drops unusable steps) survive a checkpoint
    c.observe(Window(ar1_window(new, rng, 91).times[:, :29], new, 91, 120))
    snap = json.loads(json.dumps(c.state_dict()))
    c2 = Controller(256, 8, seed=0)
    c2.load_state_dict(snap)
    assert c2.state_dict() == c.state_dict()


def staircase_truth(plan):
    """Ranks 0-1 run on a staircase (flat 10 ms up to 64 samples, a 40% edge, flat 14 ms up to
    128); ranks 2-3 are affine and slow (2 ms + 0.5 ms per sample)."""
    b = np.asarray(plan, dtype=np.float64)
    fast = np.where(b[:2] <= 64, 0.010, 0.014)
    return np.r_[fast, 0.002 + b[2:] / 2000.0]


@pytest.mark.parametrize("looks", [1, 3])
def test_finds_the_best_plan_past_an_unvisited_staircase_edge(looks):
    """From the even plan (64 each: the fast ranks sit on their tile edge, and no size past it
    has been measured) the best plan gives the fast ranks about 104 (14 ms each, past the
    edge); the best plan on the near side of it is 2.4x slower. Bound: within 3 windows the
    plan's true step time is within 5% of the optimum, and it stays there (measured over 20
    seeds: at most 3 windows with one look, 2.7 with three; never worse than 1.036 after)."""
    opt = min(staircase_truth((a, a, 128 - a, 128 - a)).max() for a in range(1, 128))
    k = 30 // looks
    for seed in range(10):
        rng = np.random.default_rng(seed)
        c = Controller(256, 4, seed=seed, window=WindowSpec(30, looks))
        ratio = []
        for i in range(12 * looks):
            t = staircase_truth(c.plan)[:, None] * np.exp(rng.normal(0, 0.05, (4, k)))
            c.observe(Window(t, c.plan, k * i, k * i + k))
            ratio.append(staircase_truth(c.plan).max() / opt)
        first = next(i for i, r in enumerate(ratio) if r <= 1.05)
        assert first + 1 <= 3 * looks, (seed, ratio)
        assert max(ratio[first:]) <= 1.05, (seed, ratio)
        assert min(c.plan[:2]) > 64


def test_global_batch_changes_keep_the_model_and_round_trip():
    # global batch scaling: the controller predicts the best plan for another B from the
    # same rank model, moves to it when told, and saves and restores the new B
    rng = np.random.default_rng(0)
    c = Controller(512, 4, seed=0, max_global_batch=2048)
    drive(c, rng, 4)
    plan, t = c.predict_step_time(1024)
    assert sum(plan) == 1024 and plan[0] < plan[-1]  # the slow rank gets the least
    truth = 0.004 + np.asarray(plan) / RATES
    assert t == pytest.approx(truth.max(), rel=0.1)
    _, t512 = c.predict_step_time(512)
    assert t > t512
    c.set_global_batch(1024, plan)
    assert c.global_batch == 1024 and c.plan == plan and c.phase == "steady"
    d = c.observe(window(plan, rng, 400))
    assert d.kind == "hold" and "outside" not in d.reason  # the new plan is the plan in force
    state = json.loads(json.dumps(c.state_dict()))
    again = Controller(512, 4, seed=0, max_global_batch=2048)
    again.load_state_dict(state)
    assert again.global_batch == 1024 and again.plan == plan
    with pytest.raises(ValueError, match="max_global_batch"):
        c.set_global_batch(4096, (1024,) * 4)
    with pytest.raises(ValueError, match="sum"):
        c.set_global_batch(1024, (256, 256, 256, 255))
    with pytest.raises(RuntimeError, match="at least one window"):
        Controller(512, 4).predict_step_time(1024)


@pytest.mark.parametrize("looks", [1, 3])
def test_a_new_batchs_extrapolated_plan_is_a_guess_judged_as_a_cold_start(looks):
    # the model extrapolates the new batch's sizes; there rank 3 runs at half that rate.
    # A plan no window has measured protects no status quo: its first window (or its first
    # look) proposes, as the initial plan's does; a plan measured before waits for persistence
    slow = np.array([1.0, 1.0, 1.0, 2.0])
    first = {}
    for guess in (False, True):
        rng = np.random.default_rng(3)
        c = Controller(512, 4, seed=0, max_global_batch=2048, window=WindowSpec(30, looks))
        for i in range(4):
            for seg in segments(window(c.plan, rng, 30 * i), looks):
                c.observe(seg)
        plan, _ = c.predict_step_time(1024)
        c.set_global_batch(1024, plan, guess=guess)
        if guess:  # the guess survives a checkpoint taken before its first window
            state = json.loads(json.dumps(c.state_dict()))
            c = Controller(512, 4, seed=0, max_global_batch=2048, window=WindowSpec(30, looks))
            c.load_state_dict(state)
        segs = segments(window(plan, rng, 400, factor=slow), looks)
        first[guess] = c.observe(segs[0])
        if guess:
            assert first[guess].kind == "propose", first[guess].reason
            assert "cold start" in first[guess].reason
            c.decline()  # the guess is spent: the next window needs persistence again
            assert c.observe(window(plan, rng, 430, factor=slow)).kind == "hold"
    assert first[False].kind == "hold"


def test_a_guess_is_spent_by_its_first_window_whatever_is_decided_on_it():
    rng = np.random.default_rng(3)
    c = Controller(512, 4, seed=0, max_global_batch=2048)
    drive(c, rng, 4)
    plan, _ = c.predict_step_time(1024)
    c.set_global_batch(1024, plan, guess=True)
    # a checkpoint from before the flag loads as a measured plan
    state = json.loads(json.dumps(c.state_dict()))
    del state["guess"]
    old = Controller(512, 4, seed=0, max_global_batch=2048)
    old.load_state_dict(state)
    assert not old.state_dict()["guess"]
    # caps measured before its first window: that window proposes a plan within them, and
    # the plan accepted after it is a measured one, judged by persistence
    c.set_bounds(1, [plan[0] - 8, None, None, None])
    d = c.observe(window(plan, rng, 400))
    assert d.kind == "propose" and "bounds" in d.reason
    assert not c.state_dict()["guess"]


def tile_truth(plan):
    """Ranks 0-1 pad their batch to tiles of 32 samples (3000 samples/s); ranks 2-3 are
    affine and slower (800 samples/s). The best plan, (96, 96, 32, 32), puts the fast ranks
    exactly at a tile's end: one sample more costs them a whole tile (x1.31)."""
    b = np.asarray(plan, dtype=np.float64)
    fast = 0.002 + np.ceil(b[:2] / 32) * 32 / 3000.0
    return np.r_[fast, 0.002 + b[2:] / 800.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_finds_the_plan_at_a_tiles_end_and_then_stops_changing(seed):
    """Between the tile's end (96: 42 ms, the slow ranks limit) and the balance point of a
    smooth model (about 101: 44.7 ms, the fast ranks past their tile) lies 6%. Measured (seeds
    0-3): the plan reaches the tile's end within 1-7 looks of 10 steps and is final; at most
    one excursion past it follows (a proposal and its rollback). The code before tile
    hypotheses never reached it (20-38 changes in 60 windows, 1.03-1.06x the optimum)."""
    best = (96, 96, 32, 32)
    rng = np.random.default_rng(seed)
    c = Controller(256, 4, seed=seed, window=WindowSpec(30, 3))
    plans = []
    for i in range(120):
        t = tile_truth(c.plan)[:, None] * np.exp(rng.normal(0, 0.05, (4, 10)))
        c.observe(Window(t, c.plan, 10 * i, 10 * i + 10))
        plans.append(c.plan)
    first = plans.index(best)
    assert first < 9, plans[:12]  # within three windows
    after = plans[first:]
    changes = sum(a != b for a, b in itertools.pairwise(after))
    assert changes <= 2 and plans[-1] == best, after
