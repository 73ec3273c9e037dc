"""The window driver's collectives over ``torch.distributed``, through Lightning Fabric.

:class:`TorchCollectives` implements :class:`~lightning_rex.driver.protocols.Collectives` on
Fabric's :class:`~lightning.fabric.plugins.collectives.TorchCollective` bound to the default
(world) process group that the strategy set up. Rows travel as float64 tensors: on the
rank's device under NCCL, on the CPU otherwise. Plain collectives, no autograd wrappers:
a window boundary costs one ``all_gather`` and an exchange one ``broadcast``.

:func:`driver_collectives` picks it when a process group is initialised, and the driver's
in-process :class:`~lightning_rex.driver.protocols.LocalCollectives` otherwise (one device,
no process group).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins.collectives import TorchCollective

from lightning_rex.driver.protocols import Collectives, LocalCollectives

__all__ = ["TorchCollectives", "driver_collectives"]


class TorchCollectives:
    """One rank per process, over the world process group.

    Args:
        device: The rank's device (collective tensors go there under NCCL).
    """

    def __init__(self, device: torch.device) -> None:
        nccl = dist.get_backend() == "nccl"
        self._device = device if nccl else torch.device("cpu")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()

    @property
    def _c(self) -> TorchCollective:
        # a fresh wrapper per call: it binds the world group when used and holds no
        # reference to it afterwards, so a finished fit keeps no process group alive
        return TorchCollective()

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._world

    @property
    def hosted(self) -> int:
        """One rank per process."""
        return 1

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """All-gather this rank's row into an ``(N, L)`` array, in one collective.

        Args:
            rows: Shape ``(1, L)``; every rank passes the same ``L``.

        Returns:
            Every rank's row, in rank order.
        """
        mine = torch.as_tensor(np.asarray(rows, dtype=np.float64).reshape(-1), device=self._device)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._c.all_gather(out, mine)
        return torch.stack(out).cpu().numpy()

    def broadcast_row(self, row: np.ndarray) -> np.ndarray:
        """Rank 0's row on every rank, in one collective.

        Args:
            row: Rank 0's values; others pass a row of the same shape.

        Returns:
            Rank 0's row.
        """
        buf = torch.as_tensor(np.asarray(row, dtype=np.float64).copy(), device=self._device)
        self._c.broadcast(buf, src=0)
        return buf.cpu().numpy()

    def gather_objects(self, objs: Sequence[Any]) -> list[Any]:
        """All-gather one picklable object per rank.

        Args:
            objs: This rank's object, as a one-element sequence.

        Returns:
            The objects of all ranks, in rank order.
        """
        out: list[Any] = [None] * self.world_size
        self._c.all_gather_object(out, objs[0])
        return out


def driver_collectives(device: torch.device) -> Collectives:
    """The driver's collectives for this process.

    Args:
        device: The rank's device.

    Returns:
        :class:`TorchCollectives` with an initialised process group, else a one-rank
        :class:`~lightning_rex.driver.protocols.LocalCollectives`.
    """
    if dist.is_available() and dist.is_initialized():
        return TorchCollectives(device)
    return LocalCollectives(1)
