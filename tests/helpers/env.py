"""The environment for a subprocess that starts its own ranks, as a user's shell would give.

In-process fits leave Lightning's launcher variables (``MASTER_PORT``, ``LOCAL_RANK``...) in
``os.environ`` of the test process; a script started from there with them would take itself
for a rank of an external launch and wait for peers that never come.
"""

from __future__ import annotations

import os
from typing import Any

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


def run_python(*args: str, cwd: str | os.PathLike[str] | None = None) -> Any:
    """``python ARGS`` in a user's environment (warnings off), output captured, 10 min at most."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=user_env(PYTHONWARNINGS="ignore"),
        capture_output=True,
        text=True,
        timeout=600,
    )
