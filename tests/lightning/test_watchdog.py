"""The hang watchdog on 2 real gloo ranks: a rank stuck in its training_step ends the run.

Without it the ranks that reach the step's all-reduce wait for the stuck one until the
process group's timeout (30 minutes on NCCL); the issue's probe saw both ranks alive after
150 s. With the watchdog every rank ends with a ``RexRankError`` naming the stuck rank.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed, run_expecting_failure
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import RexCallback, RexStrategy

pytestmark = pytest.mark.distributed


class _Sleeps(RegModel):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.stuck = rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.stuck and self.global_step == 12:
            time.sleep(10**6)
        return super().training_step(batch, batch_idx)


def _fit(rank: int, stuck: int, root: str, timeout: float | None) -> int:
    cb = RexCallback(window=10, hang_timeout=timeout)
    t = quiet_trainer(strategy=RexStrategy(), max_steps=40, callbacks=[cb], default_root_dir=root)
    model = _Sleeps(stuck)
    t.fit(model, DataLoader(make_dataset(64 * 40), batch_size=32))
    return t.global_step


@pytest.mark.parametrize("stuck", [1, 0])
def test_a_rank_asleep_in_its_training_step_ends_every_rank(stuck: int, tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = run_expecting_failure(_fit, stuck, str(tmp_path), 4.0, deadline=60)
    assert time.monotonic() - t0 < 60
    for r in (0, 1):
        assert out[r]["exitcode"] == 1, out  # ended, not killed at the deadline
        assert out[r]["error"] == "RexRankError", out
        assert f"lightning-rex failed on rank {stuck}" in out[r]["message"], out
        assert f"rank {stuck} made no progress" in out[r]["message"], out


def test_a_run_with_slow_steps_is_not_taken_for_a_hang(tmp_path: Path) -> None:
    # a 3 s floor, steps of 50-100 ms on both ranks and validations of 4 s in between: no
    # hang (a 1 s floor was within a loaded 2-core machine's stalls: it failed once in CI)
    class Slow(RegModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            time.sleep(0.05 * (1 + self.global_rank))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(1.0)

    def fit(rank: int) -> int:
        t = quiet_trainer(
            strategy=RexStrategy(),
            max_steps=30,
            callbacks=[RexCallback(hang_timeout=3.0, hang_factor=5.0)],
            default_root_dir=str(tmp_path),
            val_check_interval=15,
            limit_val_batches=4,
        )
        data = DataLoader(make_dataset(64 * 30), batch_size=32)
        t.fit(Slow(), data, DataLoader(make_dataset(64), batch_size=16))
        return t.global_step

    assert run_distributed(fit) == [30, 30]
