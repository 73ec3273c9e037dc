"""The prepared device check of issue 33 (FSDP, memory, compile), for a machine with a GPU.

    PYTHONPATH=src python examples/fsdp_gpu_check.py [--json FILE]      # at most ~8 minutes

Each check runs in a fresh Python process and prints one PASS/FAIL line:

1. ``fsdp1``: ``rex_fsdp`` on CUDA over NCCL at world size 1 (one GPU cannot host two NCCL
   ranks), float64, with ``max_pass_sizes=10`` so the 32-sample batch runs as accumulation
   passes through FSDP2's switches: parameters within 1e-10 of one process on the batch.
   (Two ranks with uneven plans are checked on CPU by ``tests/lightning/test_fsdp.py``.)
2. ``bytes``: the memory bound's bytes per sample and fixed bytes on a small GPT at pass
   sizes 8, 16 and 32 (``torch.cuda.max_memory_allocated``), and the pass cap it derives.
3. ``compile``: the first-step cost of a new batch shape for an inductor-compiled GPT, with
   the batch dimension marked dynamic (rex's default) and without.

On a machine without CUDA it says so and exits 0 (``REX_GPU_CHECK_ACCEL=cpu`` dry-runs the
checks on CPU, gloo instead of NCCL).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
CHECKS = ("fsdp1", "bytes", "compile")
ACCEL = os.environ.get("REX_GPU_CHECK_ACCEL", "gpu")


def check_fsdp1() -> tuple[bool, str]:
    import torch
    from tests.helpers.models import RegModel, make_dataset, reference_train
    from torch.distributed.tensor import DTensor

    import lightning as L
    import lightning_rex

    strategy = lightning_rex.RexFSDPStrategy(
        adaptive=False,
        max_pass_sizes=10,
        process_group_backend="nccl" if ACCEL == "gpu" else "gloo",
    )
    t = L.Trainer(
        accelerator=ACCEL,
        devices=1,
        strategy=strategy,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(),
    )
    model = RegModel()
    ds = make_dataset(64 * 3 + 20)
    t.fit(model, torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True))
    ps = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.net.parameters()]
    got = torch.cat([p.detach().reshape(-1).cpu() for p in ps])
    ref = reference_train(ds, 32, 1, epochs=2, opt="sgd", reduction="mean")
    err = (got - ref).abs().max().item()
    passes = sorted({len(ix) for _, _, ix in model.seen})
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "-"
    ok = err < 1e-10 and passes[-1] <= 10
    return ok, f"backend {backend}, max |param - reference| {err:.2e}, pass sizes {passes}"


def _gpt(device: Any) -> Any:
    from fabric_gpt import GPT

    return GPT(vocab=256, context=128, width=256, layers=4).to(device)


def check_bytes() -> tuple[bool, str]:
    import torch

    from lightning_rex.measure.telemetry import MemoryBound

    device = torch.device("cuda" if ACCEL == "gpu" else "cpu")
    model = _gpt(device)
    opt = torch.optim.AdamW(model.parameters())
    bound = MemoryBound(device)
    rows = []
    for size in (8, 16, 32):
        x = torch.randint(0, 256, (size, 128), device=device)
        bound.step_start()
        fixed = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        model(x).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
        bound.step_end(size)
        rows.append({"pass": size, "fixed_bytes": fixed, "per_sample": bound.per_sample_bytes})
    cap = bound.cap(32)
    ok = device.type != "cuda" or ((bound.per_sample_bytes or 0) > 0 and cap is not None)
    return ok, f"{rows}, pass cap {cap}"


def check_compile() -> tuple[bool, str]:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from lightning_rex.lightning.passes import mark_batch_dynamic

    device = torch.device("cuda" if ACCEL == "gpu" else "cpu")
    out: dict[str, Any] = {}
    for marked in (False, True):
        torch._dynamo.reset()
        counters.clear()
        model = torch.compile(_gpt(device), dynamic=False)
        times = []
        for size in (32, 40, 24, 32):
            x = torch.randint(0, 256, (size, 128), device=device)
            if marked:
                mark_batch_dynamic(x, size)
            t0 = time.perf_counter()
            model(x).float().mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(round(time.perf_counter() - t0, 3))
        key = "marked" if marked else "static"
        out[key] = {"seconds": times, "graphs": int(counters["stats"]["unique_graphs"])}
    # static: one graph per new size (3); marked: one for all
    ok = out["marked"]["graphs"] == 1 < out["static"]["graphs"]
    return ok, f"step seconds at sizes 32, 40, 24, 32 and dynamo graphs: {out}"


def main() -> int:
    from gpu_check import run_checks  # the runner both prepared scripts share

    return run_checks(__file__, CHECKS, __doc__ or "", 240, globals(), dry_run=True)


if __name__ == "__main__":
    sys.exit(main())
