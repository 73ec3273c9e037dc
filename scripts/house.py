"""The house's shape, measured: long modules, files per folder, and short local names.

Issue 35 asked for these before and after its refactor. Run from the repository root::

    python scripts/house.py [--src src/lightning_rex] [--over 400] [--json]

A *local name* is a name a function body binds (an assignment, a ``for`` or ``with``
target, an ``except ... as``), counted once per function; names bound only inside a
comprehension, ``_`` and the function's own parameters are left out. *Short* means at most
two characters.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

SHORT = 2


def _bound_names(func: ast.AST) -> set[str]:
    """The names ``func``'s own body binds, outside comprehensions and nested functions."""
    names: set[str] = set()
    skip = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.arguments)
    comprehensions = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, skip + comprehensions):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        stack.extend(ast.iter_child_nodes(node))
    names.discard("_")
    return names


def short_names(path: Path) -> tuple[int, int]:
    """``(short, all)`` local names over the functions of one file."""
    tree = ast.parse(path.read_text())
    short = total = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _bound_names(node)
            total += len(names)
            short += sum(len(n) <= SHORT for n in names)
    return short, total


def measure(src: Path, over: int) -> dict[str, object]:
    """The three measures over the package at ``src``."""
    files = sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)
    lines = {str(p.relative_to(src)): len(p.read_text().splitlines()) for p in files}
    folders = Counter(str(p.parent.relative_to(src)) for p in files)
    per_file = {str(p.relative_to(src)): short_names(p) for p in files}
    short = sum(s for s, _ in per_file.values())
    total = sum(t for _, t in per_file.values())
    worst = sorted(
        ((s / t, name, t) for name, (s, t) in per_file.items() if t >= 20), reverse=True
    )[:5]
    return {
        "modules_over": {k: v for k, v in sorted(lines.items()) if v > over},
        "largest": max(lines.items(), key=lambda kv: kv[1]),
        "files_per_folder": dict(sorted(folders.items())),
        "short_local_names": [short, total, round(short / max(total, 1), 3)],
        "worst_files": [[name, round(share, 2), count] for share, name, count in worst],
    }


def main() -> None:
    """Print the measures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default="src/lightning_rex", help="the package's folder")
    parser.add_argument("--over", type=int, default=400, help="list modules over this length")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    out = measure(Path(args.src), args.over)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
