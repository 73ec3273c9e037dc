"""What every figure job shares: its commands, and the numbers' formats.

A renderer takes a job's saved data (``{"date", "machine", "commands": {key: {"command",
"seconds", "load", "result"}}}``) and returns ``{fragment name: markdown}``. Numbers are
formatted here once, so the pages quote exactly these strings (``tests/test_figures.py``).
The real runs (demo, bench, examples) run with ``OMP_NUM_THREADS=1``; ``load=True`` runs a
command beside a busy loop, another CPU-heavy process on the same cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Command", "Job"]


@dataclass(frozen=True)
class Command:
    """One command of a job.

    Attributes:
        argv: The command; ``{python}`` is the interpreter, files go to its directory.
        output: What it prints: ``json`` (one object on stdout), ``last-line`` (JSON on its
            last line), ``file`` (it writes ``out.json``), or ``none``.
        load: How many busy loops (CPU-heavy processes) run beside it.
    """

    argv: tuple[str, ...]
    output: str = "json"
    load: int = 0

    @property
    def shown(self) -> str:
        """The command as the docs show it."""
        return " ".join(a.replace("{python}", "python").replace("{root}/", "") for a in self.argv)


@dataclass(frozen=True)
class Job:
    """Commands and a renderer."""

    name: str
    commands: dict[str, Command]
    render: Callable[[dict[str, Any]], dict[str, str]] = field(compare=False)


def _rex(*args: str, output: str = "json", load: int = 0) -> Command:
    return Command(("{python}", "-m", "lightning_rex", *args), output, load)


def _sim(scenario: str, args: str) -> Command:
    """``python -m lightning_rex simulate --scenario SCENARIO ARGS --json``."""
    return _rex("simulate", "--scenario", scenario, *args.split(), "--json")


def _example(name: str, *args: str, output: str = "none", load: int = 0) -> Command:
    return Command(("{python}", f"{{root}}/examples/{name}", *args), output, load)


# ----------------------------------------------------------------------------- formatting
def f3(x: float) -> str:
    """Three decimals."""
    return f"{x:.3f}"


def f2(x: float) -> str:
    """Two decimals."""
    return f"{x:.2f}"


def interval(lo: float | None, hi: float | None) -> str:
    """``[lo, hi]`` to three decimals, or an empty string without one."""
    return "" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def duration(seconds: float) -> str:
    """``14 s``, or ``3 min 15 s``."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def spread(values: list[float]) -> str:
    """The median and range of ratios: ``1.78 (1.64-1.83)``."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def result(data: dict[str, Any], key: str) -> Any:
    """One command's parsed output."""
    return data["commands"][key]["result"]


def seconds(data: dict[str, Any], key: str) -> float:
    """One command's wall time."""
    return float(data["commands"][key]["seconds"])


def measured(data: dict[str, Any]) -> str:
    """The line that says when and where a job ran."""
    return f"Measured {data['date']} on {data['machine']}."


def _over_rex(agg: dict[str, Any], peer: str) -> tuple[float, float | None, float | None]:
    """Rex over ``peer``, from the peer's ``vs_rex`` (paired by seed): ratio and interval."""
    p = agg["policies"][peer]
    lo, hi = p.get("vs_rex_ci95") or (None, None)
    return 1.0 / p["vs_rex"], (None if hi is None else 1.0 / hi), (None if lo is None else 1.0 / lo)
