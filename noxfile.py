"""nox sessions: tests, lint, typecheck, docs, demo.

Each session installs the CPU build of torch first (``torch==2.13.0`` is served locally on
our machines; a bare ``torch`` requirement would pull a multi-GB CUDA build), then the
package with the extras it needs.
"""

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = os.environ.get("REX_TORCH_SPEC", "torch==2.13.0")


def _install(session: nox.Session, extras: str = "dev") -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pass pytest arguments after --)."""
    _install(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "src", "tests", "examples", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "examples", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on the package (disallow_untyped_defs)."""
    _install(session)
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the API reference from the docstrings into site/ (pdoc, Google style)."""
    _install(session, "docs")
    session.run("pdoc", "-d", "google", "-o", "site", "lightning_rex", "!lightning_rex.__main__")


@nox.session
def demo(session: nox.Session) -> None:
    """2 CPU ranks, rank 1 emulated 3x slower: rex vs ddp throughput."""
    _install(session, "dev")
    session.run(
        "python",
        "-m",
        "lightning_rex",
        "bench",
        "--compare",
        "ddp,rex",
        "--devices",
        "2",
        "--slowdowns",
        "1,3",
        "--steps",
        "300",
        *session.posargs,
    )
