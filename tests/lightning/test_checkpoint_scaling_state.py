"""Tampered checkpoints of a run with global batch scaling: refused before any step.

Every field the scaler, the learning-rate rule, the window loop and the sampler saved is
checked when a run resumes: finite, in range, of the right type and shape, and consistent
with the run. Each case here was accepted (and trained on, some with a negative learning
rate) or failed with a raw exception before; now both ranks raise a ``StateError`` naming
the field, and no batch is trained. A property test tampers random fields.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import ModelCheckpoint
from tests.helpers.dist import run_distributed, run_expecting_failure
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import GlobalBatchScaling, RexStrategy

pytestmark = pytest.mark.distributed

N, BS, STEPS = 2000, 16, 57


def _times(rank: int, step: int, b: int) -> float:
    return 0.05 + b / (4000.0 if rank == 0 else 2000.0)


class _Trained(L.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches += 1


def _fit(rank: int, tmp: str, ckpt: str | None = None) -> int:
    cfg = GlobalBatchScaling(16, 256, min_noise_steps=20, windows_between=1)
    cb = with_step_times(_times, window=10, warmup=0, background=False, global_batch=cfg)
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=STEPS, save_top_k=-1)
    trained = _Trained()
    t = quiet_trainer(
        strategy=RexStrategy(),
        max_steps=STEPS if ckpt is None else STEPS + 5,
        callbacks=[cb, ck, trained],
        enable_checkpointing=True,
        default_root_dir=tmp,
    )
    t.fit(RegModel(), DataLoader(make_dataset(N), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return trained.batches


def _resume(rank: int, tmp: str, path: str) -> None:
    batches = _fit(rank, tmp, path)
    raise AssertionError(f"the tampered checkpoint trained {batches} batches")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("scaling")
    run_distributed(_fit, str(tmp))
    ck = torch.load(tmp / f"epoch=0-step={STEPS}.ckpt", weights_only=True)
    assert "scaler" in _cb(ck)["controller"] and "batch_scaling" in _cb(ck)
    return ck


def _cb(ck: dict[str, Any]) -> dict[str, Any]:
    return ck["callbacks"]["RexCallback"]


def _sampler(ck: dict[str, Any]) -> dict[str, Any]:
    return ck["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["rex_sampler"]


def _set(path: list[Any], value: Any) -> Any:
    def tamper(ck: dict[str, Any]) -> None:
        d: Any = ck
        for k in path[:-1]:
            d = d[k]
        if value is _DELETE:
            del d[path[-1]]
        else:
            d[path[-1]] = value

    return tamper


_DELETE = object()
CB = ["callbacks", "RexCallback"]
BSC = [*CB, "batch_scaling"]
DEC = [*CB, "controller"]
SAMPLER = ["loops", "fit_loop", "state_dict", "combined_loader", 0, "rex_sampler"]

CASES: dict[str, tuple[Any, str]] = {
    # accepted, and trained on
    "negative lr_factor": (_set([*BSC, "lr_factor"], -1.0), r"batch_scaling\.lr_factor"),
    "huge lr_factor": (_set([*BSC, "lr_factor"], 1e308), r"batch_scaling\.lr_factor"),
    "NaN lr_factor": (_set([*BSC, "lr_factor"], math.nan), r"batch_scaling\.lr_factor"),
    "lr_factor not the rule's": (_set([*BSC, "lr_factor"], 1.5), r"batch_scaling\.lr_factor"),
    "NaN noise average": (
        _set([*DEC, "scaler", "noise", "s"], math.nan),
        r"decider\.scaler\.noise\.s",
    ),
    "noise decay 2": (_set([*BSC, "noise", "decay"], 2.0), r"batch_scaling\.noise\.decay"),
    "base_batch 0": (_set([*DEC, "scaler", "base_batch"], 0), r"decider\.scaler\.base_batch"),
    "change.batch 100000": (
        _set([*DEC, "change"], {"batch": 100000, "plan": [50000, 50000], "baseline": [0.1]}),
        r"decider\.change\.batch",
    ),
    "batch outside the range": (_set([*BSC, "batch"], 4096), r"batch_scaling\.batch"),
    "NaN observation": (
        _set([*DEC, "scaler", "obs", 0, 1], math.nan),
        r"decider\.scaler\.obs\[0\]\[1\]",
    ),
    "negative observation variance": (
        _set([*DEC, "scaler", "obs", 0, 2], -1.0),
        r"decider\.scaler\.obs\[0\]\[2\]",
    ),
    "callback world_size 3": (_set([*CB, "world_size"], 3), r"rex_driver\.world_size"),
    # raw exceptions
    "missing noise": (_set([*BSC, "noise"], _DELETE), r"batch_scaling\.noise is missing"),
    "missing lr_factor": (_set([*BSC, "lr_factor"], _DELETE), r"batch_scaling\.lr_factor is"),
    "state as a string": (_set(BSC, "scaling"), r"batch_scaling must be a mapping"),
    "state as a list": (_set(BSC, [1, 2]), r"batch_scaling must be a mapping"),
    "string lr_factor": (_set([*BSC, "lr_factor"], "1.0"), r"batch_scaling\.lr_factor"),
    "NaN in the schedule": (
        _set([*SAMPLER, "schedule", 0, 1, 0], math.nan),
        r"rex_sampler\.schedule\[0\]\[1\]\[0\]",
    ),
    "NaN consumed_samples": (
        _set([*SAMPLER, "consumed_samples"], math.nan),
        r"rex_sampler\.consumed_samples",
    ),
    # window loop and controller fields
    "NaN partial step time": (_set([*CB, "partial", 0, 0], math.nan), r"rex_driver\.partial"),
    "negative partial step time": (_set([*CB, "partial", 0, 0], -0.5), r"rex_driver\.partial"),
    "infinite partial step time": (_set([*CB, "partial", 1, 0], math.inf), r"rex_driver\.partial"),
    "huge exchange step": (_set([*CB, "exchange_at"], 10**12), r"rex_driver\.exchange_at"),
    "float plan size": (
        _set([*SAMPLER, "schedule", 0, 1], [16.0, 16]),
        r"rex_sampler\.schedule\[0\]\[1\]\[0\] must be an integer",
    ),
    "huge min_micro_batch_size": (
        _set([*DEC, "controller", "min_size"], 10**9),
        r"controller\.min_size",
    ),
}


def _refused(tmp: Path, ck: dict[str, Any]) -> dict[int, dict[str, Any]]:
    path = tmp / "tampered.ckpt"
    torch.save(ck, path)
    return run_expecting_failure(_resume, str(tmp / "run"), str(path), deadline=90)


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_scaling_checkpoint_is_refused_before_any_step(
    case: str, saved: dict[str, Any], tmp_path: Path
) -> None:
    tamper, match = CASES[case]
    ck = copy.deepcopy(saved)
    tamper(ck)
    out = _refused(tmp_path, ck)
    for r in (0, 1):
        assert out[r]["exitcode"] == 1 and out[r]["error"] == "StateError", out
        assert __import__("re").search(match, out[r]["message"]), out


def _leaves(x: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the numbers, flags and lists of the REX entries of a checkpoint."""
    out: list[tuple[Any, ...]] = []
    if isinstance(x, dict):
        for k, v in x.items():
            if k != "significance":  # a free-form summary, only written to the log
                out += _leaves(v, (*path, k))
    elif isinstance(x, list):
        out.append(path)
        for i, v in enumerate(x):
            out += _leaves(v, (*path, i))
    elif isinstance(x, (int, float)):  # bools included
        out.append(path)
    return out


BAD = [math.nan, math.inf, -math.inf, "x", [[]], {"a": 1}]


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(which=st.integers(0, 10**9), bad=st.sampled_from(BAD), where=st.sampled_from(["cb", "s"]))
def test_property_no_tampered_field_trains(
    which: int, bad: Any, where: str, saved: dict[str, Any], tmp_path_factory: Any
) -> None:
    ck = copy.deepcopy(saved)
    root = (CB, _cb(ck)) if where == "cb" else (SAMPLER, _sampler(ck))
    paths = _leaves(root[1])
    path = list(paths[which % len(paths)])
    _set([*root[0], *path], bad)(ck)
    out = _refused(tmp_path_factory.mktemp("tamper"), ck)
    for r in (0, 1):
        assert out[r]["error"] == "StateError", (path, bad, out)
