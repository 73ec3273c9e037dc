"""RexCallback on 2 gloo ranks (fork start): adapt, ignore spikes, roll back, monitor, resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, ThroughputMonitor, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, flat_params, make_dataset
from tests.helpers.timing import affine_step_time, step_noise, with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning_rex import HeterogeneityEmulator, RexCallback, RexStrategy

pytestmark = pytest.mark.distributed


class _Sizes(L.Callback):
    """Record (global_step, this rank's micro-batch size) for every batch."""

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, i: int) -> None:
        self.sizes.append((trainer.global_step, len(batch[0])))


class _OneThread(L.Callback):
    def setup(self, *args: Any, **kwargs: Any) -> None:
        torch.set_num_threads(1)


def _bench_data(n: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 16, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=32, shuffle=True)


def _trainer(
    strategy: Any, steps: int, callbacks: list[L.Callback], root: str, **kw: Any
) -> L.Trainer:
    args: dict[str, Any] = dict(
        strategy=strategy,
        max_steps=steps,
        callbacks=[_OneThread(), *callbacks],
        default_root_dir=root,
    )
    return quiet_trainer(**{**args, **kw})


def _records(root: str) -> list[dict[str, Any]]:
    path = Path(root) / "rex_decisions.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------ deterministic timings
def _memory_wall(rank: int, step: int, b: int) -> float:
    # rank 0 falls off a cliff above 40 samples (4x slower), a region the model has never seen
    t = 0.002 + b / (2000.0 if rank == 0 else 700.0)
    if rank == 0 and b > 40:
        t *= 4.0
    return t * step_noise(rank, step)


def _spike(rank: int, step: int, b: int) -> float:
    # equal ranks, but rank 1 takes 3x for one window of 20 steps: [50, 70) follows the
    # default warm-up of 10 steps and the windows [10, 30) and [30, 50)
    even = (0.002 + b / 2000.0) * step_noise(rank, step)
    return even * (3.0 if rank == 1 and 50 <= step < 70 else 1.0)


