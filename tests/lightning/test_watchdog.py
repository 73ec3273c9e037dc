"""The hang watchdog on 2 real gloo ranks: a hung rank ends the run, a shared pause does not.

Without it the ranks that reach the step's all-reduce wait for the stuck one until the
process group's timeout (30 minutes on NCCL); the issue's probe saw both ranks alive after
150 s. With the watchdog every rank ends with a ``RexRankError`` naming the stuck rank, the
stuck rank's process too. A pause every rank shares (a validation) followed by a slow fetch
on one rank is not a hang: the old rule counted the stall from the last progress and killed
such runs. ``REX_WATCHDOG_TRIALS`` (default 2) sets how many pause-and-lag fits run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tests.helpers.dist import run_distributed, run_expecting_failure
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, Dataset

from lightning_rex import RexCallback, RexStrategy

pytestmark = pytest.mark.distributed

LIMIT = 4.0
POLL = LIMIT / 10  # the watchdog's poll at this limit
PAUSE_S, LAG_S = 8.0, 1.0  # a validation on every rank, then one rank's slow fetch


class _Sleeps(RegModel):
    def __init__(self, rank: int, mark: str) -> None:
        super().__init__()
        self.stuck, self.mark = rank, mark

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.stuck and self.global_step == 12:
            Path(self.mark).write_text(str(time.monotonic()))  # one clock for every process
            time.sleep(10**6)
        return super().training_step(batch, batch_idx)


class _SaysItsException(Callback):
    def __init__(self, root: str) -> None:
        self.root = root

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        Path(self.root, f"on_exception_{trainer.global_rank}").write_text(type(exception).__name__)


def _fit(rank: int, stuck: int, root: str, timeout: float | None) -> int:
    cbs = [RexCallback(window=10, hang_timeout=timeout), _SaysItsException(root)]
    t = quiet_trainer(strategy=RexStrategy(), max_steps=40, callbacks=cbs, default_root_dir=root)
    model = _Sleeps(stuck, os.path.join(root, "hung_at"))
    try:
        t.fit(model, DataLoader(make_dataset(64 * 40), batch_size=32))
    finally:
        Path(root, f"ended_{rank}").write_text(str(time.monotonic()))
    return t.global_step


@pytest.mark.parametrize("stuck", [1, 0])
def test_a_rank_asleep_in_its_training_step_ends_every_rank(stuck: int, tmp_path: Path) -> None:
    out = run_expecting_failure(_fit, stuck, str(tmp_path), LIMIT, deadline=60)
    for r in (0, 1):
        assert out[r]["exitcode"] == 1, out  # ended, not killed at the deadline
        assert out[r]["error"] == "RexRankError", out
        assert f"lightning-rex failed on rank {stuck}" in out[r]["message"], out
        assert f"rank {stuck} made no progress" in out[r]["message"], out
        # the on_exception hooks ran on both ranks, the one blocked in the all-reduce too
        assert (tmp_path / f"on_exception_{r}").read_text() == "RexRankError"
    # both processes ended on their error (the hung one's main thread too), not at the
    # harness's deadline: the seconds from the hang, for the record
    hung_at = float((tmp_path / "hung_at").read_text())
    took = [float((tmp_path / f"ended_{r}").read_text()) - hung_at for r in (0, 1)]
    print(f"ranks ended {took[0]:.2f} s and {took[1]:.2f} s after rank {stuck} hung")
    assert max(took) < 10 * LIMIT, took


class _LagsAfterValidation(Dataset):
    """The train data; rank 1's first fetch after each validation takes ``lag`` seconds."""

    def __init__(self, n: int, rank: int, lag: float) -> None:
        self.data, self.rank, self.lag = make_dataset(n), rank, lag
        self.owed = False

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        if self.owed and self.rank == 1:
            self.owed = False
            time.sleep(self.lag)
        return self.data[i]


class _PausesInValidation(RegModel):
    def __init__(self, data: _LagsAfterValidation, pause: float) -> None:
        super().__init__()
        self.data, self.pause = data, pause

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(self.pause)  # every rank, in one validation batch

    def on_validation_end(self) -> None:
        self.data.owed = True


