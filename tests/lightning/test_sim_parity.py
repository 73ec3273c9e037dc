"""Training and the simulator make the same decisions from the same per-rank step times.

Both run the window driver: training on 2 real gloo ranks through Lightning (the sampler is
the plan target, torch.distributed the collectives), the simulator with both ranks in one
process. Recorded step times (a deterministic function of rank, step and micro-batch) go
through both; the decision sequences, the steps plans take effect at and the schedules must
be identical.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

from lightning_rex import RexCallback, RexStrategy
from lightning_rex.core.build import build_decider
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.sim import run_loop

pytestmark = pytest.mark.distributed

STEPS, WINDOW, B = 240, 10, 64


def _noise(rank: int, step: int) -> float:
    u = (zlib.crc32(f"{rank}:{step}".encode()) % 10_000 + 0.5) / 10_000
    return math.exp(0.08 * math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * u * 7.3))


def recorded(rank: int, step: int, b: int) -> float:
    """Rank 1 is 3x slower, and from step 120 rank 0 slows down 2.5x (a change mid-run)."""
    rate = 3000.0 if rank == 0 else 1000.0
    slow = 2.5 if (rank == 0 and step >= 120) else 1.0
    return (0.003 + b / rate) * slow * _noise(rank, step)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        tuple(r["window"]),
        tuple(r["plan"]),
        r["decision"],
        r["reason"],
        None if r["new_plan"] is None else tuple(r["new_plan"]),
        r["effective_step"],
        r["dropped_samples"],
    )


def _train(rank: int, root: str) -> dict[str, Any]:
    cb = with_step_times(recorded, window=WINDOW, background=False)
    t = quiet_trainer(
        strategy=RexStrategy(), max_steps=STEPS, callbacks=[cb], default_root_dir=root
    )
    t.fit(RegModel(), DataLoader(make_dataset(B * STEPS), batch_size=B // 2, shuffle=True))
    return {"records": [_key(r) for r in cb.records], "schedule": cb.plan_history}


def test_same_step_times_same_decisions(tmp_path: Path) -> None:
    trained = run_distributed(_train, str(tmp_path))
    cb = RexCallback(window=WINDOW, background=False)
    decider = build_decider(cb.settings, (B // 2, B // 2), B, SizeBounds())

    def times(step: int, plan: np.ndarray) -> np.ndarray:
        return np.array([recorded(r, step, int(plan[r])) for r in range(2)])

    sim = run_loop(B, 2, STEPS, times, decider, cb.loop)
    assert [_key(r) for r in sim.records] == trained[0]["records"]
    assert sim.schedule == trained[0]["schedule"] == trained[1]["schedule"]
    kinds = [k[2] for k in trained[0]["records"]]
    assert kinds.count("propose") >= 2 and len(sim.schedule) >= 3  # both phases acted on
