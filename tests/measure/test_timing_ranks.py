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
import warnings
from typing import Any

import pytest
import torch
from tests.helpers.dist import run_distributed

from lightning_rex.tools.bench_cases import CASES, CaseModel

pytestmark = pytest.mark.distributed

_BOUND_EARLY = torch.distributed.all_reduce  # bound before any timer wraps it: unseen


class _HiddenCollective(CaseModel):
    """All-reduces its loss through a function bound at import, which no wrapper sees."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        _BOUND_EARLY(loss.detach().clone())
        return loss


def _medians(rank: int, cases: tuple[str, ...]) -> dict[str, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    import lightning as L
    from lightning_rex import RexCallback, RexStrategy
    from lightning_rex.tools.bench_cases import needs_unused_parameters

    out: dict[str, Any] = {}
    for case in (*cases, "hidden"):
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
        delays = [0.001 / 3, 0.001]
        model = (
            _HiddenCollective("plain", delays, width=32, depth=1)
            if case == "hidden"
            else CaseModel(case, forward_delay_s=delays, width=32, depth=1)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model, DataLoader(ds, batch_size=32))
        said = [str(w.message) for w in caught if "compute timer cannot see" in str(w.message)]
        if rank == 0:
            with open(os.path.join(tmp, "rex_decisions.jsonl")) as f:
                records = [json.loads(line) for line in f]
            ms = [statistics.median(r["median_ms"][k] for r in records) for k in (0, 1)]
            out[case] = {"ms": ms, "said": said}
    return out


def test_the_slow_rank_measures_slow_whatever_the_step_holds() -> None:
    """Each case: rank 1 measures at least 2x rank 0, and nothing is said; a collective no
    wrapper can see is said once, and rank 0 then measures about as slow as rank 1."""
    results: Any = run_distributed(_medians, CASES)[0]
    ratios = {case: r["ms"][1] / r["ms"][0] for case, r in results.items()}
    assert set(ratios) == {*CASES, "hidden"}
    assert all(ratios[case] >= 2.0 for case in CASES), results
    assert all(results[case]["said"] == [] for case in CASES), results
    hidden = results["hidden"]["said"]
    assert len(hidden) == 1 and "1 collective(s) on the default process group" in hidden[0]
    assert ratios["hidden"] < 1.5, results  # the wait is in the time: why it must be said
