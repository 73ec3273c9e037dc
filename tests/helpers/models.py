"""Tiny float64 models and a single-process reference trainer for exactness tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

IN = 6


def make_dataset(n: int, seed: int = 123, dtype: torch.dtype = torch.float64) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g, dtype=dtype)
    y = (x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g, dtype=dtype)).to(dtype)
    return TensorDataset(x, y, torch.arange(n))


def make_net(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(IN, 12), nn.Tanh(), nn.Linear(12, 1)).to(dtype)


def make_optimizer(params: Any, name: str, reduction: str = "mean") -> torch.optim.Optimizer:
    # a summed loss over 64 samples has 64x the gradient: keep SGD stable with a smaller step
    scale = 1.0 / 64 if reduction == "sum" else 1.0
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05 * scale, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(name)


class RegModel(L.LightningModule):
    """Regression on (x, y, index) batches; records which indices each step saw."""

    def __init__(
        self,
        opt: str = "sgd",
        reduction: str = "mean",
        dtype: torch.dtype = torch.float64,
        log_mean: bool = False,
    ) -> None:
        super().__init__()
        self.net = make_net(dtype)
        self.opt = opt
        self.reduction = reduction
        self.log_mean = log_mean
        self.seen: list[tuple[int, int, list[int]]] = []  # (epoch, global_step, indices)
        self.step_logs: list[tuple[int, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, idx = batch
        per_sample = ((self.net(x) - y) ** 2).squeeze(-1)
        loss = per_sample.mean() if self.reduction == "mean" else per_sample.sum()
        self.seen.append((self.current_epoch, self.trainer.global_step, idx.tolist()))
        if self.log_mean:
            mean = x[:, 0].mean()
            self.log("xmean", mean, sync_dist=True, on_step=True, on_epoch=True)
            # the loader's batch size, as Lightning recommends where it cannot infer one
            self.log("xmean_bs", mean, sync_dist=True, on_epoch=True, batch_size=32)
            self.log("xmean_w", mean, sync_dist=True, on_epoch=True, batch_size=3)  # a weight
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters(), self.opt, self.reduction)


def flat_params(module: nn.Module) -> torch.Tensor:
    """Every parameter, flat, float64; a sharded (FSDP2) one gathered whole (a collective)."""
    from torch.distributed.tensor import DTensor

    ps = [p.full_tensor() if isinstance(p, DTensor) else p for p in module.parameters()]
    return torch.cat([p.detach().reshape(-1).cpu().to(torch.float64) for p in ps])


def permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def global_batches(
    n: int, global_batch: int, world: int, seed: int, epoch: int, drop_last: bool = False
) -> list[list[int]]:
    perm = permutation(n, seed, epoch)
    full, rem = divmod(n, global_batch)
    out = [perm[k * global_batch : (k + 1) * global_batch] for k in range(full)]
    if rem >= world and not drop_last:
        out.append(perm[full * global_batch :])
    return out


def reference_train(
    ds: TensorDataset,
    global_batch: int,
    world: int,
    *,
    epochs: int,
    opt: str,
    reduction: str,
    accumulate: int = 1,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    autocast: bool = False,
) -> torch.Tensor:
    """One process training on the whole global batches, as Lightning would step."""
    net = make_net(dtype)
    optimizer = make_optimizer(net.parameters(), opt, reduction)
    x, y, _ = ds.tensors
    for epoch in range(epochs):
        batches = global_batches(len(ds), global_batch, world, seed, epoch)
        for i, b in enumerate(batches):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                per_sample = ((net(x[b]) - y[b]) ** 2).squeeze(-1)
                loss = per_sample.mean() if reduction == "mean" else per_sample.sum()
            (loss / accumulate).backward()
            if (i + 1) % accumulate == 0 or i == len(batches) - 1:
                optimizer.step()
                optimizer.zero_grad()
    return flat_params(net)


def reference_steps(steps: int, n: int = 640, accumulate: int = 1) -> torch.Tensor:
    """One process, SGD, ``steps`` optimizer steps of epoch 0 at ``B = 32`` (2 ranks x 16)."""
    ds = make_dataset(n)
    x, y, _ = ds.tensors
    net = make_net()
    opt = make_optimizer(net.parameters(), "sgd")
    for i, b in enumerate(global_batches(n, 32, 2, 0, 0)[: steps * accumulate]):
        (((net(x[b]) - y[b]) ** 2).squeeze(-1).mean() / accumulate).backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
    return flat_params(net)


class CliModel(RegModel):
    """A RegModel with its own train loader, for LightningCLI tests (no init arguments)."""

    def __init__(self) -> None:
        super().__init__()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(make_dataset(64), batch_size=16)
