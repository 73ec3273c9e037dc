"""Every measured figure of the README and the docs, from one place: ``nox -s figures``.

Each *job* of :mod:`jobs` is a list of commands (``python -m lightning_rex simulate ...``,
``python examples/quickstart.py ...``) and a renderer. ``run`` executes a job's commands,
timing each, and saves what they printed to ``docs/figures/data/<job>.json``; ``render``
turns every saved job into markdown fragments, ``docs/figures/<fragment>.md``, and splices
each into the README and the docs pages wherever they hold it::

    <!-- figures:demo-table -->
    ...the fragment, written by this script...
    <!-- /figures:demo-table -->

so a figure cannot drift from its command: editing one by hand fails
``tests/test_figures.py``, which re-renders every fragment from its data, compares every
region with its fragment, and checks that every figure the pages quote elsewhere (a decimal
number, or a duration in s, ms or min) is one of the fragments' numbers.

Usage (from the repository root; ``nox -s figures`` runs ``run`` in its own venv)::

    python docs/figures/figures.py run                 # every job (about an hour on 2 cores)
    python docs/figures/figures.py run demo sim-presets  # some jobs
    python docs/figures/figures.py run --workers 2 gns-long  # independent simulations, two at once
    python docs/figures/figures.py render              # re-render and splice, no commands
    python docs/figures/figures.py list                # the jobs and their commands
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "data"
sys.path.insert(0, str(HERE))

import jobs  # noqa: E402  (beside this file)

REGION = re.compile(r"<!-- figures:([\w-]+) -->\n(.*?)<!-- /figures:\1 -->", re.S)
_EDGE = r"[A-Za-wyz0-9_.]"  # a number's neighbours, an "x" of a ratio (x1.78, 1.78x) excepted
NUMBER = re.compile(
    rf"(?<!{_EDGE})x?(\d[\d,]*\.\d+)x?(?!{_EDGE})|(?<!{_EDGE})(\d[\d,]*)(?= ?(?:ms|s|min)\b)"
)


def pages() -> list[Path]:
    """The README and every docs page (the fragments themselves excepted)."""
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if HERE not in p.parents]
    return [ROOT / "README.md", *docs]


# ----------------------------------------------------------------------------- running
@contextlib.contextmanager
def _busy_loops(n: int) -> Iterator[None]:
    """``n`` other CPU-heavy processes on the machine while a command runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _beside(n: int) -> str:
    return "" if not n else f" (beside {n} busy loop{'s' if n > 1 else ''})"


def run_command(cmd: jobs.Command, tmp: str) -> dict[str, Any]:
    """Run one command in the job's temporary directory; return its output and duration."""
    argv = [a.format(python=sys.executable, root=str(ROOT)) for a in cmd.argv]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    print(f"figures: {cmd.shown}{_beside(cmd.load)}", flush=True)
    out = Path(tmp) / "out.json"
    out.unlink(missing_ok=True)
    start = time.monotonic()
    with _busy_loops(cmd.load):
        proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"figures: {cmd.shown} failed:\n{proc.stderr[-4000:]}")
    result: Any = None
    if cmd.output == "file":
        result = json.loads(out.read_text())
    elif cmd.output == "last-line":
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    elif cmd.output == "json":
        result = json.loads(proc.stdout)
    return {"command": cmd.shown, "seconds": seconds, "load": cmd.load, "result": result}


def compact(value: Any) -> Any:
    """Long lists of numbers (a 4096-rank plan) kept as their length and first entries."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > 64 and all(isinstance(v, (int, float)) for v in value):
            return {"len": len(value), "head": value[:8]}
        return [compact(v) for v in value]
    return value


def run_job(job: jobs.Job, workers: int = 1) -> None:
    """Run every command of ``job`` and save the outputs.

    Args:
        job: The job.
        workers: Commands run at once. With 1, in order, in one directory; with more, each
            in a directory of its own (for jobs of independent simulations, whose figures
            are in simulated time; a command run beside a busy loop is never run
            concurrently).
    """
    with tempfile.TemporaryDirectory(prefix="rex-figures-") as tmp:
        if workers <= 1 or any(cmd.load for cmd in job.commands.values()):
            out = {key: compact(run_command(cmd, tmp)) for key, cmd in job.commands.items()}
        else:
            dirs = {key: Path(tmp) / f"c{i}" for i, key in enumerate(job.commands)}
            for d in dirs.values():
                d.mkdir()
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                futures = {
                    key: pool.submit(run_command, cmd, str(dirs[key]))
                    for key, cmd in job.commands.items()
                }
                out = {key: compact(f.result()) for key, f in futures.items()}
    saved = {
        "job": job.name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "commands": out,
    }
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"{job.name}.json").write_text(json.dumps(saved, indent=1) + "\n")


# ----------------------------------------------------------------------------- rendering
def load(name: str) -> dict[str, Any] | None:
    """A job's saved data, or None before it has run."""
    path = DATA / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fragments() -> dict[str, str]:
    """Every fragment rendered from the saved data (jobs that have not run give none)."""
    out: dict[str, str] = {}
    for job in jobs.JOBS.values():
        data = load(job.name) if job.commands else {"commands": {}}
        if data is None:
            continue
        for name, text in job.render(data).items():
            out[name] = text.rstrip("\n") + "\n"
    return out


def splice(text: str, frags: dict[str, str]) -> str:
    """``text`` with every region holding a known fragment rewritten to it."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        body = frags.get(name, m.group(2))
        return f"<!-- figures:{name} -->\n{body}<!-- /figures:{name} -->"

    return REGION.sub(sub, text)


def render() -> None:
    """Write every fragment and splice it into the pages."""
    frags = fragments()
    for old in HERE.glob("*.md"):
        if old.stem not in frags:
            old.unlink()
    for name, text in frags.items():
        (HERE / f"{name}.md").write_text(text)
    for page in pages():
        text = page.read_text()
        new = splice(text, frags)
        if new != text:
            page.write_text(new)


# ----------------------------------------------------------------------------- checking
def outside_regions(text: str) -> str:
    """A page's prose with the fragments' regions, code and link targets taken out."""
    text = REGION.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    # not figures: versions and the identifiers of papers
    return re.sub(r"Python \d+\.\d+|doi:\S+|arXiv:\S+", "", text)


def numbers(text: str) -> set[str]:
    """The figures a text quotes: decimals, and whole numbers of s, ms or min."""
    return {(a or b).replace(",", "") for a, b in NUMBER.findall(text)}


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="run jobs (all by default), then render")
    r.add_argument("names", nargs="*", help=f"jobs, from {', '.join(jobs.JOBS)}")
    r.add_argument(
        "--workers",
        type=int,
        default=1,
        help="commands of a job run at once, each in its own directory (default 1: in order)",
    )
    sub.add_parser("render", help="render the fragments from the saved data and splice them")
    sub.add_parser("list", help="the jobs and their commands")
    a = p.parse_args(argv)
    if a.what == "list":
        for job in jobs.JOBS.values():
            print(f"{job.name}:")
            for cmd in job.commands.values():
                print(f"    {cmd.shown}{_beside(cmd.load)}")
        return 0
    if a.what == "run":
        unknown = [n for n in a.names if n not in jobs.JOBS]
        if unknown:
            p.error(f"unknown jobs {unknown}; the jobs are {', '.join(jobs.JOBS)}")
        for name in a.names or list(jobs.JOBS):
            if jobs.JOBS[name].commands:
                run_job(jobs.JOBS[name], a.workers)
    render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
