"""A progress bar for simulator runs: on a terminal's stderr, silent elsewhere."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(total: int, args: argparse.Namespace) -> Any:
    """A progress bar of ``total`` runs on stderr, or a silent one.

    Silent under ``--json`` and when stderr is not a terminal (a log, a pipe, CI).

    Args:
        total: The runs (seeds x policies).
        args: The parsed arguments.

    Returns:
        A ``tqdm`` bar (``update``, ``set_postfix_str``, ``close``).
    """
    from tqdm import tqdm

    quiet = bool(args.json) or not sys.stderr.isatty()
    return tqdm(total=total, desc="simulate", unit="run", file=sys.stderr, disable=quiet)
