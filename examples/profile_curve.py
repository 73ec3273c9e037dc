"""Measure a model's training-step time over micro-batch sizes: a simulator rank entry.

    python examples/profile_curve.py --model resnet18 --sizes 1,2,4,8,16,32,64,128,256,512 \
        --out resnet18_a100.json [--cudnn-benchmark] [--repeats 9]

On the current device (the first CUDA GPU, else the CPU), for each size ``b`` it runs
``warmup`` untimed steps and then ``repeats`` timed training steps (forward, loss, backward,
optimizer step; CUDA is synchronised around each), and records the median. The first step
at every new size is timed apart: its excess over the median is the cost of a new shape on
this device (cuDNN autotuning with ``--cudnn-benchmark``, allocator growth). A size that
runs out of GPU memory ends the sweep; the largest size that fitted becomes ``mem_cap``.

The output is one JSON object whose ``rank`` is a ready simulator rank entry (``curve``,
``mem_cap``, ``device``) and whose ``shape_change_s`` is the median new-shape cost::

    {"rank": {"curve": [[b, s], ...], "mem_cap": 512, "device": "NVIDIA A100-SXM4-80GB"},
     "shape_change_s": 0.41, "model": "resnet18", "sizes": [...], "torch": "2.13.0", ...}

The same file is a prior for a fresh fit's first plan: ``RexCallback(prior="resnet18_a100.json")``
(one profile per device kind, as a list; see docs/callback.md).

Models: ``bench`` (the bench's weight-tied MLP, no extra dependency), ``transformer`` (a
small ``nn.TransformerEncoder`` classifier over 128 tokens) and ``resnet18`` (torchvision's,
on 3x224x224 inputs; needs torchvision).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _model(name: str) -> tuple[nn.Module, tuple[int, ...], int]:
    """The model, one sample's input shape and the number of classes."""
    if name == "bench":
        from lightning_rex.tools.bench import BenchModel

        return BenchModel(width=256, depth=6), (16, 32), 10
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024)
        enc = nn.TransformerEncoder(layer, num_layers=4)

        class _Tx(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.enc, self.head = enc, nn.Linear(256, 10)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.head(self.enc(x.transpose(0, 1)).mean(dim=0))

        return _Tx(), (128, 256), 10
    if name == "resnet18":
        import torchvision  # type: ignore[import-untyped]

        return torchvision.models.resnet18(num_classes=1000), (3, 224, 224), 1000
    raise SystemExit(f"profile_curve: unknown model {name!r}; choose bench, transformer, resnet18")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(
    model_name: str, sizes: list[int], repeats: int, warmup: int, device: torch.device
) -> dict[str, Any]:
    """Time the training step at every size; see the module docstring.

    Args:
        model_name: ``bench``, ``transformer`` or ``resnet18``.
        sizes: Micro-batch sizes, increasing.
        repeats: Timed steps per size.
        warmup: Untimed steps per size after the first (new-shape) step.
        device: Where to run.

    Returns:
        The JSON object of the module docstring.
    """
    torch.manual_seed(0)
    model, shape, classes = _model(model_name)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        _sync(device)
        return time.perf_counter() - t0

    curve: list[list[float]] = []
    first_excess: list[float] = []
    cap = None
    for b in sizes:
        try:
            x = torch.randn(b, *shape, device=device)
            y = torch.randint(0, classes, (b,), device=device)
            first = step(x, y)
            for _ in range(warmup):
                step(x, y)
            med = statistics.median(step(x, y) for _ in range(repeats))
        except torch.cuda.OutOfMemoryError:
            break
        curve.append([b, med])
        first_excess.append(max(first - med, 0.0))
        cap = b
    if len(curve) < 2:
        raise SystemExit("profile_curve: fewer than 2 sizes fitted; try smaller --sizes")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "rank": {"curve": curve, "mem_cap": cap, "device": name},
        # the first size's first step also pays one-off start-up costs: leave it out
        "shape_change_s": statistics.median(first_excess[1:]),
        "model": model_name,
        "sizes": [b for b, _ in curve],
        "repeats": repeats,
        "torch": torch.__version__,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, profile, write the JSON.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bench", choices=("bench", "transformer", "resnet18"))
    p.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if len(sizes) < 2 or sizes[0] < 1:
        raise SystemExit("profile_curve: --sizes needs at least two sizes >= 1")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    out = json.dumps(profile(args.model, sizes, args.repeats, args.warmup, device))
    if args.out:
        with open(args.out, "w") as f:
            f.write(out + "\n")
    else:
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
