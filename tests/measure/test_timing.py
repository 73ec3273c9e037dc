"""The compute timer: a micro-batch's span to its last backward's end, less its waits."""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.autograd import Variable

from lightning_rex.measure.timing import ComputeTimer


class _Clock:
    """The timer's stamps: time moves only when the test says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _timer(clock: _Clock, net: torch.nn.Module) -> ComputeTimer:
    timer = ComputeTimer(torch.device("cpu"))
    timer._stamp = clock  # type: ignore[method-assign]
    timer.attach(net.parameters())
    return timer


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_step_ends_at_the_last_passs_backward_end() -> None:
    net = torch.nn.Linear(3, 1)
    timer = ComputeTimer(torch.device("cpu"))
    clock = itertools.count()
    timer._stamp = lambda: next(clock)  # type: ignore[method-assign]
    timer.attach(net.parameters())
    timer.start()  # stamp 0
    for _ in range(3):  # three passes: each stamps its end, and again after DDP would wait
        net(torch.randn(4, 3)).sum().backward()
    timer.stop()
    # ends at 1, 3, 5; the waits after the first two (1-2, 3-4) are followed by a backward
    assert timer.resolve([timer.take_step()]) == [5.0 - 2.0]
    timer.detach()


def test_a_collective_inside_the_step_is_a_wait_not_compute(group: None) -> None:
    net, clock = torch.nn.Linear(3, 1), _Clock()
    timer = _timer(clock, net)

    class Waits(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            clock.t += 2.0  # the forward computes 2 s
            timer.collective_entered()  # as the wrapper would tell it...
            clock.t += 5.0  # ...then this rank waits 5 s on a slower peer
            timer.collective_left()
            dist.all_reduce(torch.ones(1))  # a real one, through the wrapper: no time passes
            return x

    timer.start()
    loss = net(Waits()(torch.randn(4, 3))).sum()
    clock.t += 1.0  # the backward computes 1 s
    loss.backward()
    clock.t += 9.0  # after the backward's end: DDP's finalisation, the optimizer
    timer.stop()
    assert timer.resolve([timer.take_step()]) == [3.0]
    timer.detach()


def test_a_parameter_without_a_gradient_does_not_move_the_end() -> None:
    """An unused head: the end is the backward's, not the batch's end after DDP's wait."""
    clock = _Clock()
    net = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 1), "unused": torch.nn.Linear(3, 1)})
    timer = _timer(clock, net)
    timer.start()
    loss = net["used"](torch.randn(4, 3)).sum()
    clock.t += 2.0
    loss.backward()
    clock.t += 7.0  # the peers' wait at the all-reduce, the optimizer step
    timer.stop()
    assert timer.resolve([timer.take_step()]) == [2.0]
    timer.detach()


def test_the_wait_between_two_backward_passes_is_left_out() -> None:
    """Manual optimization with two backward passes: DDP's wait after the first is a wait."""
    clock = _Clock()
    net = torch.nn.Linear(3, 1)
    timer = _timer(clock, net)

    def ddp_finalize_waits() -> None:
        clock.t += 4.0  # DDP waits for the buckets on the slower peer

    def queue_ddp(_: torch.Tensor) -> None:
        Variable._execution_engine.queue_callback(ddp_finalize_waits)

    handle = net.bias.register_post_accumulate_grad_hook(queue_ddp)  # after the timer's
    timer.start()
    for _ in range(2):
        loss = net(torch.randn(4, 3)).sum()
        clock.t += 1.0
        loss.backward()
    timer.stop()
    handle.remove()
    # two passes of 1 s, the wait after the first left out (the last one is after the end)
    assert timer.resolve([timer.take_step()]) == [2.0]
    timer.detach()


def test_activation_checkpointing_recomputes_inside_the_span() -> None:
    clock = _Clock()
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))

    def block(x: torch.Tensor) -> torch.Tensor:
        clock.t += 1.0  # forward, and again when the backward recomputes it
        return net[0](x)

    timer = _timer(clock, net)
    timer.start()
    x = torch.randn(4, 3)
    loss = net[1](torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)).sum()
    loss.backward()
    clock.t += 5.0
    timer.stop()
    assert timer.resolve([timer.take_step()]) == [2.0]
    timer.detach()


def test_an_asynchronous_collective_in_the_step_warns_once(group: None) -> None:
    net = torch.nn.Linear(3, 1)
    timer = ComputeTimer(torch.device("cpu"))
    timer.attach(net.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            timer.start()
            dist.all_reduce(torch.ones(1), async_op=True).wait()
            timer.stop()
    timer.detach()
    said = [str(w.message) for w in caught if "lightning-rex" in str(w.message)]
    assert len(said) == 1, said
    assert re.search(r"all_reduce ran inside a training step.*async_op", said[0])
