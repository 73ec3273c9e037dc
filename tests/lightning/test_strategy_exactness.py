"""Exactness of the weighted all-reduce on 2 real gloo ranks (fork start), in float64.

All configurations run in one forked pair of processes (one process group), so the suite
stays fast; each configuration is then checked by its own parametrized test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed
from tests.helpers.models import (
    RegModel,
    flat_params,
    global_batches,
    make_dataset,
    reference_train,
)
from tests.helpers.trainer import quiet_trainer

import lightning as L
from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N_SAMPLES = 64 * 3 + 20  # three full global batches and a partial one of 20 per epoch
EPOCHS = 2
PLANS = {"48-16": [48, 16], "60-4": [60, 4], "1-63": [1, 63], "even": None}
UNEVEN = [k for k, v in PLANS.items() if v is not None]

# (opt, reduction, accumulate, change plan in mid-run)
VARIANTS = {
    "sgd-mean-a1": ("sgd", "mean", 1, False),
    "adam-mean-a2-change": ("adam", "mean", 2, True),
    "sgd-sum-a2": ("sgd", "sum", 2, False),
    "adam-sum-a1-change": ("adam", "sum", 1, True),
}


class _UnweightedRex(RexStrategy):
    """Plain DDP averaging on uneven micro-batches: what REX must not do."""

    def current_loss_scale(self) -> float:
        return 1.0


class _ChangePlan(L.Callback):
    def __init__(self, at_step: int, plan: list[int]) -> None:
        self.at_step, self.plan, self.effective = at_step, plan, None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step and self.effective is None:
            self.effective = trainer.strategy.set_plan(self.plan)


def _fit(
    rank: int,
    plan: list[int] | None,
    opt: str,
    reduction: str,
    accumulate: int,
    change: bool,
    unweighted: bool = False,
) -> dict[str, Any]:
    cls = _UnweightedRex if unweighted else RexStrategy
    strategy = cls(micro_batch_sizes=plan, loss_reduction=reduction)
    callbacks: list[L.Callback] = []
    if change:
        callbacks.append(_ChangePlan(at_step=1, plan=[40, 24] if plan != [40, 24] else [8, 56]))
    model = RegModel(opt=opt, reduction=reduction)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=EPOCHS,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
    )
    ds = make_dataset(N_SAMPLES)
    trainer.fit(model, torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True))
    return {
        "params": flat_params(model.net),
        "seen": model.seen,
        "schedule": trainer.strategy.train_loader.batch_sampler.schedule,
        "effective": callbacks[0].effective if change else None,
    }


def _worker(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pname, plan in PLANS.items():
        for vname, (opt, red, acc, change) in VARIANTS.items():
            out[(pname, vname)] = _fit(rank, plan, opt, red, acc, change)
    for pname in UNEVEN:
        out[(pname, "unweighted")] = _fit(rank, PLANS[pname], "sgd", "mean", 1, False, True)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_distributed(_worker)


@pytest.fixture(scope="module")
def references() -> dict[str, torch.Tensor]:
    ds = make_dataset(N_SAMPLES)
    return {
        v: reference_train(ds, 64, 2, epochs=EPOCHS, opt=o, reduction=r, accumulate=a)
        for v, (o, r, a, _) in VARIANTS.items()
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("plan", list(PLANS))
def test_matches_single_process(
    results: list[dict[str, Any]], references: dict[str, torch.Tensor], plan: str, variant: str
) -> None:
    ref = references[variant]
    for rank in range(2):
        got = results[rank][(plan, variant)]["params"]
        assert (got - ref).abs().max().item() < 1e-10


@pytest.mark.parametrize("plan", list(PLANS))
def test_ranks_take_the_plan_and_cover_each_global_batch(
    results: list[dict[str, Any]], plan: str
) -> None:
    r0, r1 = (results[r][(plan, "sgd-mean-a1")] for r in range(2))
    want = PLANS[plan] or [32, 32]
    for epoch in range(EPOCHS):
        gbs = global_batches(N_SAMPLES, 64, 2, seed=0, epoch=epoch)
        s0 = [s for s in r0["seen"] if s[0] == epoch]
        s1 = [s for s in r1["seen"] if s[0] == epoch]
        assert len(s0) == len(s1) == len(gbs)
        for k, gb in enumerate(gbs):
            assert s0[k][2] + s1[k][2] == gb  # contiguous slices of perm[kB:(k+1)B]
            if len(gb) == 64:
                assert [len(s0[k][2]), len(s1[k][2])] == want


@pytest.mark.parametrize("variant", [v for v, spec in VARIANTS.items() if spec[3]])
def test_plan_change_applies_at_the_returned_step_on_both_ranks(
    results: list[dict[str, Any]], variant: str
) -> None:
    out = [results[r][("48-16", variant)] for r in range(2)]
    eff = out[0]["effective"]
    assert eff is not None and eff == out[1]["effective"] and eff >= 1
    assert out[0]["schedule"] == out[1]["schedule"] == [(0, (48, 16)), (eff, (40, 24))]
    full = {(e, st): len(ix) for e, st, ix in out[0]["seen"]}
    for (_, step), size in full.items():
        if size in (48, 40):
            assert size == (40 if step >= eff else 48)


@pytest.mark.parametrize("plan", UNEVEN)
def test_plain_ddp_weighting_misses(
    results: list[dict[str, Any]], references: dict[str, torch.Tensor], plan: str
) -> None:
    got = results[0][(plan, "unweighted")]["params"]
    assert (got - references["sgd-mean-a1"]).abs().max().item() > 1e-4
