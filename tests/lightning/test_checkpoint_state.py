"""Tampered checkpoints: every REX entry is checked before any step trains on it.

One test per invariant: plans that sum to B, one size per rank within the bounds, a
consumed count inside the epoch (and matching the consumed samples), a non-empty schedule
in step order, a controller state of the right shape, and per-rank partial rows of one
length. Each gives an error naming the field, and no batch is trained.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tests.helpers.dist import run_distributed, run_expecting_failure
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import RexStrategy
from lightning_rex.core.saved import StateError

N, BS, STEPS = 500, 16, 13


def _times(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank == 0 else 1000.0)


class _Trained(L.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches += 1


def _fit(tmp: str, devices: int, ckpt: str | None = None, **strategy: Any) -> _Trained:
    trained = _Trained()
    cb = with_step_times(_times, window=5, warmup=0, background=False)
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=STEPS, save_top_k=-1)
    t = quiet_trainer(
        devices=devices,
        strategy=RexStrategy(**strategy),
        max_steps=STEPS if ckpt is None else STEPS + 10,
        callbacks=[cb, ck, trained],
        enable_checkpointing=True,
        default_root_dir=tmp,
    )
    t.fit(RegModel(), DataLoader(make_dataset(N), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return trained


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("one")
    _fit(str(tmp), 1)
    return torch.load(tmp / f"epoch=0-step={STEPS}.ckpt", weights_only=False)


def _sampler(ck: dict[str, Any]) -> dict[str, Any]:
    return ck["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["rex_sampler"]


def _driver(ck: dict[str, Any]) -> dict[str, Any]:
    return ck["callbacks"]["RexCallback"]


CASES = {
    "plan not summing to B": (
        lambda c: _sampler(c).__setitem__("schedule", [[0, [17]]]),
        r"rex_sampler\.schedule\[0\]\[1\] plan must sum to the global batch B=16",
    ),
    "a size per rank": (
        lambda c: _sampler(c).__setitem__("schedule", [[0, [8, 8]]]),
        r"rex_sampler\.schedule\[0\]\[1\] must have 1 entries",
    ),
    "consumed outside the epoch": (
        lambda c: _sampler(c).__setitem__("consumed", 40),
        r"rex_sampler\.consumed must be in \[0, 32\], got 40",
    ),
    "consumed samples disagree": (
        lambda c: _sampler(c).__setitem__("consumed_samples", 100),
        r"rex_sampler\.consumed_samples is 100, but 13 batches",
    ),
    "empty schedule": (
        lambda c: _sampler(c).__setitem__("schedule", []),
        r"rex_sampler\.schedule must be a non-empty list",
    ),
    "schedule out of step order": (
        lambda c: _sampler(c).__setitem__("schedule", [[5, [16]], [2, [16]]]),
        r"rex_sampler\.schedule\[1\]\[0\] must be after the previous entry's step 5",
    ),
    "garbage controller": (
        lambda c: _driver(c).__setitem__("controller", {"state": "steady"}),
        r"controller\.plan is missing",
    ),
    "controller of the wrong shape": (
        lambda c: _driver(c)["controller"]["model"].__setitem__("cutoff", [0, 0, 0]),
        r"controller\.model\.cutoff must have 1 entries",
    ),
    "partial row of the wrong length": (
        lambda c: _driver(c)["partial"][0].pop(),
        r"rex_driver\.partial\[0\] must hold one sample per step of the window \(3\)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_entry_is_refused_before_any_step(
    case: str, saved: dict[str, Any], tmp_path: Path
) -> None:
    tamper, match = CASES[case]
    ck = copy.deepcopy(saved)
    tamper(ck)
    path = tmp_path / "tampered.ckpt"
    torch.save(ck, path)
    trained = _Trained()
    with pytest.raises(StateError, match=match):
        trained = _fit(str(tmp_path), 1, str(path))
    assert trained.batches == 0


def _save_two(rank: int, tmp: str) -> None:
    _fit(tmp, 2, max_micro_batch_size=50)


def _resume_two(rank: int, tmp: str, path: str) -> None:
    trained = _fit(tmp, 2, path, max_micro_batch_size=50)
    assert trained.batches == 0  # never reached: the fit raises first


@pytest.mark.distributed
def test_on_two_ranks_mismatched_rows_and_a_plan_above_the_bound_fail_everywhere_at_once(
    tmp_path: Path,
) -> None:
    run_distributed(_save_two, str(tmp_path))
    saved = torch.load(tmp_path / f"epoch=0-step={STEPS}.ckpt", weights_only=False)
    rows = copy.deepcopy(saved)
    _driver(rows)["partial"][1].append(0.01)  # rank 1's row one sample longer
    bound = copy.deepcopy(saved)
    _sampler(bound)["schedule"].append([STEPS + 1, [60, 4]])  # above max_micro_batch_size
    for ck, field in ((rows, "rex_driver.partial[1]"), (bound, "rex_sampler.schedule[")):
        path = tmp_path / "tampered.ckpt"
        torch.save(ck, path)
        out = run_expecting_failure(_resume_two, str(tmp_path), str(path), deadline=60)
        for r in (0, 1):
            assert out[r]["exitcode"] == 1 and out[r]["error"] == "StateError", out
            assert field in out[r]["message"], out
