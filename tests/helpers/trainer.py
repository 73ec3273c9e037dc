"""A quiet CPU Trainer for tests."""

from __future__ import annotations

import tempfile
from typing import Any

import lightning as L


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """CPU, 2 devices, no logger, checkpoints, progress bar or summary; kwargs override.

    Without a ``default_root_dir`` the run's outputs (the decision log) go to a fresh
    temporary directory, not into the checkout.
    """
    args: dict[str, Any] = dict(
        default_root_dir=tempfile.mkdtemp(prefix="rex-test-"),
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    args.update(kwargs)
    return L.Trainer(**args)
