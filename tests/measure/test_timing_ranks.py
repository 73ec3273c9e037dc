"""On 2 real ranks: a rank made slow in its forward measures slow, whatever the step holds.

Rank 1 is made 3x slower by the model's own code, inside its forward (it sleeps there, before
every collective of the step), not by the emulator: a fast rank that timed its wait at an
in-step collective would measure as slow as rank 1 (the ratio was 1.0 for ``sync_dist``,
``unused_head`` and ``all_gather`` before the timer left collectives and DDP's wait out).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from typing import Any

import pytest
from tests.helpers.dist import run_distributed

from lightning_rex.tools.bench_cases import CASES

pytestmark = pytest.mark.distributed


def _medians(rank: int, cases: tuple[str, ...]) -> dict[str, list[float]]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import lightning as L
    from lightning_rex import RexCallback, RexStrategy
    from lightning_rex.tools.bench_cases import CaseModel, needs_unused_parameters

    out: dict[str, list[float]] = {}
    for case in cases:
        tmp = tempfile.mkdtemp(prefix="rex-test-")
        n = 64 * 20
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(n, 4, 32, generator=g), torch.randint(0, 10, (n,)))
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=RexStrategy(
                adaptive=False, find_unused_parameters=needs_unused_parameters(case)
            ),
            max_steps=20,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[RexCallback(window=10, log_dir=tmp, verbose=False)],
            default_root_dir=tmp,
        )
        # 1 ms a sample on rank 1, a third of it on rank 0: far more than the model computes
        model = CaseModel(case, forward_delay_s=[0.001 / 3, 0.001], width=32, depth=1)
        trainer.fit(model, DataLoader(ds, batch_size=32))
        if rank == 0:
            with open(os.path.join(tmp, "rex_decisions.jsonl")) as f:
                records = [json.loads(line) for line in f]
            out[case] = [statistics.median(r["median_ms"][k] for r in records) for k in (0, 1)]
    return out


def test_the_slow_rank_measures_slow_whatever_the_step_holds() -> None:
    results: Any = run_distributed(_medians, CASES)[0]
    ratios = {case: ms[1] / ms[0] for case, ms in results.items()}
    assert set(ratios) == set(CASES)
    assert all(r >= 2.0 for r in ratios.values()), results
