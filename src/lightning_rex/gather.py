"""The few collectives the callback issues, each on the training thread and on every rank.

All ranks must call these at the same point: they are collectives (except without an
initialised process group, where they return this rank's value alone).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_rex.telemetry import GpuTelemetry

__all__ = ["device_key", "gather_objects", "gather_rows"]


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_rows(trainer: pl.Trainer, local: torch.Tensor) -> np.ndarray:
    """All-gather one 1-D tensor per rank into an ``(N, len)`` array, in one collective.

    Args:
        trainer: The Trainer (its strategy does the all-gather; NCCL needs device tensors).
        local: This rank's row; every rank passes the same length.

    Returns:
        The rows of all ranks, in rank order.
    """
    if not _distributed():
        return local.reshape(1, -1).numpy()
    strategy = trainer.strategy
    nccl = torch.distributed.get_backend() == "nccl"
    out = strategy.all_gather(local.to(strategy.root_device if nccl else torch.device("cpu")))
    return out.reshape(trainer.world_size, -1).cpu().numpy()


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
