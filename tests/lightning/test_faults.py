"""Failures on one rank reach every rank: 2 real gloo ranks, each must end non-zero in 60 s.

A REX-side error (rank 0's controller, in its background thread or inline) travels through
the next exchange: every rank raises the same RexRankError naming rank 0 and the original
message (rank 1's error type proves it came through the exchange, not a closed socket). An
exception in a user's training_step, or a rank that dies, is Lightning's and torch's to
handle: on gloo the survivor's next collective fails once the peer's sockets close.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers.dist import run_expecting_failure
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import RexStrategy
from lightning_rex.core.decide.controller import Controller

pytestmark = pytest.mark.distributed


def _times(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank == 0 else 1000.0)


class _Dies(RegModel):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1 and self.global_step == 25:
            if self.how == "raise":
                raise RuntimeError("user code failed on rank 1")
            os._exit(1)
        return super().training_step(batch, batch_idx)


def _fit(rank: int, how: str, root: str) -> None:
    if how in ("controller-background", "controller-inline") and rank == 0:
        real = Controller.observe

        def observe(self: Controller, window: Any) -> Any:
            if self.windows_seen == 1:
                raise ArithmeticError("the model blew up")
            return real(self, window)

        Controller.observe = observe  # type: ignore[method-assign]
    background = how != "controller-inline"
    cb = with_step_times(_times, window=10, background=background)
    model = _Dies(how) if how in ("raise", "exit") else RegModel()
    t = quiet_trainer(strategy=RexStrategy(), max_steps=200, callbacks=[cb], default_root_dir=root)
    t.fit(model, DataLoader(make_dataset(64 * 200), batch_size=32))


@pytest.mark.parametrize("how", ["controller-background", "controller-inline"])
def test_an_error_in_rank_0s_controller_is_raised_on_every_rank(how: str, tmp_path: Path) -> None:
    out = run_expecting_failure(_fit, how, str(tmp_path))
    for r in (0, 1):
        assert out[r]["exitcode"] == 1, out
        assert out[r]["error"] == "RexRankError", out
        assert "lightning-rex failed on rank 0" in out[r]["message"]
        assert "ArithmeticError: the model blew up" in out[r]["message"]


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_rank_whose_training_step_fails_or_dies_ends_every_rank(how: str, tmp_path: Path) -> None:
    out = run_expecting_failure(_fit, how, str(tmp_path))
    assert out[1]["exitcode"] == 1, out
    if how == "raise":
        assert out[1]["error"] == "RuntimeError" and "user code failed" in out[1]["message"]
    assert out[0]["exitcode"] == 1, out  # not None: it did not hang until the deadline


def _too_small(rank: int, root: str) -> None:
    t = quiet_trainer(
        strategy=RexStrategy(max_micro_batch_size=20), max_steps=5, default_root_dir=root
    )
    t.fit(RegModel(), DataLoader(make_dataset(64 * 5), batch_size=32))


def test_bounds_no_plan_can_meet_fail_on_every_rank(tmp_path: Path) -> None:
    """max_micro_batch_size x N < B is found by every rank's strategy, not by rank 0 alone."""
    out = run_expecting_failure(_too_small, str(tmp_path))
    for r in (0, 1):
        assert out[r]["exitcode"] == 1 and out[r]["error"] == "ValueError", out
        assert (
            "max_micro_batch_size=20 x 2 ranks is below the global batch B=64"
            in (out[r]["message"])
        )
