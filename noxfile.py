"""nox sessions: tests, lint, typecheck, docs, examples, demo, figures.

Each session installs the CPU build of torch first (``torch==2.13.0`` is served locally on
our machines; a bare ``torch`` requirement would pull a multi-GB CUDA build), then the
package with the extras it needs.
"""

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = os.environ.get("REX_TORCH_SPEC", "torch==2.13.0")


def _install(session: nox.Session, extras: str | None = "dev") -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]" if extras else ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pass pytest arguments after --)."""
    _install(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.5")
    files = ("src", "tests", "examples", "docs/figures", "scripts", "noxfile.py", "setup.py")
    session.run("ruff", "check", *files)
    session.run("ruff", "format", "--check", *files)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on the package (disallow_untyped_defs)."""
    _install(session)
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the docs site into site/ (mkdocs-material + mkdocstrings; warnings are errors)."""
    _install(session, "docs")
    # NO_MKDOCS_2_WARNING: mkdocs-material >= 9.7 prints a banner about MkDocs 2.0 on every build
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example in examples/ on CPU, each in its short form (CI runs this)."""
    _install(session, "examples")
    tmp = session.create_tmp()
    here = os.getcwd()
    ex = os.path.join(here, "examples")
    py = ("python", "-W", "ignore::DeprecationWarning")
    session.run(*py, f"{ex}/quickstart.py", "--repeat", "1", "--steps", "120")
    for config in ("adaptive.yaml", "static_plan.yaml"):
        with session.chdir(tmp):  # the CLI writes lightning_logs here
            session.run(*py, f"{ex}/cli/train.py", "fit", "--config", f"{ex}/cli/{config}")
    session.run(*py, f"{ex}/simulate_cluster.py", "--seeds", "0-1", "--out", f"{tmp}/sim")
    session.run(*py, f"{ex}/digits.py", "--epochs", "3", "--log-dir", f"{tmp}/digits")
    session.run(*py, f"{ex}/batch_scaling.py", "--repeat", "1", "--stop-at-target")
    session.run(*py, f"{ex}/profile_curve.py", "--model", "bench", "--sizes", "1,4,16")
    session.run(*py, f"{ex}/gpu_check.py")  # says there is no GPU and exits 0 on CPU


@nox.session
def figures(session: nox.Session) -> None:
    """Run the figure jobs (all, or those named after --) and splice them into the docs.

    Every measured figure of README.md and docs/ comes from here (docs/figures/figures.py);
    tests/test_figures.py fails when a page quotes a figure no job measured.
    """
    _install(session, "dev,examples")  # dev: the controller's trials are its tests' own
    session.run("python", "docs/figures/figures.py", "run", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """rex vs ddp vs the best static plan, 2 CPU ranks, rank 1 emulated 3x slower."""
    _install(session, None)  # the package alone: the demo needs nothing else
    session.run("python", "examples/quickstart.py", *session.posargs)
