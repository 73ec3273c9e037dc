"""Mid-epoch checkpoints resumed on more, fewer or the same number of ranks: exactly once.

Lightning sizes the epoch from ``len(loader)`` before it restores the loader's state; the
strategy restores the position first, so the resumed epoch has the right number of
batches. Every case trains the rest of the interrupted epoch, and the test checks that the
samples of that epoch, before and after the resume, are each used exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset, permutation
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N, BS = 203, 16  # the 203-sample epoch, batch_size 16 per rank


def _first(rank: int, tmp: str, steps: int) -> list[Any]:
    model = RegModel()
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=steps, save_top_k=-1)
    t = quiet_trainer(
        devices=int(__import__("os").environ["WORLD_SIZE"]),
        strategy=RexStrategy(),
        max_steps=steps,
        callbacks=[ck],
        enable_checkpointing=True,
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=BS, shuffle=True))
    return model.seen


def _second(rank: int, ckpt: str) -> dict[str, Any]:
    model = RegModel()
    t = quiet_trainer(
        devices=int(__import__("os").environ["WORLD_SIZE"]), strategy=RexStrategy(), max_epochs=1
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return {"seen": model.seen, "plan": t.strategy.plan, "batches": t.num_training_batches}


@pytest.mark.parametrize(("before", "after", "step"), [(1, 2, 3), (1, 2, 10), (2, 3, 3), (2, 1, 3)])
def test_resume_on_another_world_size_uses_every_sample_once(
    before: int, after: int, step: int, tmp_path: Path
) -> None:
    seen_before = run_distributed(_first, str(tmp_path), step, world_size=before)
    ckpt = str(tmp_path / f"epoch=0-step={step}.ckpt")
    out = run_distributed(_second, ckpt, world_size=after)
    used = [i for rank in seen_before for e, _, ix in rank if e == 0 for i in ix]
    used += [i for r in out for e, _, ix in r["seen"] if e == 0 for i in ix]
    assert len(used) == len(set(used)), "a sample was trained twice"
    perm = permutation(N, 0, 0)
    missing = sorted(set(perm) - set(used))
    # the only samples left out are a final global batch too small to give every rank one
    assert len(missing) < after and set(missing) <= set(perm[N - len(missing) :]), missing
    assert len({r["batches"] for r in out}) == 1  # every rank ran the same number of steps


def _second_again(rank: int, tmp: str, ckpt: str) -> list[Any]:
    """Resume on 2 ranks, checkpoint inside that resumed epoch, and stop."""
    model = RegModel()
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=5, save_top_k=-1)
    t = quiet_trainer(
        strategy=RexStrategy(), max_steps=5, callbacks=[ck], enable_checkpointing=True
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return model.seen


def test_a_second_same_size_resume_inside_a_resized_epoch_loses_nothing(tmp_path: Path) -> None:
    a = run_distributed(_first, str(tmp_path / "a"), 3, world_size=1)
    b = run_distributed(
        _second_again, str(tmp_path / "b"), str(tmp_path / "a" / "epoch=0-step=3.ckpt")
    )
    c = run_distributed(_second, str(tmp_path / "b" / "epoch=0-step=5.ckpt"))
    used = [i for part in (a, b) for rank in part for e, _, ix in rank if e == 0 for i in ix]
    used += [i for r in c for e, _, ix in r["seen"] if e == 0 for i in ix]
    assert len(used) == len(set(used))
    assert len(set(permutation(N, 0, 0)) - set(used)) < 2
