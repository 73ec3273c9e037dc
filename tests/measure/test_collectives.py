"""The collective wrappers: who is told what, and what is left as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from lightning_rex.measure import collectives


class _Log:
    def __init__(self, name: str, into: list[str]) -> None:
        self.name, self.into = name, into

    def collective_entered(self) -> None:
        self.into.append(f"{self.name} in")

    def collective_left(self) -> None:
        self.into.append(f"{self.name} out")

    def collective_unseen(self, name: str, why: str) -> None:
        self.into.append(f"{self.name} unseen {name}: {why}")


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_listeners_hear_each_blocking_collective_once_in_their_order(group: None) -> None:
    events: list[str] = []
    late, first = _Log("late", events), _Log("first", events)
    original = dist.all_reduce
    collectives.add_listener(late)
    collectives.add_listener(first, first=True)
    try:
        assert dist.all_reduce is not original
        dist.all_reduce(torch.ones(2))
        dist.all_gather_object([None], {"a": 1})  # runs all_gather inside: one collective
        dist.barrier()
    finally:
        collectives.remove_listener(late)
        collectives.remove_listener(first)
    assert events == ["first in", "late in", "first out", "late out"] * 3
    assert dist.all_reduce is original  # the last listener gone: the originals are back


def test_an_asynchronous_collective_is_reported_as_unseen(group: None) -> None:
    events: list[str] = []
    listener = _Log("timer", events)
    collectives.add_listener(listener)
    try:
        dist.all_reduce(torch.ones(1), async_op=True).wait()
        dist.broadcast(torch.ones(1), 0, None, True).wait()  # async_op given by position
    finally:
        collectives.remove_listener(listener)
    assert events == [
        "timer unseen all_reduce: it is asynchronous (async_op=True)",
        "timer unseen broadcast: it is asynchronous (async_op=True)",
    ]


def test_without_listeners_nothing_is_wrapped() -> None:
    import torch.distributed.distributed_c10d as c10d

    listener = _Log("x", [])
    before = {name: getattr(dist, name) for name in collectives.COLLECTIVES}
    collectives.add_listener(listener)
    collectives.add_listener(listener)  # twice: once
    assert c10d.all_gather is not before["all_gather"]
    collectives.remove_listener(listener)
    assert {name: getattr(dist, name) for name in collectives.COLLECTIVES} == before
    assert c10d.all_gather is before["all_gather"]
