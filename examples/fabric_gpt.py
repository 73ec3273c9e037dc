"""A small GPT pretraining loop with Lightning Fabric and lightning-rex (uneven micro-batches).

The loop (``train``) is the usual Fabric loop plus four REX lines: ``RexLoop``,
``setup_dataloader``, ``passes``/``scale`` and ``step``. Run it on two CPU processes, rank 1
emulated 3x slower, and compare it with even Fabric DDP in the same run (paired)::

    python examples/fabric_gpt.py --compare 3          # 3 pairs of rex vs even, 2 CPU ranks
    python examples/fabric_gpt.py --strategy rex_fsdp  # the same loop, sharded (FSDP2)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import lightning as L
from lightning_rex import HeterogeneityEmulator, RexLoop


class GPT(nn.Module):
    """A decoder-only transformer: token and position embeddings, causal blocks, a head."""

    def __init__(self, vocab: int = 64, context: int = 32, width: int = 64, layers: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.head(h)


class Tokens(Dataset):
    """Sequences of a repeating pattern with noise: (input, target, index) per sample."""

    def __init__(self, n: int, context: int = 32, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.data = (start + torch.arange(context + 1)) % vocab
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.data[i, :-1], self.data[i, 1:], i


def train(strategy: str, adaptive: bool, steps: int, slowdowns: list[float] | None) -> dict:
    """One run of the loop; returns what it measured (rank 0's view, and this rank's samples)."""
    torch.manual_seed(0)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    model = fabric.setup(GPT())  # sharded first under rex_fsdp: the optimizer comes after
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3))
    emulator = HeterogeneityEmulator(slowdowns) if slowdowns else None
    rex = RexLoop(fabric, model, adaptive=adaptive, emulator=emulator, window=10, verbose=False)
    loader = rex.setup_dataloader(DataLoader(Tokens(64 * steps), batch_size=32, shuffle=True))
    seen, losses, start = [], [], time.perf_counter()
    for x, y, index in loader:
        for part_x, part_y in rex.passes((x, y)):
            logits = model(part_x)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), part_y.flatten())
            fabric.backward(rex.scale(loss))
        optimizer.step()
        optimizer.zero_grad()
        rex.step()
        seen += index.tolist()
        losses.append(loss.item())
        if rex.steps >= steps:
            break
    rex.finish()
    return {
        "seconds": time.perf_counter() - start,
        "seen": seen,
        "plan": list(rex.plan),
        "changes": rex.plan_schedule.changes,
        "loss": sum(losses[-5:]) / 5,
        "records": rex.records,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--strategy", default="rex", choices=["rex", "rex_fsdp"])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--slowdown", type=float, default=3.0, help="rank 1's emulated slowdown")
    p.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="PAIRS",
        help="also run even DDP: PAIRS pairs (even, rex), one after the other",
    )
    p.add_argument("--json", help="write the figures to this file (rank 0)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    slow = [1.0, a.slowdown]
    pairs = []
    for _ in range(max(1, a.compare)):
        even = train(a.strategy, False, a.steps, slow) if a.compare else None
        rex = train(a.strategy, True, a.steps, slow)
        pairs.append((even, rex))
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    summary: dict[str, Any] = {
        "strategy": a.strategy,
        "steps": a.steps,
        "rex_plan": pairs[-1][1]["plan"],
        "rex_seconds": [r["seconds"] for _, r in pairs],
    }
    if a.compare:
        ratios = [e["seconds"] / r["seconds"] for e, r in pairs if e is not None]
        summary["even_seconds"] = [e["seconds"] for e, _ in pairs if e is not None]
        summary["rex_over_even"] = ratios
        summary["rex_over_even_geomean"] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
