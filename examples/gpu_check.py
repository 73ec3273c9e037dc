"""One prepared check of the CUDA paths, for a machine with a GPU (not part of the tests).

    python examples/gpu_check.py [--steps 40]

It checks, and prints one line per check with PASS/FAIL:
1. NCCL at world size 1: RexStrategy trains on the GPU over NCCL (gradient weighting, the
   NCCL gather of a window, set_plan's all-reduce on the device).
2. Two ranks on one GPU over gloo: exact weighting against a single-process reference
   (float64, within 1e-10), with an uneven plan [48, 16].
3. CUDA-event timing against host timing: the ComputeTimer's CUDA events agree with a
   synchronised host clock around the same step (within 10% + 0.2 ms), and an unsynchronised
   host clock would under-measure the asynchronous kernels.
4. The memory bound: memory per sample is measured and the cap respects the headroom, the
   growth factor and a user cap; NVML telemetry reads (or is absent without error).
Exit code 0 when every check passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import lightning as L
import torch
from torch.utils.data import DataLoader

import lightning_rex
from lightning_rex.telemetry import GpuTelemetry, MemoryBound
from lightning_rex.timing import ComputeTimer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.helpers.dist import run_distributed
from tests.helpers.models import RegModel, flat_params, make_dataset, reference_train

RESULTS: list[tuple[str, bool, str]] = []


def report(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def check_nccl_world_one(steps: int) -> None:
    cb = lightning_rex.RexCallback(window=5)
    t = L.Trainer(
        accelerator="gpu",
        devices=1,
        strategy=lightning_rex.RexStrategy(process_group_backend="nccl"),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[cb],
        default_root_dir=tempfile.mkdtemp(),
    )
    model = RegModel(dtype=torch.float32)
    t.fit(model, DataLoader(make_dataset(64 * steps, dtype=torch.float32), batch_size=32))
    ok = t.global_step == steps and len(cb.records) >= 1
    report(
        "nccl world size 1",
        ok,
        f"steps {t.global_step}, windows logged {len(cb.records)}, "
        f"backend {torch.distributed.get_backend() if torch.distributed.is_initialized() else '-'}",
    )


def _two_ranks(rank: int) -> torch.Tensor:
    """Both ranks on cuda:0, DDP over gloo, plan [48, 16], REX's loss scaling."""
    import torch.distributed as dist
    from tests.helpers.models import make_net
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lightning_rex.sampler import UnevenBatchSampler
    from lightning_rex.weighting import loss_scale

    dist.init_process_group("gloo")
    dev = torch.device("cuda", 0)
    net = DDP(make_net().to(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ds = make_dataset(64 * 3 + 20)
    sampler = UnevenBatchSampler(len(ds), 64, (48, 16), rank, seed=0)
    x, y, _ = ds.tensors
    for i, idx in enumerate(sampler):
        sizes = sampler.sizes_for_batch(i)
        per = ((net(x[idx].to(dev)) - y[idx].to(dev)) ** 2).squeeze(-1)
        (per.mean() * loss_scale(sizes, rank, "mean")).backward()
        opt.step()
        opt.zero_grad()
    return flat_params(net.module)


def check_two_ranks_one_gpu() -> None:
    try:
        params = run_distributed(_two_ranks, timeout=300)
        ref = reference_train(
            make_dataset(64 * 3 + 20), 64, 2, epochs=1, opt="sgd", reduction="mean"
        )
        err = max((p - ref).abs().max().item() for p in params)
        report(
            "2 ranks on one GPU over gloo, exact weighting",
            err < 1e-10,
            f"max |param - reference| {err:.2e}",
        )
    except Exception as exc:
        report("2 ranks on one GPU over gloo, exact weighting", False, repr(exc)[:300])


def check_cuda_event_timing() -> None:
    dev = torch.device("cuda", 0)
    net = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev)
    timer = ComputeTimer(dev)
    timer.attach(net.parameters())
    x = torch.randn(512, 4096, device=dev)
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
    ok = all(abs(e - h) <= 0.1 * h + 2e-4 for e, h, _ in rows)
    detail = ", ".join(
        f"event {e * 1e3:.2f} ms / host sync {h * 1e3:.2f} / host async {a * 1e3:.2f}"
        for e, h, a in rows[:3]
    )
    report("cuda events vs host timing", ok, detail)


def check_memory_bound() -> None:
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
    ok = per > 0 and cap is not None and cap <= 256 and cap >= 128
    capped = MemoryBound(dev, max_micro_batch_size=100)
    capped.largest_run = 128
    ok = ok and capped.cap(64) == 100
    tel = GpuTelemetry(dev)
    sample = tel.sample()
    report(
        "memory bound + NVML",
        ok,
        f"{per / 1024:.1f} KiB/sample, cap {cap} (growth 2x of 128), "
        f"free {free / 2**30:.1f} GiB; telemetry {sample}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (the CPU paths are covered by the test suite)")
        return 0
    print(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
        f"{torch.cuda.device_count()} device(s)",
        flush=True,
    )
    for check in (check_cuda_event_timing, check_memory_bound):
        try:
            check()
        except Exception as exc:
            report(check.__name__, False, repr(exc)[:300])
    check_two_ranks_one_gpu()
    try:
        check_nccl_world_one(args.steps)
    except Exception as exc:
        report("nccl world size 1", False, repr(exc)[:300])
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
