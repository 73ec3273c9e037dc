"""``rex_fsdp``: FSDP2 with uneven micro-batches, exact in float64, exactly once across resumes.

Every fit runs on forked CPU ranks with gloo: FSDP2's ``fully_shard`` runs there, so the
exactness the issue asks for (plan ``[24, 8]``, 20 steps, also with accumulation passes on
one rank, max abs weight difference <= 1e-10 against one process on the whole batch) is
checked here, not only on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tests.helpers.dist import run_distributed
from tests.helpers.models import (
    RegModel,
    flat_params,
    make_dataset,
    permutation,
    reference_steps,
)
from tests.helpers.timing import with_step_times
from tests.helpers.trainer import quiet_trainer
from torch import nn
from torch.utils.data import DataLoader

from lightning_rex.lightning.fsdp import RexFSDPStrategy, _reshards_after_forward

pytestmark = pytest.mark.distributed


class _UserSharded(RegModel):
    """Sharded by its own configure_model, FSDP2's defaults (the root keeps its parameters)."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])


def _exact_fits(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs = (
        ("plain", None, RegModel, 1),
        ("rank0-passes", [10, None], RegModel, 1),
        ("rank1-passes", [None, 3], RegModel, 1),
        # logging with sync_dist in every step, two batches a step, the user's own sharding
        ("logged-accumulated", [10, None], lambda: RegModel(log_mean=True), 2),
        ("user-sharded", [10, None], _UserSharded, 1),
    )
    for name, caps, make, accumulate in runs:
        model = make()
        strategy = RexFSDPStrategy(micro_batch_sizes=[24, 8], adaptive=False, max_pass_sizes=caps)
        t = quiet_trainer(strategy=strategy, max_steps=20, accumulate_grad_batches=accumulate)
        t.fit(model, DataLoader(make_dataset(640 * accumulate), batch_size=16, shuffle=True))
        out[name] = {"params": flat_params(model), "sizes": [len(s[2]) for s in model.seen]}
    return out


def test_rex_fsdp_is_exact_in_float64_with_and_without_accumulation_passes() -> None:
    refs = {1: reference_steps(20), 2: reference_steps(20, 1280, accumulate=2)}
    runs = run_distributed(_exact_fits)
    for rank, run in enumerate(runs):
        for name, got in run.items():
            ref = refs[2 if name == "logged-accumulated" else 1]
            diff = (got["params"] - ref).abs().max().item()
            assert diff <= 1e-10, (rank, name, diff)
    # the passes ran: 24 samples under a cap of 10 are 3 passes of 8; 8 under 3 are 3, 3, 2
    assert runs[0]["rank0-passes"]["sizes"][:3] == [8, 8, 8]
    assert runs[1]["rank1-passes"]["sizes"][:3] == [3, 3, 2]
    assert runs[0]["plain"]["sizes"][:3] == [24, 24, 24]


class _Blocks(RegModel):
    """A RegModel whose net is a list of blocks: FSDP units of their own, checkpointed."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.float32)
        self.blocks = nn.ModuleList([nn.Linear(1, 1) for _ in range(2)])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, idx = batch
        h = self.net(x)
        for block in self.blocks:
            h = h + block(h)
        self.seen.append((self.current_epoch, self.trainer.global_step, idx.tolist()))
        return ((h - y) ** 2).mean()


def _bf16_fit(rank: int) -> dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule

    model = _Blocks()
    strategy = RexFSDPStrategy(
        micro_batch_sizes=[24, 8],
        adaptive=False,
        max_pass_sizes=[10, None],
        activation_checkpointing=nn.Linear,
        reshard_after_forward=True,
    )
    t = quiet_trainer(strategy=strategy, max_steps=6, precision="bf16-mixed")
    t.fit(model, DataLoader(make_dataset(640, dtype=torch.float32), batch_size=16))
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    return {
        "finite": bool(torch.isfinite(flat_params(model)).all()),
        "units": len(units),
        "checkpointed": sum(isinstance(m, CheckpointWrapper) for m in model.modules()),
        "reshards": [_reshards_after_forward(u) for u in units],
        "loss": float(t.callback_metrics.get("train_loss", torch.tensor(0.0))),
    }


def test_bf16_autocast_activation_checkpointing_and_passes_train() -> None:
    for run in run_distributed(_bf16_fit):
        assert run["finite"]
        assert run["units"] == 3  # two blocks, and the net with what is left
        assert run["checkpointed"] >= 2
        # the getter rex reads back what fully_shard was given (and passes restored it)
        assert run["reshards"] == [True, True, True]


# ------------------------------------------------------------------ exactly once
STEPS, N, BS = 130, 64 * 130 + 37, 32


def _memory_wall(rank: int, step: int, b: int) -> float:
    # rank 1 is ~3x slower, but rank 0 falls off a cliff above 40 samples: the first
    # proportional plan gives it more and is rolled back
    t = 0.002 + b / (2000.0 if rank == 0 else 700.0)
    return t * (4.0 if rank == 0 and b > 40 else 1.0) * (1.0 + 0.01 * ((7 * step + rank) % 5))


def _adaptive_first(rank: int, tmp: str, sharded: bool, stop: int) -> dict[str, Any]:
    model = RegModel()
    ck = ModelCheckpoint(dirpath=tmp, every_n_train_steps=stop, save_top_k=-1)
    cb = with_step_times(_memory_wall, window=10, background=False)
    t = quiet_trainer(
        strategy=RexFSDPStrategy(save_distributed_checkpoint=sharded),
        max_steps=stop,
        callbacks=[cb, ck],
        enable_checkpointing=True,
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=BS, shuffle=True))
    return {"seen": model.seen, "records": cb.records, "history": cb.plan_history}


def _resumed(rank: int, ckpt: str, sharded: bool) -> dict[str, Any]:
    model = RegModel()
    t = quiet_trainer(
        devices=int(__import__("os").environ["WORLD_SIZE"]),
        strategy=RexFSDPStrategy(save_distributed_checkpoint=sharded),
        max_epochs=1,
    )
    t.fit(model, DataLoader(make_dataset(N), batch_size=BS, shuffle=True), ckpt_path=ckpt)
    return {"seen": model.seen, "batches": t.num_training_batches}


@pytest.mark.parametrize(("sharded", "after"), [(True, 3), (False, 1)])
def test_plan_change_rollback_and_resume_on_another_world_size_use_every_sample_once(
    sharded: bool, after: int, tmp_path: Path
) -> None:
    stop = 120
    first = run_distributed(_adaptive_first, str(tmp_path), sharded, stop)
    kinds = [r["decision"] for r in first[0]["records"]]
    assert "propose" in kinds and "rollback" in kinds, kinds
    assert len({tuple(p) for _, p in first[0]["history"]}) >= 2  # the plan changed
    ckpt = tmp_path / f"epoch=0-step={stop}.ckpt"
    assert ckpt.is_dir() == sharded  # a folder of shards, or one full file
    out = run_distributed(_resumed, str(ckpt), sharded, world_size=after)
    used = [i for r in first for e, _, ix in r["seen"] if e == 0 for i in ix]
    used += [i for r in out for e, _, ix in r["seen"] if e == 0 for i in ix]
    assert len(used) == len(set(used)), "a sample was trained twice"
    perm = permutation(N, 0, 0)
    missing = sorted(set(perm) - set(used))
    assert len(missing) < after and set(missing) <= set(perm[N - len(missing) :]), missing
    assert len({r["batches"] for r in out}) == 1


class _GPTModule(RegModel):
    """The Fabric example's GPT in a LightningModule (its blocks become FSDP units)."""

    def __init__(self) -> None:
        import importlib.util

        super().__init__()
        path = Path(__file__).parents[2] / "examples" / "fabric_gpt.py"
        spec = importlib.util.spec_from_file_location("fabric_gpt", path)
        assert spec is not None and spec.loader is not None
        self.example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.example)
        self.net = self.example.GPT()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, idx = batch
        self.seen.append((self.current_epoch, self.trainer.global_step, idx.tolist()))
        return nn.functional.cross_entropy(self.net(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def _measured_fit(rank: int) -> dict[str, Any]:
    from lightning_rex import HeterogeneityEmulator, RexCallback

    torch.set_num_threads(1)
    model = _GPTModule()
    cb = RexCallback(window=10, verbose=False)
    t = quiet_trainer(
        strategy=RexFSDPStrategy(), max_steps=90, callbacks=[cb, HeterogeneityEmulator([1, 6])]
    )
    t.fit(model, DataLoader(model.example.Tokens(64 * 90), batch_size=32, shuffle=True))
    proposed = [r["new_plan"] for r in cb.records if r["decision"] == "propose"]
    return {"proposed": proposed, "first": cb.records[0]["median_ms"] if cb.records else None}


def test_under_fsdp_each_rank_times_its_own_compute_and_rex_unloads_the_slow_one() -> None:
    # rank 1 emulated 6x slower (a signal that stands out beside other load). FSDP
    # synchronises at every layer: a rank's time to its last gradient holds its waits on
    # the slowest rank, the same on both; the timer sums the leaf computations instead
    run = run_distributed(_measured_fit)[0]
    first = run["first"]
    assert first is not None and first[1] > 1.5 * first[0], first  # rank 1 seen as slower
    # the controller acts on it (whether the change is kept is validation's call, on real
    # and so noisy times: not asserted)
    assert any(p[0] > p[1] for p in run["proposed"]), run


def _ddp_passes(rank: int) -> dict[str, Any]:
    from lightning_rex import RexStrategy

    out = {}
    for accumulate in (1, 2):
        model = RegModel(log_mean=True)
        strategy = RexStrategy(micro_batch_sizes=[24, 8], adaptive=False, max_pass_sizes=[10, 3])
        t = quiet_trainer(strategy=strategy, max_steps=20, accumulate_grad_batches=accumulate)
        t.fit(model, DataLoader(make_dataset(640 * accumulate), batch_size=16, shuffle=True))
        out[accumulate] = flat_params(model)
    return out


def test_rex_ddp_accumulation_passes_are_exact_with_lightnings_accumulation_and_logging() -> None:
    refs = {1: reference_steps(20), 2: reference_steps(20, 1280, accumulate=2)}
    for rank, run in enumerate(run_distributed(_ddp_passes)):
        for accumulate, params in run.items():
            diff = (params - refs[accumulate]).abs().max().item()
            assert diff <= 1e-10, (rank, accumulate, diff)
