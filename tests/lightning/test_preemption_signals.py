"""The preemption handlers in-process: they only record, they restore, and the checkpoint path."""

from __future__ import annotations

import os
import signal
import stat
import types
from pathlib import Path
from typing import Any

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lightning_rex.driver.stopping import StopKind
from lightning_rex.lightning.preemption import SignalCatcher, hpc_checkpoint_path, requeue_slurm_job


class _Launcher:
    def __init__(self) -> None:
        self.killed: list[int] = []

    def kill(self, signum: int) -> None:
        self.killed.append(signum)


def _trainer(env: Any) -> Any:
    strategy = DDPStrategy(cluster_environment=env)
    launcher = _Launcher()
    strategy._launcher = launcher
    return types.SimpleNamespace(strategy=strategy), launcher


def test_sigterm_is_recorded_forwarded_once_and_the_old_handler_comes_back() -> None:
    trainer, launcher = _trainer(LightningEnvironment())
    got: list[StopKind] = []

    def lightnings(signum: int, frame: Any) -> None:  # the handler the fit found
        raise AssertionError("rex's handler must not call it")

    before = signal.signal(signal.SIGTERM, lightnings)
    try:
        ours = SignalCatcher(trainer, got.append)
        assert list(ours.signals) == [signal.SIGTERM]  # no SLURM: SIGUSR1 is left alone
        assert ours.install() and not ours.install()  # once
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert got == [StopKind.STOP, StopKind.STOP]
        assert launcher.killed == [signal.SIGTERM]  # the ranks it started, once
        ours.uninstall()
        assert signal.getsignal(signal.SIGTERM) is lightnings
    finally:
        signal.signal(signal.SIGTERM, before)


def test_under_slurm_auto_requeue_its_signal_asks_for_a_requeue() -> None:
    trainer, launcher = _trainer(SLURMEnvironment(auto_requeue=True))
    got: list[StopKind] = []
    ours = SignalCatcher(trainer, got.append)
    before = {s: signal.getsignal(s) for s in ours.signals}
    try:
        assert ours.signals == {signal.SIGTERM: StopKind.STOP, signal.SIGUSR1: StopKind.REQUEUE}
        ours.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert got == [StopKind.REQUEUE] and launcher.killed == []
    finally:
        ours.uninstall()
        for s, h in before.items():
            assert signal.getsignal(s) == h
    # without auto-requeue, SLURM's signal is not ours
    trainer, _ = _trainer(SLURMEnvironment(auto_requeue=False))
    assert list(SignalCatcher(trainer, got.append).signals) == [signal.SIGTERM]


def test_the_hpc_checkpoint_path_is_one_past_the_highest(tmp_path: Path) -> None:
    assert hpc_checkpoint_path(tmp_path) == str(tmp_path / "hpc_ckpt_1.ckpt")
    for n in (2, 7):
        (tmp_path / f"hpc_ckpt_{n}.ckpt").write_text("")
    (tmp_path / "hpc_ckpt_x.ckpt").write_text("")
    assert hpc_checkpoint_path(tmp_path) == str(tmp_path / "hpc_ckpt_8.ckpt")
    assert hpc_checkpoint_path(tmp_path / "new") == str(tmp_path / "new" / "hpc_ckpt_1.ckpt")


@pytest.fixture
def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    calls = tmp_path / "calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    return calls


def test_a_job_and_an_array_task_are_requeued_by_their_ids(
    fake_scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    assert requeue_slurm_job() == 0
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert requeue_slurm_job() == 0
    assert fake_scontrol.read_text().splitlines() == ["requeue 99", "requeue 12_3"]


def test_a_malformed_job_id_is_not_passed_to_scontrol(
    fake_scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "1; rm -rf /")
    assert requeue_slurm_job() == 127 and not fake_scontrol.exists()
