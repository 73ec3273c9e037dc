"""A resume from a checkpoint taken at an epoch's end continues as the uninterrupted run.

Lightning handles the end of an epoch in several ways, and a resumed loader meets each:
the checkpoint after validation at the epoch's end (Lightning goes on in the restored epoch
to finish it), a loader rebuilt every epoch, a ``max_steps`` run resumed from
``ModelCheckpoint``'s default (Lightning counts itself as restarting there), and an epoch
that ``limit_train_batches`` ends early. Each scenario runs on 2 gloo ranks with a change of
the global batch in epoch 0, and compares the resumed run's samples at every step with the
uninterrupted run's.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import GlobalBatchScaling, RexCallback, RexStrategy
from lightning_rex.core.plans.plan import even_plan

pytestmark = pytest.mark.distributed

N = 200  # 13 global batches of 16, then 17 + 8 of 8 after the change


class _ValModel(RegModel):
    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return ((self.net(x) - y) ** 2).mean()


class _ChangeBatch(Callback):
    """At step 2, schedule a global batch of 8 (what the scaler would do); ``later`` is
    ``(step, batch, at)``: at that step, schedule that batch from step ``at``."""

    def __init__(self, later: tuple[int, int, int] | None) -> None:
        self.later = later

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        target = trainer.strategy.plan_target
        if trainer.global_step == 2:
            target.schedule_plan(even_plan(8, trainer.world_size), target.first_free_step())
        if self.later is not None and trainer.global_step == self.later[0]:
            target.schedule_plan(even_plan(self.later[1], trainer.world_size), self.later[2])


def _fit(tmp: str, o: dict[str, Any], ckpt: str | None) -> list[tuple[int, int, list[int]]]:
    # the previous fit's garbage (its Trainer, loaders and process group handles, in
    # reference cycles) is freed here, not in the DataLoader workers this fit forks
    gc.collect()
    model = (_ValModel if o.get("val") else RegModel)()
    # a window no run reaches: the controller never decides, the schedule is the test's
    cfg = GlobalBatchScaling(4, 64, min_noise_steps=10**6)
    callbacks: list[Callback] = [
        RexCallback(window=500, warmup=0, background=False, global_batch=cfg),
        _ChangeBatch(o.get("later")),
    ]
    if ckpt is None:
        callbacks.append(ModelCheckpoint(dirpath=tmp, save_top_k=-1, **o["checkpoint"]))
    t = quiet_trainer(
        strategy=RexStrategy(),
        callbacks=callbacks,
        enable_checkpointing=ckpt is None,
        default_root_dir=tmp,
        **o["trainer"],
    )
    workers = o.get("workers", 0)
    train = DataLoader(
        make_dataset(N),
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    val = DataLoader(make_dataset(32), batch_size=8) if o.get("val") else None
    t.fit(model, train, val, ckpt_path=ckpt)
    return model.seen


def _scenario(rank: int, tmp: str, o: dict[str, Any]) -> tuple[list[Any], list[Any], int]:
    full = _fit(f"{tmp}/full", o, None)
    # the checkpoint at the end of epoch 0 (where it ends depends on when the change landed)
    end = max(step for epoch, step, _ in full if epoch == 0) + 1
    ckpt = next(Path(tmp, "full").glob(f"epoch=0-step={end}.ckpt"))
    return full, _fit(f"{tmp}/resumed", o, str(ckpt)), end


def _continued(rank: int, tmp: str, o: dict[str, Any]) -> tuple[list[Any], list[Any], int]:
    # a run that max_steps ended mid-epoch, continued to more steps from its last (epoch-end)
    # checkpoint, against a run that went there at once
    full = _fit(f"{tmp}/full", o, None)
    first = {**o, "trainer": o["first"]}
    _fit(f"{tmp}/first", first, None)
    stop = o["first"]["max_steps"]
    ckpt = next(Path(tmp, "first").glob(f"epoch=*-step={stop}.ckpt"))
    return full, _fit(f"{tmp}/resumed", o, str(ckpt)), stop


SCENARIOS = {
    # validation at the epoch's end, checkpoint after it: Lightning resumes in epoch 0 to end
    # it, and the workers fetch ahead from the loader before Lightning moves on
    "after validation, workers": {
        "val": True,
        "workers": 2,
        "checkpoint": {"every_n_epochs": 1, "save_on_train_epoch_end": False},
        "trainer": {"max_epochs": 3},
    },
    # the loader rebuilt at every epoch's start, after the resume
    "loader rebuilt every epoch": {
        "workers": 2,
        "checkpoint": {"every_n_train_steps": 1},
        "trainer": {"max_epochs": 3, "reload_dataloaders_every_n_epochs": 1},
    },
    # bounded by steps, resumed from ModelCheckpoint's default
    "max_steps, epoch-end checkpoint": {
        "checkpoint": {"every_n_epochs": 1},
        "trainer": {"max_steps": 50},
    },
    # epochs that Lightning's limit ends early: the checkpoint at epoch 0's last batch has
    # batches left, and Lightning moves on (a fraction as the limit is not exact here: Lightning
    # cuts it once per fit from the loader's length, which the change of the batch moved)
    "limit_train_batches": {
        "workers": 2,
        "checkpoint": {"every_n_train_steps": 1},
        "trainer": {"max_epochs": 3, "limit_train_batches": 5},
    },
}


# max_steps ends epoch 1 at its 18th batch; the epoch-end checkpoint is not an epoch's end.
# Continued to more steps (max_epochs counts that epoch as done unless it is told otherwise)
SCENARIOS["max_steps ended an epoch early, continued"] = {
    "checkpoint": {"every_n_epochs": 1},
    "trainer": {"max_steps": 60, "max_epochs": 2},
    "first": {"max_steps": 40, "max_epochs": 2},
}
# ... on a batch that validated (Lightning then counts that step again, and a change of the
# batch scheduled before the stop would land a step early)
SCENARIOS["max_steps ended an epoch early on a validation, continued"] = {
    "val": True,
    "later": (38, 16, 50),
    "checkpoint": {"every_n_epochs": 1, "save_on_train_epoch_end": True},
    "trainer": {"max_steps": 60, "val_check_interval": 2},
    "first": {"max_steps": 41, "val_check_interval": 2},  # epoch 1's 18th batch validates
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_resume_at_an_epochs_end_continues_with_the_same_samples(
    tmp_path: Path, name: str
) -> None:
    o = SCENARIOS[name]
    results = run_distributed(_continued if "first" in o else _scenario, str(tmp_path), o)
    for full, resumed, start in results:
        assert resumed, "the resumed run trained"
        assert resumed == [s for s in full if s[1] >= start]
    # every epoch of the uninterrupted run trained each sample once, across the ranks
    epochs: dict[int, list[int]] = {}
    for full, _, _ in results:
        for epoch, _, ids in full:
            epochs.setdefault(epoch, []).extend(ids)
    assert all(len(ids) == len(set(ids)) for ids in epochs.values())
