"""The few collectives the callback issues, each on the training thread and on every rank.

All ranks must call these at the same point: they are collectives (except without an
initialised process group, where they return this rank's value alone).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_rex.measure.telemetry import GpuTelemetry

__all__ = ["broadcast_row", "device_key", "gather_objects", "gather_rows"]


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _comm_device(trainer: pl.Trainer) -> torch.device:
    """Where collective tensors live: the rank's device for NCCL, the CPU otherwise."""
    nccl = torch.distributed.get_backend() == "nccl"
    return trainer.strategy.root_device if nccl else torch.device("cpu")


def gather_rows(trainer: pl.Trainer, local: torch.Tensor) -> np.ndarray:
    """All-gather one 1-D tensor per rank into an ``(N, len)`` array, in one collective.

    Args:
        trainer: The Trainer (for the device NCCL needs).
        local: This rank's row; every rank passes the same length.

    Returns:
        The rows of all ranks, in rank order.
    """
    if not _distributed():
        return local.reshape(1, -1).numpy()
    # torch.distributed directly: no autograd wrapper (Lightning's all_gather has one), a
    # window boundary costs one plain collective
    mine = local.to(_comm_device(trainer))
    rows = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(rows, mine)
    return torch.stack(rows).cpu().numpy()


def broadcast_row(trainer: pl.Trainer, row: torch.Tensor) -> torch.Tensor:
    """Broadcast rank 0's 1-D tensor to every rank, in one collective.

    Args:
        trainer: The Trainer (for the device NCCL needs).
        row: Rank 0's values; other ranks pass a tensor of the same shape and dtype.

    Returns:
        Rank 0's row, on the CPU.
    """
    if not _distributed():
        return row
    buf = row.to(_comm_device(trainer))
    torch.distributed.broadcast(buf, src=0)
    return buf.cpu()


def gather_objects(trainer: pl.Trainer, obj: Any) -> list[Any]:
    """All-gather one picklable object per rank.

    Args:
        trainer: The Trainer, for the world size.
        obj: This rank's object.

    Returns:
        The objects of all ranks, in rank order.
    """
    if not _distributed():
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def device_key(device: torch.device, telemetry: GpuTelemetry | None) -> str:
    """A rank's device identity, to key measured rates: the GPU's name, or the device type.

    Args:
        device: The rank's device.
        telemetry: Its NVML telemetry, if any.

    Returns:
        For example ``"NVIDIA A100-SXM4-80GB"`` or ``"cpu"``.
    """
    ident = telemetry.identity() if telemetry is not None else None
    if ident is not None:
        return str(ident["name"])
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return device.type
