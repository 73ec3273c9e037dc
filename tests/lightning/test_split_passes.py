"""Accumulation passes in-process: cutting a batch, and the passes a rank runs."""

from __future__ import annotations

import pytest
import torch

from lightning_rex import RexStrategy
from lightning_rex.lightning.passes import loss_of, split_batch


def test_a_batch_is_cut_along_its_samples_and_the_rest_is_shared() -> None:
    x, y, scale = torch.arange(20).reshape(10, 2), torch.arange(10), torch.tensor(3.0)
    parts = split_batch({"x": x, "y": y, "scale": scale, "name": "a"}, [4, 3, 3])
    assert [p["x"].shape[0] for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat([p["y"] for p in parts]), y)
    assert all(p["scale"] is scale and p["name"] == "a" for p in parts)
    with pytest.raises(ValueError, match="no tensor in the batch has 10 rows"):
        split_batch([torch.zeros(3)], [5, 5])


def test_loss_of_reads_what_lightning_reads() -> None:
    t = torch.tensor(1.0)
    assert loss_of(t) is t and loss_of({"loss": t}) is t and loss_of(None) is None
    with pytest.raises(ValueError, match="must return a loss tensor"):
        loss_of(3.0)


@pytest.mark.parametrize(
    ("size", "cap", "lowest", "expected"),
    [
        (24, 10, 1, [8, 8, 8]),
        (8, 3, 1, [3, 3, 2]),
        (3, 2, 2, [3]),
        (5, 2, 2, [3, 2]),
        (6, None, 1, [6]),
    ],
)
def test_no_pass_falls_below_the_minimum_micro_batch(
    size: int, cap: int | None, lowest: int, expected: list[int]
) -> None:
    strategy = RexStrategy(max_pass_sizes=cap, min_micro_batch_size=lowest)
    assert strategy.passes_for(size) == expected