def _pause_fit(rank: int, root: str, fits: int) -> list[int]:
    steps = []
    for _ in range(fits):
        data = _LagsAfterValidation(32 * 2 * 15, rank, lag=LAG_S)
        t = quiet_trainer(
            # rank 0 trains its micro-batch in passes of 8, rank 1 in one: their backward
            # counts differ, their progress must not
            strategy=RexStrategy(max_pass_sizes=[8, None]),
            max_steps=15,
            callbacks=[RexCallback(window=10, hang_timeout=LIMIT, hang_factor=1.0)],
            default_root_dir=root,
            val_check_interval=10,
            check_val_every_n_epoch=None,
            limit_val_batches=1,
            num_sanity_val_steps=0,
        )
        model = _PausesInValidation(data, pause=PAUSE_S)
        t.fit(model, DataLoader(data, batch_size=32), DataLoader(make_dataset(16), batch_size=16))
        steps.append(t.global_step)
    return steps


def test_a_pause_on_every_rank_then_a_slow_fetch_on_one_is_not_a_hang(tmp_path: Path) -> None:
    # the issue's scaled case: a 4 s limit, 8 s of validation on both ranks, then rank 1's
    # next fetch takes 1 s; one validation per fit (after step 10)
    fits = int(os.environ.get("REX_WATCHDOG_TRIALS", "2"))
    out = run_distributed(_pause_fit, str(tmp_path), fits, timeout=60 + 20 * fits)
    assert out == [[15] * fits, [15] * fits]


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


class _StuckSaving(Callback):
    """Rank 1 sleeps in its ``state_dict`` (ahead of rex's own in the callback list)."""

    def state_dict(self) -> dict[str, Any]:
        if torch.distributed.get_rank() == 1:
            time.sleep(10**6)
        return {}


class _SavesAtStep12(Callback):
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == 12:
            trainer.save_checkpoint(os.path.join(trainer.default_root_dir, "at12.ckpt"))


def _fit_stuck_saving(rank: int, root: str) -> int:
    cbs = [_SavesAtStep12(), _StuckSaving(), RexCallback(window=10, hang_timeout=LIMIT)]
    t = quiet_trainer(strategy=RexStrategy(), max_steps=40, callbacks=cbs, default_root_dir=root)
    t.fit(RegModel(), DataLoader(make_dataset(64 * 40), batch_size=32))
    return t.global_step


def test_a_rank_stuck_before_rexs_checkpoint_gather_is_found(tmp_path: Path) -> None:
    # rank 0 waits in rex's gather for rank 1, stuck in the callback before it: progress
    # advances around rex's collectives, so rank 1 is behind (both at the same step's end
    # otherwise, and no rule could tell them apart)
    out = run_expecting_failure(_fit_stuck_saving, str(tmp_path), deadline=60)
    for r in (0, 1):
        assert out[r]["exitcode"] == 1, out
        assert "rank 1 made no progress" in out[r]["message"], out


class _Fails(RegModel):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1 and self.global_step == 12:
            raise ValueError("a bug on rank 1 only")
        return super().training_step(batch, batch_idx)


def _fit_failing(rank: int, root: str) -> int:
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    cbs = [RexCallback(window=10, hang_timeout=LIMIT), OnExceptionCheckpoint(root)]
    t = quiet_trainer(
        strategy=RexStrategy(),
        max_steps=40,
        callbacks=cbs,
        default_root_dir=root,
        enable_checkpointing=True,
    )
    t.fit(_Fails(), DataLoader(make_dataset(64 * 40), batch_size=32))
    return t.global_step


def test_an_exception_on_one_rank_whose_handlers_then_hang_ends_both_processes(
    tmp_path: Path,
) -> None:
    # rank 1's OnExceptionCheckpoint starts a collective while rank 0 waits in the step's
    # all-reduce: the watchdog, still watching the handlers, ends rank 1 a limit later
    # (it used to stop in rex's on_exception, before OnExceptionCheckpoint ran)
    out = run_expecting_failure(_fit_failing, str(tmp_path), deadline=60)
    assert out[0]["exitcode"] == 1 and out[1]["exitcode"] == 1, out