def _scenarios(rank: int, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # 1. a persistent ~3x slowdown on rank 1, from the even plan. The emulator slows rank 1
    # for real, but the controller sees the injected times (``affine_step_time``, also ~3x), so what
    # it decides does not depend on how loaded the machine is; inline decisions land on
    # their agreed exchange steps
    sizes, cb = _Sizes(), with_step_times(affine_step_time, window=20, background=False)
    emu, root = HeterogeneityEmulator([1.0, 3.0], headroom=1.0), f"{tmp}/slow"
    # a progress bar that never draws: the summary is logged only when there is a bar
    bar = TQDMProgressBar(refresh_rate=0)
    t = _trainer(RexStrategy(), 140, [emu, cb, sizes, bar], root, enable_progress_bar=True)
    t.fit(RegModel(), DataLoader(make_dataset(64 * 140), batch_size=32, shuffle=True))
    out["slow"] = {
        "history": cb.plan_history,
        "sizes": sizes.sizes,
        "schedule": t.strategy.train_loader.batch_sampler.schedule,
        "records": _records(root) if rank == 0 else None,
        "progress_bar": {k: float(v) for k, v in t.progress_bar_metrics.items()},
        "changes": cb.plan_changes,
        "emulated_delay_s": emu.total_delay_s,
    }
    # 2. a spike of one window on rank 1 of otherwise equal ranks
    cb, root = with_step_times(_spike, window=20, min_effect=0.25, background=False), f"{tmp}/spike"
    t = _trainer(RexStrategy(), 100, [cb], root)
    t.fit(RegModel(), DataLoader(make_dataset(64 * 100), batch_size=32, shuffle=True))
    out["spike"] = {"history": cb.plan_history, "records": _records(root) if rank == 0 else None}
    # 3. monitor-only on plain ddp
    sizes, cb, root = (
        _Sizes(),
        with_step_times(affine_step_time, window=20, background=False),
        f"{tmp}/ddp",
    )
    t = _trainer("ddp", 140, [cb, sizes], root)
    t.fit(RegModel(), DataLoader(make_dataset(64 * 140), batch_size=32, shuffle=True))
    out["ddp"] = {
        "sizes": sizes.sizes,
        "records": _records(root) if rank == 0 else None,
        "changes": cb.plan_changes,
    }
    return out


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Three fits on 2 ranks whose step times are injected (deterministic on a loaded machine)."""
    return run_distributed(_scenarios, str(tmp_path_factory.mktemp("emu")))


def test_persistent_slowdown_gets_a_better_plan_within_a_few_windows(
    scenarios: list[dict[str, Any]],
) -> None:
    r0, r1 = scenarios[0]["slow"], scenarios[1]["slow"]
    assert r0["history"] == r1["history"] and r0["schedule"] == r1["schedule"]
    assert len(r0["history"]) >= 2, r0["records"]
    first_step, first_plan = r0["history"][1]
    # acted on within the first 3 windows (counted in windows, not in steps or seconds)
    first = next(i for i, r in enumerate(r0["records"]) if r["decision"] == "propose")
    assert first <= 2 and r0["records"][first]["effective_step"] == first_step
    assert first_plan[0] > first_plan[1]  # the slow rank gets fewer samples
    final = r0["history"][-1][1]
    assert final[0] >= 40
    # both ranks ran every step under the plan the schedule gives for it
    schedule = r0["schedule"]
    plan_at = lambda s: [p for st, p in schedule if st <= s][-1]  # noqa: E731
    for (s0, b0), (s1, b1) in zip(r0["sizes"], r1["sizes"]):
        assert s0 == s1 and (b0, b1) == plan_at(s0)
    # the warm-up (one step, then until the steps are at speed) is not measured, and logged
    first_record = r0["records"][0]
    assert first_record["window"][0] == first_record["warmup_steps"] >= 1
    assert all(r["warmup_steps"] is None for r in r0["records"][1:])
    # the emulator ran inside rex's steps: only the slowed rank waited
    assert r0["emulated_delay_s"] == 0.0 and r1["emulated_delay_s"] > 0.0
    kinds = [r["decision"] for r in r0["records"]]
    # a plan was validated: an accept, or a propose refining the plan just validated
    assert "propose" in kinds and any(r["validated"] for r in r0["records"])
    for r in (r0, r1):  # the progress bar summary reaches every rank
        assert r["progress_bar"]["rex_changes"] == r["changes"] == len(r0["history"]) - 1
        assert r["progress_bar"]["rex_imb%"] >= 0


def test_one_window_spike_changes_nothing(scenarios: list[dict[str, Any]]) -> None:
    spike = scenarios[0]["spike"]
    assert len(spike["history"]) == 1, spike["records"]
    # the spike is measured and logged (rank 1 at ~3x in the segments inside it), and not
    # acted on, neither by a look before its window is whole (it started inside the window
    # before) nor after; whether one window's test reaches significance on 2 ranks x 18
    # autocorrelated steps is the core's call
    logged = {tuple(r["window"]): r["median_ms"] for r in spike["records"]}
    inside = [m for (a, b), m in logged.items() if a >= 50 and b <= 70]
    outside = [m for (a, b), m in logged.items() if b <= 50 or a >= 70]
    assert inside and all(m[1] > 2.0 * m[0] for m in inside)
    assert outside and all(m[1] < 1.8 * m[0] for m in outside)
    assert all(r["decision"] == "hold" for r in spike["records"])


def test_monitor_only_on_ddp_recommends_and_changes_nothing(
    scenarios: list[dict[str, Any]],
) -> None:
    for r in range(2):
        assert {b for _, b in scenarios[r]["ddp"]["sizes"]} == {32}
        assert scenarios[r]["ddp"]["changes"] == 0
    recs = [r for r in scenarios[0]["ddp"]["records"] if r["decision"] == "recommend"]
    assert recs, scenarios[0]["ddp"]["records"]
    plan = recs[0]["new_plan"]
    assert plan[0] > plan[1] and sum(plan) == 64
    assert recs[0]["predicted_speedup"] > 1.2
    assert all(not r["adaptive"] for r in scenarios[0]["ddp"]["records"])


class _UserPlans(L.Callback):
    def __init__(self) -> None:
        self.refused = ""
        self.effective: int | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 5:
            try:
                trainer.strategy.set_plan([60, 4])
            except ValueError as err:
                self.refused = str(err)
        if trainer.global_step == 40:
            self.effective = trainer.strategy.set_plan([30, 34])


def _synthetic(rank: int, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ds = make_dataset(64 * 30 + 20)
    # rollback of a plan that makes things worse
    # inline decisions: under load a background decision can miss every exchange of a short
    # run (CI once saw each one end as "training ended before its exchange")
    cb, root = with_step_times(_memory_wall, window=10, background=False), f"{tmp}/wall"
    t = _trainer(RexStrategy(), 90, [cb], root)
    t.fit(RegModel(), DataLoader(ds, batch_size=32, shuffle=True))
    out["wall"] = {"history": cb.plan_history, "records": _records(root) if rank == 0 else None}

    # a user's own set_plan: above the bound it is refused on every rank; within it, the
    # callback takes it as the plan in force and goes on testing and deciding
    manual, cb, root = (
        _UserPlans(),
        with_step_times(affine_step_time, window=6, background=False),
        f"{tmp}/m",
    )
    t = _trainer(RexStrategy(max_micro_batch_size=56), 80, [cb, manual], root)
    t.fit(RegModel(), DataLoader(ds, batch_size=32, shuffle=True))
    out["manual"] = {
        "history": cb.plan_history,
        "records": _records(root) if rank == 0 else None,
        "refused": manual.refused,
        "effective": manual.effective,
    }

    # uninterrupted vs resumed, with loggers, checkpoints every 7 steps and uneven plans
    def run(ckpt: str | None, root: str) -> tuple[L.Trainer, RexCallback, RegModel]:
        # inline observation: every decision lands on its fixed exchange step, so a resumed
        # run can be compared with an uninterrupted one step for step; 10 warm-up steps put
        # the windows where this run's noise lets 6-step windows find the 4x imbalance
        cb = with_step_times(affine_step_time, window=6, background=False, warmup=10)
        ck = ModelCheckpoint(dirpath=f"{tmp}/ckpt", every_n_train_steps=7, save_top_k=-1)
        tm = ThroughputMonitor(batch_size_fn=lambda b: len(b[0]), window_size=5)
        model = RegModel(opt="adam")
        t = _trainer(
            RexStrategy(micro_batch_sizes=[24, 40]),
            60,
            [cb, ck, tm],
            root,
            enable_checkpointing=True,
            logger=CSVLogger(root, name="csv"),
        )
        t.fit(model, DataLoader(ds, batch_size=32, shuffle=True), ckpt_path=ckpt)
        return t, cb, model

    t, cb, model = run(None, f"{tmp}/full")
    log_dir = t.log_dir  # a collective: every rank asks
    out["full"] = {
        "params": flat_params(model.net),
        "history": cb.plan_history,
        "seen": model.seen,
        "schedule": t.strategy.train_loader.batch_sampler.schedule,
        "records": _records(log_dir) if rank == 0 else None,
        "rank_sizes": [len(ix) for _, _, ix in model.seen],
        "log_dir": log_dir,
        "ckpt_dir": f"{tmp}/ckpt",
    }
    t, cb, model = run(f"{tmp}/ckpt/epoch=0-step=21.ckpt", f"{tmp}/resumed")
    log_dir = t.log_dir
    out["resumed"] = {
        "params": flat_params(model.net),
        "history": cb.plan_history,
        "seen": model.seen,
        "schedule": t.strategy.train_loader.batch_sampler.schedule,
        "records": _records(log_dir) if rank == 0 else None,
    }
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_distributed(_synthetic, str(tmp_path_factory.mktemp("syn")))


def test_a_rescale_that_makes_things_worse_is_rolled_back(synthetic: list[dict[str, Any]]) -> None:
    recs = synthetic[0]["wall"]["records"]
    kinds = [r["decision"] for r in recs]
    assert "rollback" in kinds, [
        (r["decision"], r["plan"], r["new_plan"], r["reason"]) for r in recs
    ]
    i = kinds.index("rollback")
    proposed = next(r for r in reversed(recs[:i]) if r["decision"] == "propose")
    assert recs[i]["plan"] == proposed["new_plan"]  # measured under the bad plan
    assert recs[i]["new_plan"] == proposed["plan"]  # back to the plan before it
    assert synthetic[0]["wall"]["history"] == synthetic[1]["wall"]["history"]


def test_resume_mid_epoch_matches_the_uninterrupted_run(synthetic: list[dict[str, Any]]) -> None:
    for r in range(2):
        full, resumed = synthetic[r]["full"], synthetic[r]["resumed"]
        assert len(full["history"]) >= 2  # the run did change plans, before and after step 21
        assert resumed["history"] == full["history"]
        assert resumed["schedule"] == full["schedule"]
        assert resumed["seen"] == [s for s in full["seen"] if s[1] >= 21]
        assert (resumed["params"] - full["params"]).abs().max().item() < 1e-12
    full_recs = [r for r in synthetic[0]["full"]["records"] if r["step"] > 21]
    assert len(full_recs) >= 3

    def strip(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        skip = ("wall", "per_s", "time", "run_id", "resumed_from")
        return [{k: v for k, v in r.items() if not any(x in k for x in skip)} for r in rs]

    assert strip(synthetic[0]["resumed"]["records"]) == strip(full_recs)
    # the resumed fit is a run of its own, linked to the one it continues
    resumed = synthetic[0]["resumed"]["records"]
    ids = {(r["run_id"], r["resumed_from"]) for r in resumed}
    assert ids == {(resumed[0]["run_id"], full_recs[0]["run_id"])}


def test_decision_log_and_logger_metrics(synthetic: list[dict[str, Any]]) -> None:
    recs = synthetic[0]["full"]["records"]
    keys = {
        "step",
        "plan",
        "median_ms",
        "p_values",
        "verdict",
        "decision",
        "predicted_step_ms",
        "measured_step_ms",
        "telemetry",
    }
    assert recs and all(keys <= set(r) for r in recs)
    assert all(r["telemetry"] is None for r in recs)  # CPU: no NVML, no error
    csv = Path(synthetic[0]["full"]["log_dir"]) / "metrics.csv"
    header = csv.read_text().splitlines()[0].split(",")
    for name in (
        "rex/plan_rank0",
        "rex/median_ms_rank1",
        "rex/p_value_rank0",
        "rex/decision",
        "rex/measured_step_ms",
        "rex/global_samples_per_s",
    ):
        assert name in header


def test_throughput_counts_the_true_global_batch(synthetic: list[dict[str, Any]]) -> None:
    recs = synthetic[0]["full"]["records"]
    for r in recs:
        assert r["window_samples"] == 6 * sum(r["plan"]) == 6 * 64
        assert r["global_samples_per_s"] == pytest.approx(r["window_samples"] / r["window_wall_s"])
    # Lightning's ThroughputMonitor logs rank 0's own samples and scales rates by world_size:
    # under an uneven plan its global figure is off by N * b_0 / B
    rows = list(csv.DictReader((Path(synthetic[0]["full"]["log_dir"]) / "metrics.csv").open()))
    tm = [row for row in rows if row.get("train/samples")]
    batches, lightning_samples = int(float(tm[-1]["train/batches"])), float(tm[-1]["train/samples"])
    assert lightning_samples == sum(synthetic[0]["full"]["rank_sizes"][:batches])  # rank 0 only
    # ... which differs from the true global count whenever b_0 != B / N
    sizes = synthetic[0]["full"]["rank_sizes"][:batches]
    assert any(b != 32 for b in sizes) and 2 * lightning_samples != batches * 64
    rates = [row for row in rows if row.get("train/samples_per_sec")]
    assert rates and all(
        float(r["train/samples_per_sec"])
        == pytest.approx(2 * float(r["train/device/samples_per_sec"]))
        for r in rates
    )


def test_resume_on_one_rank_from_a_two_rank_checkpoint(
    synthetic: list[dict[str, Any]], tmp_path: Path
) -> None:
    """B becomes batch_size x 1, as under ddp; epoch 0 still sees every sample exactly once."""
    ckpt = Path(synthetic[0]["full"]["ckpt_dir"]) / "epoch=0-step=21.ckpt"
    ds = make_dataset(64 * 30 + 20)
    model = RegModel(opt="adam")
    cb = with_step_times(affine_step_time, window=6)
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        strategy=RexStrategy(),
        max_steps=45,
        callbacks=[cb],
        default_root_dir=str(tmp_path),
    )
    with pytest.warns(
        UserWarning, match="made with 2 ranks and a global batch of 64, this run has 1"
    ):
        t.fit(model, DataLoader(ds, batch_size=32, shuffle=True), ckpt_path=str(ckpt))
    before = [
        i
        for r in range(2)
        for e, s, ix in synthetic[r]["full"]["seen"]
        if e == 0 and s < 21
        for i in ix
    ]
    after = [i for e, _, ix in model.seen if e == 0 for i in ix]
    assert {len(ix) for e, _, ix in model.seen if e == 0} <= {32, 20}
    assert len(before) == 21 * 64
    assert sorted(before + after) == list(range(len(ds)))  # each sample once, none lost
    assert t.strategy.plan == (32,)


def test_a_users_own_plans_are_bounded_and_monitoring_goes_on(
    synthetic: list[dict[str, Any]],
) -> None:
    m0, m1 = synthetic[0]["manual"], synthetic[1]["manual"]
    for m in (m0, m1):  # refused on every rank alike, naming the bound
        assert "exceeds max_micro_batch_size on ranks [0]: sizes [60], caps [56]" in m["refused"]
    assert m0["history"] == m1["history"] and (m0["effective"], (30, 34)) in m0["history"]
    after = [r for r in m0["records"] if r["window"][0] >= m0["effective"]]
    assert after and "adopted" in after[0]["reason"] and after[0]["plan"] == [30, 34]
    # the slow rank 1 got more: the controller goes on and proposes a better plan
    assert any(r["decision"] == "propose" for r in after[1:]), after
