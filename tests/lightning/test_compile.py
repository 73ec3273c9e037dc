"""``torch.compile`` across plan changes: the batch dimension is marked dynamic, so no recompiles.

A plan change gives a rank a new micro-batch size. A model compiled with ``dynamic=False``
specialises on every size: five plan changes are five more compiles per rank, and at the
eighth size dynamo gives up and runs eager. With ``dynamic_batch=True`` (the default) the
strategy marks the batch dimension dynamic and one graph serves every size. Counted with
dynamo's own counters (``backend="eager"``: what is counted is tracing, the same for every
backend).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import RexStrategy

pytestmark = pytest.mark.distributed

PLANS = {4: [40, 24], 8: [24, 40], 12: [50, 14], 16: [10, 54], 20: [33, 31]}


class _Compiled(RegModel):
    def __init__(self, dynamic: bool | None) -> None:
        super().__init__()
        self.net = torch.compile(self.net, backend="eager", dynamic=dynamic)


class _Plans(L.Callback):
    """Five plan changes, every rank together."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        plan = PLANS.get(trainer.global_step)
        if plan is not None:
            trainer.strategy.set_plan(plan)


def _fits(rank: int) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {}
    for dynamic in (False, None):
        for marked in (False, True):
            torch._dynamo.reset()
            counters.clear()
            model = _Compiled(dynamic)
            t = quiet_trainer(
                strategy=RexStrategy(adaptive=False, dynamic_batch=marked),
                max_steps=26,
                callbacks=[_Plans()],
            )
            t.fit(model, DataLoader(make_dataset(64 * 30), batch_size=32))
            sizes = sorted({len(ix) for _, _, ix in model.seen})
            out[f"{dynamic}-{marked}"] = {
                "graphs": int(counters["stats"]["unique_graphs"]),
                "sizes": sizes,
                "changes": t.strategy.plan_schedule.changes,
            }
    return out


def test_five_plan_changes_compile_one_graph_with_the_batch_marked_dynamic() -> None:
    runs = run_distributed(_fits)
    for rank, run in enumerate(runs):
        for key, got in run.items():
            assert got["changes"] == 5, (rank, key, got)
        # unmarked and dynamic=False: one graph per size this rank trained (six sizes)
        assert run["False-False"]["graphs"] == len(run["False-False"]["sizes"]) == 6, run
        # marked: one graph, whatever the sizes (dynamic=False only refuses automatic dynamic)
        assert run["False-True"]["graphs"] == 1, run
        assert run["None-True"]["graphs"] == 1, run
        # compile's default: a second graph once a size changes (automatic dynamic)
        assert run["None-False"]["graphs"] == 2, run
    print({f"rank{r}": {k: v["graphs"] for k, v in run.items()} for r, run in enumerate(runs)})
