"""A quiet CPU Trainer for tests."""

from __future__ import annotations

from typing import Any

import lightning as L


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """CPU, 2 devices, no logger, checkpoints, progress bar or summary; kwargs override."""
    args: dict[str, Any] = dict(
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    args.update(kwargs)
    return L.Trainer(**args)
