"""Manual optimization under REX: two optimizers, and no_sync with accumulation, in float64.

``manual_backward`` goes through the strategy's ``backward``, which scales each rank's loss
by ``N x b_r / B`` exactly as under automatic optimization. A module with two optimizers
(a GAN's shape: two losses, two backward passes, two steps per batch) and one that
accumulates two batches under ``block_backward_sync`` must end with the parameters of one
process training on the whole global batches, under an uneven plan that changes mid-run.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed
from tests.helpers.models import IN, flat_params, global_batches, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch import nn

import lightning as L
from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

N, B, EPOCHS = 64 * 4, 64, 2


def _nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(3)
    one = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    two = nn.Sequential(nn.Linear(IN, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    return one, two


def _opts(one: nn.Module, two: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    return (
        torch.optim.SGD(one.parameters(), lr=0.05, momentum=0.9),
        torch.optim.Adam(two.parameters(), lr=0.01),
    )


def _losses(one: nn.Module, two: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    # per-sample means, as a weighted all-reduce needs; the second also reaches the first net
    return ((one(x) - y) ** 2).mean(), ((two(x) - y) ** 2 + 0.1 * one(x) * two(x)).mean()


class TwoOptimizers(L.LightningModule):
    def __init__(self, accumulate: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.one, self.two = _nets()
        self.accumulate = accumulate

    def training_step(self, batch: Any, batch_idx: int) -> None:
        o1, o2 = self.optimizers()  # type: ignore[misc]
        x, y, _ = batch
        last = (batch_idx + 1) % self.accumulate == 0

        def sync() -> Any:  # no all-reduce on batches that only accumulate
            return self.trainer.strategy.block_backward_sync() if not last else _nothing()

        with sync():
            l1, _ = _losses(self.one, self.two, x, y)
            self.manual_backward(l1 / self.accumulate)
        if last:
            o1.step()
            o1.zero_grad()
        with sync():
            _, l2 = _losses(self.one, self.two, x, y)
            self.manual_backward(l2 / self.accumulate)
        if last:
            o2.step()
            o2.zero_grad()

    def configure_optimizers(self) -> Any:
        return _opts(self.one, self.two)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


class _ChangePlan(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.fit_loop.epoch_loop._batches_that_stepped == 2 and not trainer.strategy._changed:
            trainer.strategy._changed = trainer.strategy.set_plan([20, 44])


def _train(rank: int) -> dict[str, Any]:
    out = {}
    for acc in (1, 2):
        model = TwoOptimizers(acc)
        # each loss uses part of the model, as in a GAN: DDP needs find_unused_parameters
        strategy = RexStrategy(
            micro_batch_sizes=[44, 20], adaptive=False, find_unused_parameters=True
        )
        strategy._changed = 0  # type: ignore[attr-defined]
        t = quiet_trainer(strategy=strategy, max_epochs=EPOCHS, callbacks=[_ChangePlan()])
        t.fit(model, torch.utils.data.DataLoader(make_dataset(N), batch_size=B // 2, shuffle=True))
        out[acc] = {
            "params": torch.cat([flat_params(model.one), flat_params(model.two)]),
            "schedule": t.strategy.train_loader.batch_sampler.schedule,
        }
    return out


def _reference(accumulate: int) -> torch.Tensor:
    one, two = _nets()
    o1, o2 = _opts(one, two)
    x, y, _ = make_dataset(N).tensors
    for epoch in range(EPOCHS):
        for i, gb in enumerate(global_batches(N, B, 2, seed=0, epoch=epoch)):
            last = (i + 1) % accumulate == 0
            l1, _ = _losses(one, two, x[gb], y[gb])
            (l1 / accumulate).backward()
            if last:
                o1.step()
                o1.zero_grad()
            _, l2 = _losses(one, two, x[gb], y[gb])
            (l2 / accumulate).backward()
            if last:
                o2.step()
                o2.zero_grad()
    return torch.cat([flat_params(one), flat_params(two)])


def test_two_optimizers_and_no_sync_accumulation_match_one_process() -> None:
    out = run_distributed(_train)
    for acc in (1, 2):
        ref = _reference(acc)
        for r in range(2):
            assert (out[r][acc]["params"] - ref).abs().max().item() < 1e-10, acc
        # steps count batches under manual optimization: the change lands on batch 3
        assert out[0][acc]["schedule"] == out[1][acc]["schedule"] == [(0, (44, 20)), (3, (20, 44))]
