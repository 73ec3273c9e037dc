"""The processed train loader: the user's DataLoader with the uneven batch sampler swapped in.

Lightning saves a train loader's position in its checkpoints only when the loader object
itself has ``state_dict`` / ``load_state_dict``. :class:`RexDataLoader` does: it counts the
batches it handed to the training loop (*consumed*, not the ones DataLoader workers have
prefetched) and stores them with the sampler's epoch and plan schedule, so a run resumed
from a mid-epoch checkpoint continues with exactly the batches an uninterrupted run would
have seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.data.sampler import UnevenBatchSampler

__all__ = ["RexDataLoader", "build_rex_loader"]


class RexDataLoader(DataLoader):
    """A DataLoader driven by an :class:`UnevenBatchSampler`, stateful for checkpoints.

    Args:
        dataset: The map-style dataset.
        batch_sampler: The uneven batch sampler for this rank.
        **kwargs: Other DataLoader arguments (workers, collate_fn, pin_memory, ...).
    """

    batch_sampler: UnevenBatchSampler

    def __init__(self, dataset: Any, batch_sampler: UnevenBatchSampler, **kwargs: Any) -> None:
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self._consumed = self._start = 0
        self.in_flight: Callable[[], int] | None = None
        """How many of the batches handed out are still being trained (the training loop's
        count; None: none). A checkpoint taken inside a step records them as not consumed,
        so the resumed run trains them again, as the loop does."""

    @property
    def consumed(self) -> int:
        """Batches of the current epoch handed to the training loop so far."""
        return self._consumed

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        start = self.batch_sampler.resume_position()
        inner = super().__iter__()
        self._consumed = self._start = start

        def counted() -> Iterator[Any]:
            for batch in inner:
                self._consumed += 1
                yield batch

        return counted()

    def state_dict(self) -> dict[str, Any]:
        """The loader position (consumed batches, less any still in flight), epoch and plans.

        Returns:
            A JSON-able dictionary.
        """
        flying = 0 if self.in_flight is None else min(max(0, int(self.in_flight())), 1)
        consumed = max(self._start, self._consumed - flying)
        return {"rex_sampler": self.batch_sampler.state_dict(consumed=consumed)}

    def load_state_dict(self, state_dict: dict[str, Any], over: bool = False) -> None:
        """Restore the position saved by :meth:`state_dict`.

        Args:
            state_dict: The dictionary from :meth:`state_dict`.
            over: Whether the saved epoch is over, whatever its batches left (see
                :meth:`UnevenBatchSampler.load_state_dict`).
        """
        self.batch_sampler.load_state_dict(state_dict["rex_sampler"], over=over)
        self._consumed = self._start = int(state_dict["rex_sampler"]["consumed"])


def _users_sampler(sampler: Any) -> str:
    """The class name of the sampler the user gave (Lightning wraps it for distributed use)."""
    # Lightning's DistributedSamplerWrapper holds it as dataset._sampler
    inner = getattr(getattr(sampler, "dataset", None), "_sampler", None)
    return type(inner if inner is not None else sampler).__name__


def build_rex_loader(
    dataloader: object,
    *,
    world_size: int,
    rank: int,
    plan_for: Callable[[int], Plan],
    accumulate_grad_batches: int = 1,
    step_source: Callable[[], int] | None = None,
    bounds: SizeBounds | None = None,
    plans: PlanSchedule | None = None,
    use_distributed_sampler: bool = True,
    batch_range: tuple[int, int] | None = None,
) -> RexDataLoader:
    """Rebuild a user's train DataLoader around an :class:`UnevenBatchSampler`.

    Args:
        dataloader: The train loader after Lightning injected its DistributedSampler.
        world_size: The number of ranks N.
        rank: This process's global rank.
        plan_for: Maps the global batch B to the initial plan.
        accumulate_grad_batches: Batches per optimizer step.
        step_source: Returns the step count at an epoch's start, to key the plan schedule.
        bounds: The size bounds every plan obeys.
        plans: The run's plan schedule when the loader is rebuilt; None starts one.
        use_distributed_sampler: The Trainer's flag; REX needs it True for training.
        batch_range: ``(min, max)`` global batches plans may sum to (global batch scaling),
            or None.

    Returns:
        The processed loader.

    Raises:
        ValueError: If the loader cannot be split unevenly (no batch size, an iterable
            dataset, a custom sampler or batch sampler, ``use_distributed_sampler=False``).
    """
    if not isinstance(dataloader, DataLoader):
        raise ValueError(
            f"RexStrategy needs a torch.utils.data.DataLoader for training, got "
            f"{type(dataloader).__name__}"
        )
    if isinstance(dataloader.dataset, IterableDataset):
        raise ValueError(
            "RexStrategy does not support an IterableDataset for training: the uneven split cuts "
            "one global permutation, so it needs a map-style dataset with __len__. Use a "
            "map-style dataset, or strategy='ddp'."
        )
    if dataloader.batch_size is None:
        raise ValueError(
            "the train DataLoader needs a batch_size (the per-rank batch size, as under ddp): "
            "RexStrategy splits the global batch batch_size x world_size. Custom batch_sampler "
            "or batch_size=None is not supported."
        )
    sampler = dataloader.sampler
    if not use_distributed_sampler:
        raise ValueError(
            "RexStrategy owns the train sampler and needs Trainer(use_distributed_sampler=True) "
            "(the default); use_distributed_sampler=False is only supported for val/test loaders"
        )
    if type(sampler) is not DistributedSampler:
        raise ValueError(
            "RexStrategy supports the train DataLoader's default samplers only (shuffle=True or "
            f"False); got a custom sampler {_users_sampler(sampler)}. Remove the sampler, or use "
            "strategy='ddp'."
        )
    global_batch = int(dataloader.batch_size) * world_size
    plan = plan_for(global_batch)
    batch_sampler = UnevenBatchSampler(
        len(dataloader.dataset),  # type: ignore[arg-type]
        global_batch,
        plan,
        rank,
        shuffle=bool(sampler.shuffle),
        seed=int(sampler.seed),
        drop_last=bool(dataloader.drop_last),
        accumulate_grad_batches=accumulate_grad_batches,
        step_source=step_source,
        bounds=bounds,
        plans=plans,
        batch_range=batch_range,
    )
    batch_sampler.set_epoch(int(sampler.epoch))
    kwargs: dict[str, Any] = {
        "num_workers": dataloader.num_workers,
        "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory,
        "timeout": dataloader.timeout,
        "worker_init_fn": dataloader.worker_init_fn,
        "multiprocessing_context": dataloader.multiprocessing_context,
        "generator": dataloader.generator,
        "persistent_workers": dataloader.persistent_workers,
        "pin_memory_device": dataloader.pin_memory_device,
    }
    if dataloader.num_workers > 0:
        kwargs["prefetch_factor"] = dataloader.prefetch_factor
    if hasattr(dataloader, "in_order"):
        kwargs["in_order"] = dataloader.in_order
    return RexDataLoader(dataloader.dataset, batch_sampler, **kwargs)
