"""Command line: ``python -m lightning_rex {bench,simulate,report}``.

``bench`` runs a real benchmark of ddp against rex, ``simulate`` runs rescaling policies on a
simulated cluster, and ``report`` plots a run's ``rex_decisions.jsonl`` or a simulator trace
(PNGs and an HTML page).

Each sub-command lives in its own module and registers its parser here; heavy imports are
deferred so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def plain(text: str | None) -> str | None:
    """A docstring as plain text for ``--help``: reST roles and literals without markup.

    ``:class:`~a.b.C``` becomes ``C`` (``a.b.C`` without the tilde), a double-backquoted
    literal its text, and a line ending in ``::`` one ending in ``:``.

    Args:
        text: A docstring (a sub-command's module docstring), or None.

    Returns:
        The text, or None.
    """
    if text is None:
        return None

    def role(m: re.Match[str]) -> str:
        target = m.group(1)
        return target.rsplit(".", 1)[-1] if m.group(0).split("`")[1].startswith("~") else target

    out = _ROLE.sub(role, text)
    out = re.sub(r"``([^`]+)``", r"\1", out)
    return re.sub(r"::$", ":", out, flags=re.M)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per command.

    Returns:
        The configured :class:`argparse.ArgumentParser`.
    """
    from lightning_rex.sim.cli import simulate as sim_cli
    from lightning_rex.tools import bench_cli, report

    parser = argparse.ArgumentParser(
        prog="python -m lightning_rex",
        description="lightning-rex: adaptive uneven micro-batches for Lightning.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench_cli.add_parser(sub)
    sim_cli.add_parser(sub)
    report.add_parser(sub)
    for command in sub.choices.values():  # their descriptions are their modules' docstrings
        command.description = plain(command.description)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit code.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
