"""Preemption on 2 real gloo ranks: a signal never deadlocks, and the resume is exactly once.

SIGTERM to one rank, or to both at different steps, arrives inside a step (the rank sends it
to itself in ``on_before_backward``, so the handler runs with the step's collectives ahead).
Under Lightning's own handlers this deadlocked most runs (a broadcast in the handler). Under
rex it is carried to every rank by the next exchange: both ranks save one checkpoint at the
same step and stop; the fit resumed from it sees every sample of every epoch once. SLURM's
requeue signal does the same and requeues the job (a fake ``scontrol`` records it), and the
resumed run finds the checkpoint by itself, as a requeued SLURM job does.
``REX_PREEMPTION_TRIALS`` (default 10) sets how many interrupted-and-resumed runs each case
repeats in the same two processes.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.lightning.test_resume_mid_step import epochs_seen
from torch.utils.data import DataLoader

from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N, EPOCHS = 640, 2  # 20 steps of 32 per epoch
TRIALS = int(os.environ.get("REX_PREEMPTION_TRIALS", "10"))


def _times(rank: int, step: int, b: int) -> float:
    return 0.002 + b / (3000.0 if rank == 0 else 1000.0)  # rank 1 3x slower: plans change


class _SignalsItself(Callback):
    """Rank ``rank`` sends itself ``signum`` inside step ``at[rank]`` (before its backward)."""

    def __init__(self, at: dict[int, int], signum: int) -> None:
        self.at, self.signum, self.sent = at, signum, False

    def on_before_backward(self, trainer: Any, *args: Any) -> None:
        if not self.sent and trainer.global_step == self.at.get(trainer.global_rank):
            self.sent = True
            os.kill(os.getpid(), self.signum)


def _trainer(root: str, extra: list[Any], devices: int = 2) -> Any:
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=RexStrategy(),
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=any(isinstance(c, OnExceptionCheckpoint) for c in extra),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[with_step_times(_times, window=10, background=False), *extra],
    )


def _data() -> DataLoader:
    return DataLoader(make_dataset(N), batch_size=16, shuffle=True)


def _trials(rank: int, root: str, at: dict[int, int], signum: int, resume: str | None) -> Any:
    out = []
    for trial in range(TRIALS):
        run = os.path.join(root, f"run{trial}")
        extra: list[Any] = [_SignalsItself(at, signum)]
        if resume == "on_exception":  # Lightning's own, at the exception rex raises
            extra.append(OnExceptionCheckpoint(run, "on_exception"))
        t = _trainer(run, extra)
        first = RegModel()
        try:
            t.fit(first, _data())
            stopped = None
        except SIGTERMException:
            stopped = t.global_step
        files = sorted(p.name for p in Path(run).glob("hpc_ckpt_*.ckpt"))
        second = RegModel()
        t2 = _trainer(run, [])
        path = os.path.join(run, "on_exception.ckpt") if resume == "on_exception" else resume
        t2.fit(second, _data(), ckpt_path=path)
        out.append((stopped, files, first.seen, second.seen, t2.global_step))
    return out


def _check(out: list[Any]) -> None:
    for trial in range(TRIALS):
        (stop0, files0, before0, after0, end0), (stop1, files1, before1, after1, end1) = (
            out[0][trial],
            out[1][trial],
        )
        assert stop0 is not None and stop0 == stop1, (trial, stop0, stop1)  # one agreed step
        assert files0 == files1 == ["hpc_ckpt_1.ckpt"], (trial, files0)
        assert end0 == end1 == EPOCHS * N // 32
        # the resumed run starts at the step in flight when the checkpoint was taken
        assert min(s[1] for s in after0 + after1) == stop0
        seen = epochs_seen(before0 + before1, after0 + after1, stop0)
        assert sorted(seen) == list(range(EPOCHS))
        for epoch, counts in seen.items():
            assert len(counts) == N, (trial, epoch, N - len(counts))
            assert max(counts.values()) == 1, (trial, epoch)


@pytest.mark.parametrize(
    ("at", "resume"),
    [({1: 13}, "hpc"), ({0: 12, 1: 15}, "hpc"), ({0: 13}, "on_exception")],
    ids=["sigterm-to-one-rank", "sigterm-to-both-ranks", "resume-from-on-exception-checkpoint"],
)
def test_sigterm_checkpoints_every_rank_at_one_step_and_resumes_exactly_once(
    at: dict[int, int], resume: str, tmp_path: Path
) -> None:
    out = run_distributed(_trials, str(tmp_path), at, signal.SIGTERM, resume, timeout=240)
    _check(out)


def _slurm_trials(rank: int, root: str, bin_dir: str) -> Any:
    os.environ.update(
        SLURM_NTASKS="2",
        SLURM_NTASKS_PER_NODE="2",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="rex-test",
        SLURM_NODELIST="127.0.0.1",
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )
    return _trials(rank, root, {1: 13}, signal.SIGUSR1, None)  # SLURM: found by itself


def test_slurms_requeue_signal_checkpoints_requeues_and_resumes_exactly_once(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls"
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = run_distributed(_slurm_trials, str(tmp_path), str(bin_dir), timeout=240)
    _check(out)
    assert calls.read_text().splitlines() == ["requeue 4242"] * TRIALS  # rank 0, once a run


def _interrupted(rank: int, root: str) -> Any:
    t = _trainer(root, [_SignalsItself({1: 13}, signal.SIGTERM)])
    model = RegModel()
    with pytest.raises(SIGTERMException):
        t.fit(model, _data())
    return t.global_step, model.seen


def _resumed(rank: int, root: str) -> Any:
    model = RegModel()
    _trainer(root, [], devices=1).fit(model, _data(), ckpt_path="hpc")
    return model.seen


def test_a_preempted_run_resumes_exactly_once_on_another_world_size(tmp_path: Path) -> None:
    # preempted on 2 ranks, resumed on 1 (a requeued job that got fewer nodes)
    first = run_distributed(_interrupted, str(tmp_path))
    (stop, before0), (stop1, before1) = first
    assert stop == stop1
    after = run_distributed(_resumed, str(tmp_path), world_size=1)[0]
    seen = epochs_seen(before0 + before1, after, stop)
    assert sorted(seen) == list(range(EPOCHS))
    for epoch, counts in seen.items():
        assert len(counts) == N and max(counts.values()) == 1, (epoch, N - len(counts))
