"""RexCallback across fits and failures, the BatchNorm minimum, DDP's positional arguments."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch import nn
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import HeterogeneityEmulator, RexCallback, RexStrategy


def _hooks(module: nn.Module) -> int:
    return sum(
        len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in module.parameters()
    )


def _fit(cb: RexCallback, model: L.LightningModule, root: Path, steps: int = 30, **kw: Any) -> Any:
    t = quiet_trainer(
        devices=1,
        strategy=RexStrategy(),
        max_steps=steps,
        callbacks=[cb],
        default_root_dir=root,
        **kw,
    )
    t.fit(model, DataLoader(make_dataset(64 * 40), batch_size=16))
    return t


def test_one_callback_serves_two_fits_from_a_clean_state(tmp_path: Path) -> None:
    cb = with_step_times(lambda r, s, b: 0.001 * b, window=5, warmup=0, background=False)
    _fit(cb, RegModel(), tmp_path)
    first_id, first_records = cb.driver.run_id, len(cb.records)  # type: ignore[union-attr]
    _fit(cb, RegModel(), tmp_path, steps=12)
    assert cb.driver.run_id != first_id  # type: ignore[union-attr]
    # windows of 5: 6 in 30 steps (the last one recorded at the end, unexchanged), 2 in 12
    assert [r["window"] for r in cb.records] == [[0, 5], [5, 10]] and first_records == 6
    # both fits wrote to one file (logger=False): the records stay apart by run id and time
    lines = [json.loads(x) for x in (tmp_path / "rex_decisions.jsonl").read_text().splitlines()]
    assert [r["run_id"] for r in lines].count(first_id) == 6 and len(lines) == 8
    assert "training ended before its exchange" in lines[5]["reason"]
    assert all("T" in r["time"] for r in lines)


class _Fails(RegModel):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 3:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_hooks_are_removed_on_exception_and_at_the_end(tmp_path: Path) -> None:
    model = _Fails()
    cb, emu = RexCallback(), HeterogeneityEmulator([1.0])
    with pytest.raises(RuntimeError, match="boom"):
        t = quiet_trainer(devices=1, strategy=RexStrategy(), max_steps=10, callbacks=[cb, emu])
        t.fit(model, DataLoader(make_dataset(640), batch_size=16))
    assert _hooks(model) == 0
    model = RegModel()
    t = quiet_trainer(
        devices=1, strategy=RexStrategy(), max_steps=3, callbacks=[RexCallback(), emu]
    )
    t.fit(model, DataLoader(make_dataset(640), batch_size=16))
    assert _hooks(model) == 0


class _WithBatchNorm(RegModel):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(6).double()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return ((self.net(self.bn(x)) - y) ** 2).mean()


def test_batchnorm_raises_the_default_minimum_to_two_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        t = quiet_trainer(devices=1, strategy=RexStrategy(), max_steps=1)
        t.fit(_WithBatchNorm(), DataLoader(make_dataset(64), batch_size=16))
    assert t.strategy.bounds.min_size == 2
    assert "BatchNorm layers, so no rank gets a micro-batch below 2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        t = quiet_trainer(devices=1, strategy=RexStrategy(min_micro_batch_size=1), max_steps=1)
        t.fit(_WithBatchNorm(), DataLoader(make_dataset(64), batch_size=16))
    assert t.strategy.bounds.min_size == 1 and "BatchNorm" not in caplog.text
    t = quiet_trainer(devices=1, strategy=RexStrategy(), max_steps=1)
    t.fit(RegModel(), DataLoader(make_dataset(64), batch_size=16))
    assert t.strategy.bounds.min_size == 1


def test_ddp_positional_arguments_are_taken_unchanged() -> None:
    acc = CPUAccelerator()
    s = RexStrategy(acc, micro_batch_sizes=[16])
    assert s.accelerator is acc and s.micro_batch_sizes == (16,)
    t = quiet_trainer(accelerator="auto", devices=1, strategy=s, max_steps=1)
    t.fit(RegModel(), DataLoader(make_dataset(64), batch_size=16))
    assert t.strategy.plan == (16,)
    with pytest.raises(ValueError, match="model_averaging_period is not supported"):
        positional = RexStrategy(acc, None, None, None, None, None, None, None, 4)
        t = quiet_trainer(accelerator="auto", devices=1, strategy=positional, max_steps=1)
        t.fit(RegModel(), DataLoader(make_dataset(64), batch_size=16))


def test_a_log_with_a_malformed_middle_line_neither_stops_a_fit_nor_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a run killed mid-write while another appended glued two records on one line
    cb = with_step_times(lambda r, s, b: 0.001 * b, window=5, warmup=0, background=False)
    _fit(cb, RegModel(), tmp_path, steps=15)
    log = tmp_path / "rex_decisions.jsonl"
    lines = log.read_text().splitlines()
    glued = lines[1][: len(lines[1]) // 2] + lines[2]
    log.write_text("\n".join([lines[0], glued, *lines[3:]]) + "\n")
    with pytest.warns(UserWarning, match="skipped 1 line"):
        t = _fit(
            with_step_times(lambda r, s, b: 0.001 * b, window=5, warmup=0), RegModel(), tmp_path
        )
    assert t.global_step == 30  # trained to the end
    from tests.helpers.cli import run_command

    with pytest.warns(UserWarning, match="skipped 1 line"):
        rc, _, err = run_command(["report", str(log), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0, err
    assert (tmp_path / "rep" / "index.html").exists()
