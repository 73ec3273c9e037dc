"""Trains 4 steps with RexStrategy; launched by torchrun as one process per "node"."""

import json
import sys

import torch
from tests.helpers.models import RegModel, make_dataset
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex import RexStrategy


class Sizes(L.Callback):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
        self.sizes.append(len(batch[0]))


def main(out: str) -> None:
    torch.set_num_threads(1)
    sizes = Sizes()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        max_steps=4,
        logger=False,
        strategy=RexStrategy(micro_batch_sizes=[40, 24], adaptive=False),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[sizes],
    )
    trainer.fit(RegModel(), DataLoader(make_dataset(256), batch_size=32, shuffle=True))
    rec = {
        "rank": trainer.global_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "env": type(trainer.strategy.cluster_environment).__name__,
        "sizes": sizes.sizes,
    }
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as fh:
        json.dump(rec, fh)


if __name__ == "__main__":
    main(sys.argv[1])
