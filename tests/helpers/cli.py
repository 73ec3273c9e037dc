"""Run a ``python -m lightning_rex`` sub-command in-process, with its output captured."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_rex.__main__ import build_parser


def run_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse ``argv`` (sub-command first) as the CLI does and run it.

    Returns:
        The exit code, stdout and stderr.
    """
    args: Any = build_parser().parse_args(argv)
    rc = int(args.func(args))
    out = capsys.readouterr()
    return rc, out.out, out.err
