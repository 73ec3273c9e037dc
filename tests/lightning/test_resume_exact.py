"""Resuming with plain ``strategy="rex"`` (the callback attached by the strategy) is exact,
and a resume on more ranks starts from a plan fitted to the rates measured per device."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, flat_params, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning_rex.lightning.session as session_module
from lightning_rex import RexCallback, RexStrategy

pytestmark = pytest.mark.distributed

N = 64 * 30 + 20


class _EqualTimes(Callback):
    """Equal step times for the callback the strategy attaches (measured ones are noisy under
    load, and a chance imbalance at the first look would change the state this test reads)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        for c in trainer.callbacks:
            if isinstance(c, RexCallback):
                c._step_time_fn = lambda rank, step, b: 0.01 * (1.0 + b / 64.0)


def _plain(rank: int, tmp: str, ckpt: str | None) -> dict[str, Any]:
    model = RegModel(opt="adam")
    ck = ModelCheckpoint(dirpath=f"{tmp}/ckpt", every_n_train_steps=23, save_top_k=-1)
    t = quiet_trainer(
        strategy="rex",
        max_steps=40,
        callbacks=[_EqualTimes(), ck],
        enable_checkpointing=True,
        default_root_dir=tmp,
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=32, shuffle=True), ckpt_path=ckpt)
    order = [type(c).__name__ for c in t.callbacks if isinstance(c, (RexCallback, Checkpoint))]
    return {"params": flat_params(model.net), "seen": model.seen, "order": order}


def test_plain_rex_with_step_checkpoints_resumes_exactly(tmp_path: Path) -> None:
    full = run_distributed(_plain, str(tmp_path / "full"), None)
    path = tmp_path / "full" / "ckpt" / "epoch=0-step=23.ckpt"
    resumed = run_distributed(_plain, str(tmp_path / "resumed"), str(path))
    for r in range(2):
        assert full[r]["order"] == ["RexCallback", "ModelCheckpoint"]
        assert resumed[r]["seen"] == [s for s in full[r]["seen"] if s[1] >= 23]
        # a plan only splits each global batch: the weights agree to rounding
        assert (resumed[r]["params"] - full[r]["params"]).abs().max().item() < 1e-10
    # the checkpoint taken at step 23 holds the callback's state of that step: after the
    # warm-up (one step; the equal times are at speed, so it ends there), the first two
    # segments (steps 1-10 and 11-20; three looks per window of 30) were gathered and are
    # the first two thirds of the controller's window; the segment being filled has steps
    # 21 and 22 (the last one trained)
    state = torch.load(path, weights_only=False)["callbacks"]["RexCallback"]
    assert state["steps"] == [21, 22]
    assert state["warm_until"] is None and state["fit_start"] is None
    partial = state["controller"]["segments"]
    assert [(s["start"], s["end"]) for s in partial] == [(1, 11), (11, 21)]


def _key(rank: int) -> str:
    return "fast-gpu" if rank % 2 == 0 else "slow-gpu"


def _rates(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank % 2 == 0 else 1000.0)


def _two_then_three(rank: int, tmp: str, ckpt: str | None) -> dict[str, Any]:
    # CPU ranks all report "cpu": give them the identities of two GPU kinds
    session_module.device_key = lambda device, telemetry: _key(rank)  # type: ignore[assignment]
    cb = with_step_times(_rates, window=10, background=False)
    ck = [ModelCheckpoint(dirpath=tmp, every_n_train_steps=80, save_top_k=-1)] if not ckpt else []
    t = quiet_trainer(
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=RexStrategy(),
        max_steps=80 if ckpt is None else 90,
        callbacks=[cb, *ck],
        enable_checkpointing=ckpt is None,
    )
    t.fit(RegModel(), DataLoader(make_dataset(64 * 200), batch_size=32), ckpt_path=ckpt)
    return {"history": cb.plan_history, "plan": t.strategy.plan}


def test_a_resume_on_more_ranks_plans_from_the_rates_of_each_device(tmp_path: Path) -> None:
    before = run_distributed(_two_then_three, str(tmp_path), None)
    assert len(before[0]["history"]) >= 2  # the 2-rank run learned the rates and acted
    ckpt = str(tmp_path / "epoch=0-step=80.ckpt")
    after = run_distributed(_two_then_three, str(tmp_path), ckpt, world_size=3)
    history = after[0]["history"]
    assert history[0] == (0, (32, 32, 32)) and history[1][0] == 80, history
    fitted = history[1][1]  # from the first step of the resumed run, before any window
    assert fitted[1] < fitted[0] and fitted[1] < fitted[2]  # the slow device kind gets less
    assert sum(fitted) == 96 and after[1]["history"] == after[2]["history"] == history
