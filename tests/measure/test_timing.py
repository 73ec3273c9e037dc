"""The compute timer: a step's end is its last pass's last gradient."""

from __future__ import annotations

import itertools

import torch

from lightning_rex.measure.timing import ComputeTimer


def test_the_step_ends_at_the_last_passs_last_gradient() -> None:
    net = torch.nn.Linear(3, 1)
    timer = ComputeTimer(torch.device("cpu"))
    clock = itertools.count()
    timer._stamp = lambda: next(clock)  # type: ignore[method-assign]
    timer.attach(net.parameters())
    timer.start()  # stamp 0
    for _ in range(3):  # three passes: weight and bias each fire once a pass
        net(torch.randn(4, 3)).sum().backward()
    timer.stop()
    ends = timer.take_step()
    # one stamp a pass, at its last gradient (1, 2, 3): the step ends at the third
    assert timer.resolve([ends]) == [3.0]
