"""Every shell line in README.md works as pasted, in the README's order.

Each line of a ``bash`` block is checked against what it names: a nox session that
exists, a pip requirement the project has, a ``python -m lightning_rex`` command line that
the parser accepts, an example (and its config) that exists. The lines that need the
package installed come after the install section. A new kind of line fails here until
this test knows how to check it.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from tests.helpers.env import run_python

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _lines() -> list[tuple[int, str]]:
    """``(offset in README, command)`` of every shell line, continuations joined."""
    out = []
    for block in re.finditer(r"```bash\n(.*?)```", README, re.S):
        text = block.group(1).replace("\\\n", " ")
        for line in text.splitlines():
            cmd = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if cmd:
                out.append((block.start(), cmd))
    return out


def _sessions() -> set[str]:
    src = (ROOT / "noxfile.py").read_text()
    return set(re.findall(r"@nox\.session\ndef (\w+)\(", src))


def _check(cmd: str, after_install: bool) -> None:
    for part in cmd.split("&&"):
        argv = shlex.split(part)
        assert not any(a.startswith("[") for a in argv), f"optional flags in brackets: {cmd}"
        if argv[:4] == ["python3", "-m", "pip", "install"] or argv[:2] == ["pip", "install"]:
            toml = (ROOT / "pyproject.toml").read_text()
            section = toml.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
            extras = re.findall(r"^(\w+) = ", section, re.M)
            for a in argv:
                m = re.fullmatch(r"\.\[([\w,]+)\]", a)
                if m:
                    assert set(m.group(1).split(",")) <= set(extras), cmd
        elif argv[:3] == ["python3", "-m", "nox"]:
            assert argv[3] == "-s" and argv[4] in _sessions(), cmd
        elif argv[:3] == ["python", "-m", "lightning_rex"]:
            assert after_install, f"needs the package installed, before the install section: {cmd}"
            from lightning_rex.__main__ import build_parser

            build_parser().parse_args(argv[3:])  # SystemExit on a bad command line
        elif argv[0] == "python" and argv[1].startswith("examples/"):
            assert after_install, f"needs the package installed, before the install section: {cmd}"
            assert (ROOT / argv[1]).is_file(), cmd
            for a, b in itertools.pairwise(argv):
                if a == "--config":
                    assert (ROOT / b).is_file(), cmd
        else:
            pytest.fail(f"README line this test cannot check: {cmd}")


def test_every_readme_shell_line_works_as_pasted() -> None:
    install = README.index("## Installing into your own environment")
    lines = _lines()
    assert len(lines) >= 8
    for offset, cmd in lines:
        _check(cmd, offset > install)


@pytest.mark.distributed
def test_the_readme_script_trains_and_its_run_can_be_reported(tmp_path: Path) -> None:
    """The first python block is a whole script: it trains 2 CPU ranks, then the report."""
    script = re.search(r"```python\n(.*?)```", README, re.S)
    assert script is not None
    (tmp_path / "train.py").write_text(script.group(1))
    run = run_python("train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    found = re.search(r"plan in force at the end: \[(\d+), (\d+)\]", run.stdout)
    assert found is not None, run.stdout[-2000:]
    assert int(found.group(1)) > int(found.group(2))  # the fast rank 0 took more samples
    log = tmp_path / "lightning_logs" / "version_0" / "rex_decisions.jsonl"
    assert log.is_file() and log.read_text().strip()
    report = run_python("-m", "lightning_rex", "report", "lightning_logs/version_0", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (log.parent / "rex_report" / "index.html").is_file()
