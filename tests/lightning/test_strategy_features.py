"""RexStrategy on 2 real gloo ranks: AMP, logging, workers and resume mid-epoch and at its end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import (
    RegModel,
    flat_params,
    global_batches,
    make_dataset,
    reference_train,
)
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N = 64 * 5 + 20
# mid-epoch 0, its last batch, its end (ModelCheckpoint's default: Lightning does not restore
# the loader, the strategy restores the plan schedule), mid-epoch 1
RESUMES = (
    "epoch=0-step=4.ckpt",
    "epoch=0-step=6.ckpt",
    "epochs/epoch=0-step=6.ckpt",
    "epoch=1-step=8.ckpt",
)


class _Recorder(L.Callback):
    def __init__(self) -> None:
        self.step_values: list[float] = []
        self.epoch_values: list[float] = []
        self.epoch_given: list[tuple[float, float]] = []  # (batch_size=32, batch_size=3)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.step_values.append(float(trainer.callback_metrics["xmean_step"]))

    def on_train_epoch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.epoch_values.append(float(trainer.callback_metrics["xmean_epoch"]))
        m = trainer.callback_metrics
        self.epoch_given.append((float(m["xmean_bs"]), float(m["xmean_w"])))


def _times(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank == 0 else 1000.0)


class _ChangePlanAt(L.Callback):
    def __init__(self, plans: dict[int, list[int]]) -> None:
        self.plans = plans
        self.effective: dict[int, int] = {}

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step in self.plans and step not in self.effective:
            self.effective[step] = trainer.strategy.set_plan(self.plans[step])


_trainer = quiet_trainer


def _features(rank: int, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ds = make_dataset(N)

    # bf16 autocast on CPU, float32 parameters
    model = RegModel(dtype=torch.float32)
    t = _trainer(
        strategy=RexStrategy(micro_batch_sizes=[48, 16]), precision="bf16-mixed", max_epochs=1
    )
    t.fit(model, DataLoader(make_dataset(N, dtype=torch.float32), batch_size=32, shuffle=True))
    out["bf16"] = flat_params(model.net)

    # sync_dist logging of a per-sample mean, on_step and on_epoch
    rec = _Recorder()
    model = RegModel(log_mean=True)
    t = _trainer(strategy=RexStrategy(micro_batch_sizes=[48, 16]), max_epochs=2, callbacks=[rec])
    t.fit(model, DataLoader(ds, batch_size=32, shuffle=True))
    out["log_step"], out["log_epoch"] = rec.step_values, rec.epoch_values
    out["log_given"] = rec.epoch_given
    out["log_seen"] = model.seen

    # uninterrupted run with workers, plan changes and step checkpoints
    plans = {2: [40, 24], 9: [16, 48]}
    ckpt = ModelCheckpoint(dirpath=tmp, every_n_train_steps=2, save_top_k=-1)
    epochs = ModelCheckpoint(dirpath=f"{tmp}/epochs", every_n_epochs=1, save_top_k=-1)
    change = _ChangePlanAt(plans)
    model = RegModel(opt="adam")
    t = _trainer(
        strategy=RexStrategy(micro_batch_sizes=[48, 16]),
        max_epochs=2,
        callbacks=[ckpt, epochs, change],
        enable_checkpointing=True,
    )
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    t.fit(model, loader)
    out["full"] = {
        "params": flat_params(model.net),
        "seen": model.seen,
        "effective": change.effective,
        "schedule": t.strategy.train_loader.batch_sampler.schedule,
    }

    # loaders rebuilt every epoch keep the run's one plan schedule, and the loop goes on
    cb = with_step_times(_times, window=5, warmup=0, background=False)
    model = RegModel()
    t = _trainer(
        strategy=RexStrategy(), max_epochs=3, callbacks=[cb], reload_dataloaders_every_n_epochs=1
    )
    t.fit(model, DataLoader(make_dataset(64 * 20), batch_size=32, shuffle=True))
    out["reload"] = {
        "seen": model.seen,
        "schedule": t.strategy.train_loader.batch_sampler.schedule,
        "history": cb.plan_history,
        "windows": [r["window"] for r in cb.records],
    }

    # resumed runs (RESUMES); at the end of epoch 0 (step 6) the workers fetch ahead before
    # Lightning moves the sampler to epoch 1
    for name in RESUMES:
        change = _ChangePlanAt(plans)
        model = RegModel(opt="adam")
        t = _trainer(
            strategy=RexStrategy(micro_batch_sizes=[48, 16]), max_epochs=2, callbacks=[change]
        )
        loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
        t.fit(model, loader, ckpt_path=str(Path(tmp) / name))
        out[name] = {
            "params": flat_params(model.net),
            "seen": model.seen,
            "schedule": t.strategy.train_loader.batch_sampler.schedule,
        }
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_distributed(_features, str(tmp_path_factory.mktemp("ckpt")))


def test_bf16_mixed_matches_single_process_within_amp_tolerance(
    results: list[dict[str, Any]],
) -> None:
    ds = make_dataset(N, dtype=torch.float32)
    ref = reference_train(
        ds, 64, 2, epochs=1, opt="sgd", reduction="mean", dtype=torch.float32, autocast=True
    )
    start = reference_train(ds, 64, 2, epochs=0, opt="sgd", reduction="mean", dtype=torch.float32)
    moved = (ref - start).abs().max().item()
    for r in range(2):
        err = (results[r]["bf16"] - ref).abs().max().item()
        assert err < 2e-2 * moved  # bf16 keeps ~3 significant digits of the update


def test_step_and_epoch_logs_are_global_batch_means(results: list[dict[str, Any]]) -> None:
    x = make_dataset(N).tensors[0][:, 0]
    steps, epochs = results[0]["log_step"], results[0]["log_epoch"]
    expect_steps, expect_epochs = [], []
    for epoch in range(2):
        gbs = global_batches(N, 64, 2, seed=0, epoch=epoch)
        expect_steps += [x[gb].mean().item() for gb in gbs]
        expect_epochs.append(x[[i for gb in gbs for i in gb]].mean().item())
    assert len(steps) == len(expect_steps)
    assert steps == pytest.approx(expect_steps, abs=1e-9)
    assert epochs == pytest.approx(expect_epochs, abs=1e-9)
    # self.log(..., batch_size=32), the DataLoader's: weighted by each rank's true micro-batch
    given = results[0]["log_given"]
    assert [g[0] for g in given] == pytest.approx(expect_epochs, abs=1e-9)
    # any other batch_size is a weight of the user's, kept: every rank's step weighs 3
    r0, r1 = results[0]["log_seen"], results[1]["log_seen"]
    for epoch in range(2):
        means = [x[s[2]].mean().item() for s in r0 + r1 if s[0] == epoch]
        assert given[epoch][1] == pytest.approx(sum(means) / len(means), abs=1e-9)
        assert abs(given[epoch][1] - expect_epochs[epoch]) > 1e-4
    assert results[1]["log_step"] == pytest.approx(steps, abs=1e-12)
    # plain averaging of the two ranks' means is visibly different under [48, 16]
    r0, r1 = results[0]["log_seen"], results[1]["log_seen"]
    naive = [(x[a[2]].mean().item() + x[b[2]].mean().item()) / 2 for a, b in zip(r0, r1)]
    assert max(abs(n - e) for n, e in zip(naive, expect_steps)) > 1e-3


@pytest.mark.parametrize("name", RESUMES)
def test_resume_mid_epoch_or_at_its_end_continues_with_the_same_batches(
    results: list[dict[str, Any]], name: str
) -> None:
    resume_step = int(name.split("step=")[1].split(".")[0])
    for r in range(2):
        full, resumed = results[r]["full"], results[r][name]
        tail = [s for s in full["seen"] if s[1] >= resume_step]
        assert resumed["seen"] == tail
        assert resumed["schedule"] == full["schedule"]
        assert (resumed["params"] - full["params"]).abs().max().item() < 1e-12


def test_plan_changes_with_prefetching_workers_follow_the_schedule(
    results: list[dict[str, Any]],
) -> None:
    full0, full1 = results[0]["full"], results[1]["full"]
    assert full0["effective"] == full1["effective"]
    for called, eff in full0["effective"].items():
        assert eff > called  # workers had prefetched the next batches
    schedule = dict(full0["schedule"])
    steps = sorted(schedule)
    for (e0, s0, i0), (e1, s1, i1) in zip(full0["seen"], full1["seen"]):
        assert (e0, s0) == (e1, s1)
        plan = schedule[max(s for s in steps if s <= s0)]
        if len(i0) + len(i1) == 64:
            assert (len(i0), len(i1)) == plan


def test_reloaded_loaders_keep_the_plan_schedule_and_the_loop_goes_on(
    results: list[dict[str, Any]],
) -> None:
    r0, r1 = results[0]["reload"], results[1]["reload"]
    assert r0["schedule"] == r1["schedule"] == r0["history"] and len(r0["history"]) >= 2
    assert r0["history"][1][0] < 20  # the plan found in the first epoch is still on record
    plan_at = lambda s: [p for st, p in r0["schedule"] if st <= s][-1]  # noqa: E731
    for (_, s0, i0), (_, _, i1) in zip(r0["seen"], r1["seen"]):
        assert (len(i0), len(i1)) == plan_at(s0)  # every epoch follows the one schedule
    assert max(e for e, _, _ in r0["seen"]) == 2
    assert any(w[0] >= 40 for w in r0["windows"])  # windows in the third epoch's loader
