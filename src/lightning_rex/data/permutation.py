"""Every epoch's permutation of the dataset: the one DDP draws, heard as each epoch starts.

:class:`EpochPermutation` is the one-replica :class:`torch.utils.data.DistributedSampler`
the :class:`~lightning_rex.data.sampler.UnevenBatchSampler` cuts its batches from, over a
:class:`SizedStandIn` (a dataset that only has a length).
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import DistributedSampler

__all__ = ["EpochPermutation", "SizedStandIn"]


class SizedStandIn:
    """A stand-in dataset that only has a length, for DistributedSampler."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class EpochPermutation(DistributedSampler):
    """The one-replica DistributedSampler that draws every epoch's permutation.

    Lightning moves it to the next epoch (``set_epoch`` through
    ``loader.batch_sampler.sampler``) at the start of every epoch, before it iterates the
    loader; ``on_set_epoch`` hears of it there, the one moment at which the new epoch's
    length is known and Lightning can still be told.
    """

    on_set_epoch: Callable[[int], None] | None = None

    def set_epoch(self, epoch: int, notify: bool = True) -> None:
        """Draw ``epoch``'s permutation, then tell the listener.

        Args:
            epoch: The epoch.
            notify: Whether to tell the listener.
        """
        super().set_epoch(epoch)
        if notify and self.on_set_epoch is not None:
            self.on_set_epoch(epoch)
