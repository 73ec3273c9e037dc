"""The environment for a subprocess that starts its own ranks, as a user's shell would give.

In-process fits leave Lightning's launcher variables (``MASTER_PORT``, ``LOCAL_RANK``...) in
``os.environ`` of the test process; a script started from there with them would take itself
for a rank of an external launch and wait for peers that never come.
"""

from __future__ import annotations

import os

LAUNCHER = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "LOCAL_RANK",
    "GLOBAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "PL_GLOBAL_SEED",
    "PL_TRAINER_GPUS",
)


def user_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without the launcher's variables, with ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    return {**env, **extra}
