"""Every epoch after a resume on another world size trains each sample exactly once.

A mid-epoch checkpoint resumed on fewer (or more) ranks re-cuts the rest of the interrupted
epoch at the new global batch. Lightning counts an epoch's batches once, when the fit
starts, from the loader as restored; the strategy must size every later epoch from the
sampler, or each one is cut short (2 -> 1 ranks trained 688 of 1000 samples per epoch).
These run on real gloo ranks over several epochs, with and without global batch scaling,
and after changes of the global batch made before the checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset, permutation
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import GlobalBatchScaling, RexCallback, RexStrategy
from lightning_rex.core.plans.plan import even_plan

pytestmark = pytest.mark.distributed

BS = 16


class _ChangeBatch(Callback):
    """At given steps, schedule a plan of another global batch (what the scaler would do)."""

    def __init__(self, changes: dict[int, int]) -> None:
        self.changes = changes

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        b = self.changes.get(trainer.global_step)
        if b is not None:
            target = trainer.strategy.plan_target
            target.schedule_plan(even_plan(b, trainer.world_size), target.first_free_step())


def _callback(scaling: bool) -> RexCallback:
    # a window no run reaches: the controller never decides, the schedule is the test's
    cfg = GlobalBatchScaling(4, 96, min_noise_steps=10**6) if scaling else None
    return RexCallback(window=500, warmup=0, background=False, global_batch=cfg)


def _first(rank: int, tmp: str, n: int, step: int, changes: dict[int, int], scaling: bool) -> Any:
    model = RegModel()
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=step, save_top_k=-1)
    t = quiet_trainer(
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=RexStrategy(),
        max_steps=step,
        callbacks=[_callback(scaling), _ChangeBatch(changes), ck],
        enable_checkpointing=True,
        default_root_dir=tmp,
    )
    t.fit(model, DataLoader(make_dataset(n), batch_size=BS, shuffle=True))
    return model.seen


def _second(rank: int, tmp: str, n: int, ckpt: str, epochs: int, scaling: bool) -> Any:
    model = RegModel()
    t = quiet_trainer(
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=RexStrategy(),
        max_epochs=epochs,
        callbacks=[_callback(scaling)],
        default_root_dir=tmp,
    )
    t.fit(model, DataLoader(make_dataset(n), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return model.seen


def _resume(
    tmp: Path,
    n: int,
    before: int,
    after: int,
    step: int,
    epochs: int,
    changes: dict[int, int] | None = None,
    scaling_before: bool = False,
    scaling_after: bool = False,
) -> dict[int, list[int]]:
    """Train, checkpoint at ``step``, resume for ``epochs`` more; the samples of every epoch."""
    a = run_distributed(
        _first, str(tmp / "a"), n, step, changes or {}, scaling_before, world_size=before
    )
    ckpt = next((tmp / "a").glob(f"epoch=*-step={step}.ckpt"))
    last = int(ckpt.name.split("-")[0].removeprefix("epoch=")) + epochs
    b = run_distributed(
        _second, str(tmp / "b"), n, str(ckpt), last, scaling_after, world_size=after
    )
    per_epoch: dict[int, list[int]] = {}
    for part in (a, b):
        for rank in part:
            for e, _, ix in rank:
                per_epoch.setdefault(e, []).extend(ix)
    return per_epoch


def _missing_and_repeated(per_epoch: dict[int, list[int]], n: int) -> dict[int, tuple[int, int]]:
    return {
        e: (len(set(range(n)) - set(ix)), len(ix) - len(set(ix))) for e, ix in per_epoch.items()
    }


@pytest.mark.parametrize(("before", "after"), [(2, 1), (3, 2)])
def test_a_resume_on_fewer_ranks_trains_every_later_epoch_whole(
    before: int, after: int, tmp_path: Path
) -> None:
    # 1000 samples: every final partial batch holds at least one sample per rank
    got = _missing_and_repeated(_resume(tmp_path, 1000, before, after, 20, 3), 1000)
    assert got == {0: (0, 0), 1: (0, 0), 2: (0, 0)}


def test_a_resume_on_more_ranks_after_a_change_of_the_global_batch(tmp_path: Path) -> None:
    per_epoch = _resume(tmp_path, 1000, 2, 3, 12, 2, {5: 48, 9: 64}, True, True)
    assert _missing_and_repeated(per_epoch, 1000) == {0: (0, 0), 1: (0, 0)}


@pytest.mark.parametrize("scaling_after", [True, False])
def test_a_same_size_resume_after_a_change_of_the_global_batch(
    scaling_after: bool, tmp_path: Path
) -> None:
    per_epoch = _resume(tmp_path, 1000, 2, 2, 12, 2, {5: 48}, True, scaling_after)
    assert _missing_and_repeated(per_epoch, 1000) == {0: (0, 0), 1: (0, 0)}


def _tail_only(per_epoch: dict[int, list[int]], n: int, world: int) -> None:
    """Each epoch: no sample twice; only a final partial batch too small to split is left."""
    for e, ix in per_epoch.items():
        assert len(ix) == len(set(ix)), f"epoch {e}: a sample trained twice"
        missing = set(range(n)) - set(ix)
        tail = set(permutation(n, 0, e)[n - len(missing) :])
        assert len(missing) < 3 * world and missing == tail, (e, sorted(missing))


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    before=st.integers(1, 3),
    after=st.integers(1, 3),
    step=st.integers(1, 40),
    changes=st.lists(st.sampled_from([8, 24, 40, 64, 96]), max_size=2),
    scaling_after=st.booleans(),
    epochs=st.integers(2, 3),
)
def test_property_every_epoch_after_any_resume_is_exactly_once(
    before: int,
    after: int,
    step: int,
    changes: list[int],
    scaling_after: bool,
    epochs: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    n = 300
    scaling_before = bool(changes) and before > 1
    at = {2 + 3 * i: b for i, b in enumerate(changes) if b >= before} if scaling_before else {}
    tmp = tmp_path_factory.mktemp("resume")
    per_epoch = _resume(
        tmp, n, before, after, step, epochs, at, scaling_before, scaling_after and after > 1
    )
    assert set(per_epoch) >= set(range(epochs))
    _tail_only(per_epoch, n, max(before, after))
