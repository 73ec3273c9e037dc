"""A Fabric custom loop with :class:`~lightning_rex.RexLoop`: exact, exactly once, adaptive.

Every loop runs on two forked CPU ranks (gloo), under ``strategy="rex"`` (DDP) and
``"rex_fsdp"`` (FSDP2), with the registry names Fabric resolves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed
from tests.helpers.models import (
    flat_params,
    make_dataset,
    make_net,
    make_optimizer,
    reference_steps,
)
from tests.helpers.timing import affine_step_time
from torch import nn
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import RexLoop

pytestmark = pytest.mark.distributed


class _Wrapped(nn.Module):
    """The reference net inside a container, as a Fabric model usually is."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _loop(rank: int, strategy: str, caps: Any, steps: int) -> dict[str, Any]:
    """``steps`` steps of a custom loop at the plan [24, 8]; the weights this rank ends with."""
    torch.set_num_threads(1)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    model = fabric.setup(_Wrapped())  # sharded first under FSDP2: the optimizer comes after
    optimizer = fabric.setup_optimizers(make_optimizer(model.parameters(), "sgd"))
    rex = RexLoop(fabric, model, micro_batch_sizes=[24, 8], max_pass_sizes=caps, adaptive=False)
    loader = rex.setup_dataloader(DataLoader(make_dataset(640), batch_size=16, shuffle=True))
    passes: list[int] = []
    for x, y, _ in loader:
        for px, py in rex.passes((x, y)):
            passes.append(len(px))
            fabric.backward(rex.scale(((model(px) - py) ** 2).mean()))
        optimizer.step()
        optimizer.zero_grad()
        rex.step()
        if rex.steps >= steps:
            break
    rex.finish()
    return {"params": flat_params(model), "passes": passes}


@pytest.mark.parametrize("strategy", ["rex", "rex_fsdp"])
def test_a_fabric_loop_is_exact_in_float64_with_accumulation_passes(strategy: str) -> None:
    ref = reference_steps(20, 640)
    for caps in (None, [10, None]):
        runs = run_distributed(_loop, strategy, caps, 20)
        for rank, run in enumerate(runs):
            diff = (run["params"] - ref).abs().max().item()
            assert diff <= 1e-10, (strategy, caps, rank, diff)
        if caps is not None:
            assert runs[0]["passes"][:3] == [8, 8, 8]


def _example(rank: int, steps: int) -> dict[str, Any]:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "fabric_gpt.py"
    spec = importlib.util.spec_from_file_location("fabric_gpt", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Injected(mod.RexLoop):  # type: ignore[misc,name-defined]
        """The example's loop, its controller fed injected times (rank 1 about 3x slower)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.options = replace(self.options, step_time_fn=affine_step_time)

    mod.RexLoop = Injected
    torch.set_num_threads(1)
    out = mod.train("rex", True, steps, [1.0, 3.0])
    return {k: out[k] for k in ("seen", "plan", "changes", "records")}


def test_the_fabric_example_adapts_to_a_slow_rank_and_uses_every_sample_once() -> None:
    # the example runs as written (its emulator slows rank 1 for real), but its controller
    # sees injected times (also ~3x), so what it decides does not depend on the machine's load
    steps = 90  # the example's dataset is exactly 90 global batches: one epoch
    runs = run_distributed(_example, steps)
    used = runs[0]["seen"] + runs[1]["seen"]
    assert len(used) == len(set(used)) == 64 * steps  # every sample once, none twice
    plan = runs[0]["plan"]
    assert runs[0]["changes"] >= 1
    kinds = [r["decision"] for r in runs[0]["records"]]
    assert plan[0] > plan[1], (plan, kinds)  # rank 1, 3x slower, trains less


def _until(rank: int, state: Any, stop: int | None, n: int) -> dict[str, Any]:
    """Train epoch 0 from ``state`` (None: the start) to step ``stop`` or the epoch's end."""
    world = int(__import__("os").environ["WORLD_SIZE"])
    fabric = L.Fabric(accelerator="cpu", devices=world, strategy="rex")
    fabric.launch()
    model = fabric.setup(_Wrapped())
    optimizer = fabric.setup_optimizers(make_optimizer(model.parameters(), "sgd"))
    plan = [24, 8] if world == 2 else None
    rex = RexLoop(fabric, model, micro_batch_sizes=plan, window=5, verbose=False)
    loader = rex.setup_dataloader(
        DataLoader(make_dataset(n), batch_size=16, shuffle=True), state=state
    )
    seen: list[int] = []
    for x, y, idx in loader:
        for px, py in rex.passes((x, y)):
            fabric.backward(rex.scale(((model(px) - py) ** 2).mean()))
        optimizer.step()
        optimizer.zero_grad()
        rex.step()
        seen += idx.tolist()
        if stop is not None and rex.steps >= stop:
            break
    saved = rex.state_dict() if stop is not None else None
    rex.finish()
    return {"seen": seen, "state": saved, "steps": rex.steps}


@pytest.mark.parametrize("after", [2, 1])
def test_a_fabric_loop_resumed_from_its_state_uses_every_sample_once(after: int) -> None:
    n = 32 * 20 + 21  # 20 whole global batches of 32 and a final partial one
    first = run_distributed(_until, None, 7, n)
    out = run_distributed(_until, first[0]["state"], None, n, world_size=after)
    used = [i for r in first for i in r["seen"]] + [i for r in out for i in r["seen"]]
    assert len(used) == len(set(used)), "a sample was trained twice"
    missing = set(range(n)) - set(used)
    assert len(missing) < after, sorted(missing)  # at most a final batch too small to split
    assert {r["steps"] for r in out} == {out[0]["steps"]} and out[0]["steps"] > 7
