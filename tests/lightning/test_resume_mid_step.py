"""A checkpoint taken inside a step resumes exactly once (2 real gloo ranks).

``trainer.save_checkpoint`` from ``on_train_batch_start``, ``on_before_backward`` or
``on_before_optimizer_step`` is taken while the step's batch is in flight: Lightning resumes
it by training that batch again, so rex's loader must record it as not yet trained. Each
epoch's samples are counted over the first run's steps before the checkpoint and the resumed
run's steps: 1000 of 1000 distinct, none twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.callbacks import Callback
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N, STEP, EPOCHS = 1000, 40, 3


def _times(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank == 0 else 1000.0)  # rank 1 3x slower: plans change


class _SaveInside(Callback):
    """``trainer.save_checkpoint`` from one hook, once, at step ``STEP``."""

    def __init__(self, hook: str, path: str) -> None:
        self.hook, self.path, self.done = hook, path, False

    def _maybe(self, trainer: Any, hook: str) -> None:
        if hook == self.hook and trainer.global_step == STEP and not self.done:
            self.done = True
            trainer.save_checkpoint(self.path)

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self._maybe(trainer, "on_train_batch_start")

    def on_before_backward(self, trainer: Any, *args: Any) -> None:
        self._maybe(trainer, "on_before_backward")

    def on_before_optimizer_step(self, trainer: Any, *args: Any) -> None:
        self._maybe(trainer, "on_before_optimizer_step")


def _fit(rank: int, hook: str, path: str, resume: bool) -> list[tuple[int, int, list[int]]]:
    cb = with_step_times(_times, window=10, background=False)
    extra = [] if resume else [_SaveInside(hook, path)]
    t = quiet_trainer(
        strategy=RexStrategy(),
        max_epochs=EPOCHS,
        max_steps=-1 if resume else STEP + 1,
        callbacks=[cb, *extra],
    )
    model = RegModel()
    t.fit(
        model,
        DataLoader(make_dataset(N), batch_size=16, shuffle=True),
        ckpt_path=path if resume else None,
    )
    return model.seen


def epochs_seen(before: list[Any], after: list[Any], cut: int) -> dict[int, Counter[int]]:
    """Every sample index per epoch: the first run's steps before ``cut``, all the resumed run's."""
    out: dict[int, Counter[int]] = {}
    for epoch, _step, idx in [s for s in before if s[1] < cut] + list(after):
        out.setdefault(epoch, Counter()).update(idx)
    return out


@pytest.mark.parametrize(
    "hook", ["on_train_batch_start", "on_before_backward", "on_before_optimizer_step"]
)
def test_a_checkpoint_taken_inside_a_step_resumes_exactly_once(hook: str, tmp_path: Path) -> None:
    path = str(tmp_path / "inside.ckpt")
    first = run_distributed(_fit, hook, path, False)
    second = run_distributed(_fit, hook, path, True)
    assert min(s[1] for r in (0, 1) for s in second[r]) == STEP  # the step in flight again
    seen = epochs_seen(first[0] + first[1], second[0] + second[1], STEP)
    assert sorted(seen) == list(range(EPOCHS))
    for epoch, counts in seen.items():
        assert len(counts) == N, (epoch, N - len(counts))
        assert max(counts.values()) == 1, (epoch, [i for i, c in counts.items() if c > 1])
