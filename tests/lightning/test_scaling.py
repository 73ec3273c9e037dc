"""Global batch scaling's training pieces, in-process: gradient norms and the rate rule."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rex import GlobalBatchScaling
from lightning_rex.lightning.scaling import GradientNorms, TrainingScaling


def test_norms_undo_the_loss_factor_and_see_the_local_gradient() -> None:
    # one process standing in for rank 1 of a plan (3, 5): REX scales its mean loss by
    # N b_r / B = 2 x 5 / 8; the norms are those of the unscaled mean gradient
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 1, bias=False)
    norms = GradientNorms(list(lin.parameters()))
    x, y = torch.randn(5, 4), torch.randn(5, 1)
    (g,) = torch.autograd.grad(((lin(x) - y) ** 2).mean(), list(lin.parameters()))
    ((lin(x) - y) ** 2).mean().mul(2 * 5 / 8).backward()  # the hook keeps this backward's
    a, glob = norms.read((3, 5), 1, "mean")
    assert a == pytest.approx(float(g.pow(2).sum()) * 5 / 8, rel=1e-5)
    # without an all-reduce the "global" gradient is this process's p.grad, as scaled
    assert glob == pytest.approx(float(lin.weight.grad.pow(2).sum()), rel=1e-5)
    # a non-finite local gradient comes back as NaN (the step is then skipped)
    lin.zero_grad()
    (lin(x).sum() * float("inf")).backward()
    assert math.isnan(norms.read((3, 5), 1, "mean")[0])
    norms.remove()


def test_adascale_follows_the_noise_every_step_the_other_rules_only_the_batch() -> None:
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    for rule, moves in (("adascale", True), ("sqrt", False)):
        opt.param_groups[0]["lr"] = 0.1
        ts = TrainingScaling(GlobalBatchScaling(8, 64, lr_rule=rule), 16, list(lin.parameters()))
        for _ in range(20):
            ts.noise.update(2.0, 1.0, (8, 8))  # |G|^2 = 0, tr(Sigma) = 16: noise only
        assert ts.at_step_start([opt], (16, 16))  # B 16 -> 32
        first = opt.param_groups[0]["lr"]
        for _ in range(20):
            ts.noise.update(1.2, 1.0, (8, 8))  # more signal: a smaller gain at 32
        assert not ts.at_step_start([opt], (16, 16))  # same batch: no log line
        assert (opt.param_groups[0]["lr"] != first) is moves
        ts.norms.remove()
    saved = ts.state_dict()
    again = TrainingScaling(GlobalBatchScaling(8, 64), 16, list(lin.parameters()), saved)
    assert again.rate.factor == ts.rate.factor and again.batch == 32
    again.norms.remove()


def test_a_step_without_backward_or_not_usable_is_left_out() -> None:
    lin = torch.nn.Linear(2, 1)
    norms = GradientNorms(list(lin.parameters()))
    calls = []

    def reduce(t: torch.Tensor) -> torch.Tensor:
        calls.append(float(t))
        return t

    # no backward reached the hooks (training_step returned None): NaN, all-reduce kept
    assert math.isnan(norms.read((2, 2), 0, "mean", all_reduce=reduce)[0])
    lin(torch.ones(3, 2)).sum().backward()
    # a partial final batch under accumulation: left out, all-reduce kept
    assert math.isnan(norms.read((2, 2), 0, "mean", all_reduce=reduce, usable=False)[0])
    assert len(calls) == 2
    norms.remove()
