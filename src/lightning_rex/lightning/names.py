"""The strategy names lightning-rex registers with Lightning, and what each stands for.

Kept apart from :mod:`~lightning_rex.lightning.registration` (which imports the strategy only
when a Trainer asks for one) and :mod:`~lightning_rex.lightning.strategy` (which registers
itself under them), so that neither imports the other.
"""

from __future__ import annotations

__all__ = ["DDP_NAMES", "START_METHODS"]

START_METHODS = {
    "rex": "popen",
    "rex_spawn": "spawn",
    "rex_fork": "fork",
    "lightning_rex.rexstrategy": "popen",
}
"""Each registered name and its start method. The class path is registered too (Lightning
lowercases strategy names), so that a bare ``--trainer.strategy=lightning_rex.RexStrategy``,
which jsonargparse passes on as a string, resolves."""

DDP_NAMES = {
    "rex": "ddp",
    "rex_spawn": "ddp_spawn",
    "rex_fork": "ddp_fork",
    "lightning_rex.rexstrategy": "ddp",
}
"""Each registered name and the DDP name whose checks by name it gets."""


def description(start_method: str) -> str:
    """The registry's description of a rex name.

    Args:
        start_method: Its start method.

    Returns:
        The description.
    """
    return f"REX uneven micro-batches over DDP with start_method '{start_method}'"
