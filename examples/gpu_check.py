"""One prepared check of the CUDA paths, for a machine with a GPU (not part of the tests).

    PYTHONPATH=src python examples/gpu_check.py [--json FILE]

Each check runs in a fresh Python process (so CUDA is never initialised before a fork, and
each process group is its own), and prints one line with PASS/FAIL:

1. ``events``: the ComputeTimer's CUDA events agree with a synchronised host clock around the
   same step (within 10% + 0.2 ms), and an unsynchronised host clock under-measures the
   asynchronous kernels.
2. ``memory``: memory per sample is measured; the cap respects the headroom, the growth
   factor and a user cap; NVML telemetry reads (or is absent without error).
3. ``gloo2``: two ranks on one GPU over gloo, plain DDP with REX's loss scaling and the uneven
   sampler, plan [48, 16]: float64 parameters within 1e-10 of a single-process reference.
4. ``lightning2``: two Lightning ranks on one GPU over gloo (launched as two nodes), with
   ``strategy="rex"``, the default adaptive callback and rank 1 emulated 3x slower: the CUDA
   events see the slowdown, a better plan is applied, both ranks agree on every step's plan,
   and the decision log carries NVML telemetry.
5. ``nccl1``: NCCL at world size 1: RexStrategy + RexCallback train on the GPU over NCCL in
   float64, within 1e-10 of the single-process reference, with windows logged.
6. ``modelcode2``: two Lightning ranks on one GPU over gloo, monitor-only, with a real
   ``torch.nn.SyncBatchNorm`` (``sync_batchnorm=True``: it all-gathers in every forward and
   all-reduces in every backward) and ``self.log(..., sync_dist=True)`` in ``training_step``;
   rank 1 is made slow inside its forward by the model's own code (it runs each hidden
   layer's kernel 9 times), no emulator. The fast rank's measured compute stays below 0.6x
   the slow rank's (the CUDA events leave the waits at the collectives out).

Exit code 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # keep CUDA out of the parent

CHECKS = ("events", "memory", "gloo2", "lightning2", "nccl1", "modelcode2")
N_SAMPLES = 64 * 3 + 20
# a dry run of the two-rank Lightning check on a CPU-only machine: REX_GPU_CHECK_ACCEL=cpu
ACCEL = os.environ.get("REX_GPU_CHECK_ACCEL", "gpu")


def check_events() -> tuple[bool, str]:
    import torch

    from lightning_rex.measure.timing import ComputeTimer

    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    net = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev)
    timer = ComputeTimer(dev)
    timer.attach(net.parameters())
    x = torch.randn(2048, 4096, device=dev)
    for _ in range(3):
        net(x).sum().backward()
    torch.cuda.synchronize()
    rows = []
    for _ in range(5):
        t0 = time.perf_counter()
        timer.start()
        net(x).sum().backward()
        timer.stop()
        host_async = time.perf_counter() - t0
        torch.cuda.synchronize()
        host_sync = time.perf_counter() - t0
        (event_s,) = timer.resolve([timer.take_step()])
        rows.append((event_s, host_sync, host_async))
    agree = all(abs(e - h) <= 0.1 * h + 2e-4 for e, h, _ in rows)
    under = sorted(a for _, _, a in rows)[2] < 0.8 * sorted(e for e, _, _ in rows)[2]
    detail = "; ".join(
        f"event {e * 1e3:.2f} ms, host sync {h * 1e3:.2f}, host async {a * 1e3:.2f}"
        for e, h, a in rows[:3]
    )
    return agree, f"{detail}; async host clock under-measures: {under}"


def check_memory() -> tuple[bool, str]:
    import torch

    from lightning_rex.measure.telemetry import GpuTelemetry, MemoryBound

    dev = torch.device("cuda", 0)
    net = torch.nn.Sequential(
        torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 10)
    ).to(dev)
    mem = MemoryBound(dev, max_micro_batch_size=None, max_growth=2.0)
    for b in (64, 128):
        mem.step_start()
        net(torch.randn(b, 2048, device=dev)).sum().backward()
        mem.step_end(b)
    per = mem.per_sample_bytes or 0.0
    cap = mem.cap(128)
    free, _ = torch.cuda.mem_get_info(dev)
    ok = per > 0 and cap == 256  # the growth bound binds long before the headroom
    huge = MemoryBound(dev, max_growth=1e9)
    huge.per_sample_bytes, huge.largest_run = per, 128
    headroom_cap = huge.cap(128) or 0
    ok = ok and 0 < headroom_cap * per <= free + torch.cuda.memory_reserved(dev)
    capped = MemoryBound(dev, max_micro_batch_size=100)
    capped.largest_run = 128
    ok = ok and capped.cap(64) == 100
    sample = GpuTelemetry(dev).sample()
    return ok, (
        f"{per / 1024:.1f} KiB/sample, cap {cap} (growth 2x of 128), headroom cap "
        f"{headroom_cap}, free {free / 2**30:.1f} GiB, user cap {capped.cap(64)}; "
        f"telemetry {sample}"
    )


def _gloo2_rank(rank: int) -> Any:
    import torch
    import torch.distributed as dist
    from tests.helpers.models import flat_params, make_dataset, make_net
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lightning_rex.data.sampler import UnevenBatchSampler
    from lightning_rex.data.weighting import loss_scale

    dist.init_process_group("gloo")
    dev = torch.device("cuda", 0)
    net = DDP(make_net().to(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ds = make_dataset(N_SAMPLES)
    sampler = UnevenBatchSampler(len(ds), 64, (48, 16), rank, seed=0)
    x, y, _ = ds.tensors
    for i, idx in enumerate(sampler):
        sizes = sampler.sizes_for_batch(i)
        per = ((net(x[idx].to(dev)) - y[idx].to(dev)) ** 2).squeeze(-1)
        (per.mean() * loss_scale(sizes, rank, "mean")).backward()
        opt.step()
        opt.zero_grad()
    return flat_params(net.module)


def check_gloo2() -> tuple[bool, str]:
    import torch
    from tests.helpers.dist import run_distributed
    from tests.helpers.models import make_dataset, reference_train

    assert not torch.cuda.is_initialized(), "CUDA must not be initialised before the fork"
    params = run_distributed(_gloo2_rank, timeout=300)
    ref = reference_train(make_dataset(N_SAMPLES), 64, 2, epochs=1, opt="sgd", reduction="mean")
    err = max((p - ref).abs().max().item() for p in params)
    return err < 1e-10, f"max |param - reference| {err:.2e} (plain DDP weighting misses by >1e-4)"


def _lightning2_rank(rank: int, root: str) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import lightning as L
    import lightning_rex
    from lightning_rex.tools.bench import BenchModel

    # two "nodes" of one GPU each, both on cuda:0: the stock launcher environment
    os.environ.update(LOCAL_RANK="0", NODE_RANK=str(rank), LOCAL_WORLD_SIZE="1")
    steps = 240
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(
        torch.randn(64 * steps, 16, 32, generator=g),
        torch.randint(0, 10, (64 * steps,), generator=g),
    )
    sizes: list[tuple[int, int]] = []

    class Sizes(L.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
            sizes.append((trainer.global_step, len(batch[0])))

    trainer = L.Trainer(
        accelerator=ACCEL,
        devices=1,
        num_nodes=2,
        strategy=lightning_rex.RexStrategy(process_group_backend="gloo"),
        max_steps=steps,
        callbacks=[lightning_rex.HeterogeneityEmulator([1.0, 3.0]), Sizes()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(
        BenchModel(width=int(os.environ.get("REX_GPU_CHECK_WIDTH", 4096)), depth=8),
        DataLoader(ds, batch_size=32, shuffle=True),
    )
    callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]
    cb = next(c for c in callbacks if isinstance(c, lightning_rex.RexCallback))
    return {
        "sizes": sizes,
        "history": cb.plan_history,
        "records": cb.records,
        "world": trainer.world_size,
    }


def check_lightning2() -> tuple[bool, str]:
    import torch
    from tests.helpers.dist import run_distributed

    assert not torch.cuda.is_initialized(), "CUDA must not be initialised before the fork"
    root = tempfile.mkdtemp()
    out = run_distributed(_lightning2_rank, root, timeout=400)
    a, b = out
    steps_a = {s: n for s, n in a["sizes"]}
    steps_b = {s: n for s, n in b["sizes"]}
    agree = all(steps_a[s] + steps_b[s] == 64 for s in steps_a) and steps_a.keys() == steps_b.keys()
    recs = a["records"]
    first = recs[0]["median_ms"] if recs else [0.0, 0.0]
    final = a["history"][-1][1] if a["history"] else None
    tel = (recs[0].get("telemetry") or [None])[0] if recs else None
    ok = (
        a["world"] == 2
        and agree
        and final is not None
        and final[0] > final[1]
        and first[1] > 2.0 * first[0]
        and bool(tel and tel.get("name"))
    )
    return ok, (
        f"world {a['world']}, steps {len(steps_a)}, sizes sum to 64 and agree: {agree}; "
        f"first window median ms {first}; plan history {a['history']}; "
        f"decisions {[r['decision'] for r in recs]}; rank 0 telemetry {tel}"
    )


def _modelcode2_rank(rank: int, root: str) -> Any:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import lightning as L
    import lightning_rex
    from lightning_rex.tools.bench_cases import AllReduceBatchNorm

    os.environ.update(LOCAL_RANK="0", NODE_RANK=str(rank), LOCAL_WORLD_SIZE="1")
    width = int(os.environ.get("REX_GPU_CHECK_WIDTH", 4096))

    class SlowForward(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(32, width)
            # SyncBatchNorm runs on accelerators only: the CPU dry run takes the stand-in
            self.norm = nn.BatchNorm1d(width) if ACCEL != "cpu" else AllReduceBatchNorm(width)
            self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
            self.out = nn.Linear(width, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.inp(x))  # (batch, tokens, width)
            if isinstance(self.norm, AllReduceBatchNorm):
                h = self.norm(h)
            else:  # BatchNorm1d (SyncBatchNorm once converted) normalises dim 1
                h = self.norm(h.transpose(1, 2)).transpose(1, 2)
            for layer in self.hidden:
                if self.global_rank == 1:  # rank 1's forward kernels are slower: 9 times the work
                    for _ in range(8):
                        layer(h)
                h = torch.tanh(layer(h))
            return self.out(h.mean(dim=1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss, sync_dist=True, on_step=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    steps = 90
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(  # 64 tokens a sample: each layer's kernels are sized by the batch
        torch.randn(64 * steps, 64, 32, generator=g),
        torch.randint(0, 10, (64 * steps,), generator=g),
    )
    trainer = L.Trainer(
        accelerator=ACCEL,
        devices=1,
        num_nodes=2,
        strategy=lightning_rex.RexStrategy(process_group_backend="gloo", adaptive=False),
        sync_batchnorm=ACCEL != "cpu",
        max_steps=steps,
        callbacks=[lightning_rex.RexCallback(window=20, verbose=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(SlowForward(), DataLoader(ds, batch_size=32, shuffle=True))
    callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]
    cb = next(c for c in callbacks if isinstance(c, lightning_rex.RexCallback))
    synced = any(isinstance(m, torch.nn.SyncBatchNorm) for m in trainer.lightning_module.modules())
    return {"records": cb.records, "synced": synced}


def check_modelcode2() -> tuple[bool, str]:
    import statistics

    import torch
    from tests.helpers.dist import run_distributed

    assert not torch.cuda.is_initialized(), "CUDA must not be initialised before the fork"
    out = run_distributed(_modelcode2_rank, tempfile.mkdtemp(), timeout=400)
    recs = out[0]["records"]
    ratios = [r["median_ms"][0] / r["median_ms"][1] for r in recs]
    fast_over_slow = statistics.median(ratios) if ratios else float("nan")
    ok = bool(recs) and fast_over_slow < 0.6 and (out[0]["synced"] or ACCEL == "cpu")
    return ok, (
        f"SyncBatchNorm: {out[0]['synced']}; per window median ms "
        f"{[[round(m, 2) for m in r['median_ms']] for r in recs]}; fast / slow "
        f"{fast_over_slow:.3f} (must be < 0.6)"
    )


def check_nccl1() -> tuple[bool, str]:
    import torch
    from tests.helpers.models import RegModel, flat_params, make_dataset, reference_train

    import lightning as L
    import lightning_rex

    cb = lightning_rex.RexCallback(window=5, warmup=0)  # 14 steps: measure them all
    t = L.Trainer(
        accelerator="gpu",
        devices=1,
        strategy=lightning_rex.RexStrategy(process_group_backend="nccl"),
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
        default_root_dir=tempfile.mkdtemp(),
    )
    model = RegModel()
    ds = make_dataset(N_SAMPLES)
    t.fit(model, torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True))
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "-"
    ref = reference_train(ds, 32, 1, epochs=2, opt="sgd", reduction="mean")
    err = (flat_params(model.net) - ref).abs().max().item()
    tel = (cb.records[0].get("telemetry") or [None])[0] if cb.records else None
    ok = backend == "nccl" and err < 1e-10 and len(cb.records) >= 2
    return ok, (
        f"backend {backend}, steps {t.global_step}, max |param - reference| {err:.2e}, "
        f"windows {len(cb.records)}, median ms {[r['median_ms'] for r in cb.records]}, "
        f"telemetry {tel}"
    )


def run_one(name: str, checks: dict[str, Any] | None = None) -> int:
    """Run one check in this process and print its JSON line.

    Args:
        name: The check.
        checks: Where ``check_<name>`` is found (this module's globals by default).

    Returns:
        The exit code: 0 when it passed.
    """
    try:
        ok, detail = (checks or globals())[f"check_{name}"]()
    except Exception as exc:
        import traceback

        ok, detail = False, f"{exc!r}\n{traceback.format_exc()[-2000:]}"
    print(json.dumps({"check": name, "ok": bool(ok), "detail": detail}), flush=True)
    return 0 if ok else 1


def run_checks(
    script: str,
    names: tuple[str, ...],
    description: str,
    timeout: int,
    checks: dict[str, Any],
    dry_run: bool = False,
) -> int:
    """The command line of a prepared check script: each check in a fresh process.

    Args:
        script: The script's path (it runs itself with ``--check NAME``).
        names: Its checks, in order.
        description: Its ``--help`` text.
        timeout: Seconds one check may take.
        checks: The script's globals, holding ``check_<name>``.
        dry_run: Whether ``REX_GPU_CHECK_ACCEL=cpu`` runs every check on CPU (else it is for
            one ``--check`` only).

    Returns:
        The exit code: 0 when every check passed (or there is no CUDA device).
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", choices=names, help="run one check in this process")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.check:
        return run_one(args.check, checks)
    import torch

    if not torch.cuda.is_available() and not (dry_run and ACCEL == "cpu"):
        print("no CUDA device: nothing to check here (the CPU paths are covered by the test suite)")
        return 0
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    results = []
    for name in names:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, os.path.abspath(script), "--check", name],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith('{"check"')]
        res = (
            json.loads(lines[-1])
            if lines
            else {"check": name, "ok": False, "detail": (proc.stdout + proc.stderr)[-3000:]}
        )
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(
            f"{'PASS' if res['ok'] else 'FAIL'} {name} ({res['seconds']} s): {res['detail']}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r["check"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> int:
    return run_checks(__file__, CHECKS, __doc__ or "", 480, globals())


if __name__ == "__main__":
    sys.exit(main())
