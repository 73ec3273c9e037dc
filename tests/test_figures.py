"""Every figure of the README and the docs comes from ``nox -s figures`` (docs/figures/).

1. Each fragment on disk is what its job's saved data renders to: a fragment edited by hand,
   or data whose renderer changed, fails here until ``python docs/figures/figures.py render``.
2. Each ``<!-- figures:NAME -->`` region of a page holds exactly its fragment.
3. Outside those regions (and outside code), every figure a page quotes, a decimal number or
   a number of s, ms or min, is one of the fragments' numbers: a figure typed into prose must
   be one a command measured.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "docs" / "figures"


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rex_figures", HERE / "figures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rex_figures"] = mod
    spec.loader.exec_module(mod)
    return mod


figures = _figures()
FRAGMENTS = figures.fragments()


def test_every_job_has_run_and_its_fragments_are_what_its_data_renders() -> None:
    missing = [name for name in figures.jobs.JOBS if figures.load(name) is None]
    missing = [m for m in missing if figures.jobs.JOBS[m].commands]
    assert not missing, f"jobs never run: {missing} (python docs/figures/figures.py run ...)"
    on_disk = {p.stem: p.read_text() for p in HERE.glob("*.md")}
    assert set(on_disk) == set(FRAGMENTS)
    stale = [name for name, text in FRAGMENTS.items() if on_disk[name] != text]
    assert not stale, f"fragments differ from their data: {stale} (figures.py render)"


@pytest.mark.parametrize("page", figures.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_region_holds_its_fragment(page: Path) -> None:
    text = page.read_text()
    for m in figures.REGION.finditer(text):
        name, body = m.group(1), m.group(2)
        assert name in FRAGMENTS, f"{page.name}: no fragment {name!r}"
        assert body == FRAGMENTS[name], f"{page.name}: region {name!r} differs from its fragment"
    opened = text.count("<!-- figures:")
    assert opened == len(list(figures.REGION.finditer(text))), f"{page.name}: an unclosed region"


@pytest.mark.parametrize("page", figures.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_quoted_outside_the_regions_was_measured(page: Path) -> None:
    known = set().union(*(figures.numbers(t) for t in FRAGMENTS.values()))
    quoted = figures.numbers(figures.outside_regions(page.read_text()))
    assert not quoted - known, (
        f"{page.relative_to(ROOT)} quotes figures no fragment holds: {sorted(quoted - known)}"
    )


def test_the_checks_catch_a_figure_typed_into_prose() -> None:
    text = "rex is 1.23x faster in 14 s. <!-- figures:x -->\n9.99 in 5 min\n<!-- /figures:x -->"
    assert figures.numbers(figures.outside_regions(text)) == {"1.23", "14"}
    code = "`0.5` ```\n0.7\n``` x3,000.5 steps, 2 ms, 1.5.1, [7.5](a/1.5)"
    assert figures.numbers(figures.outside_regions(code)) == {"3000.5", "2", "7.5"}
    assert figures.splice(text, {"x": "new\n"}).endswith(
        "<!-- figures:x -->\nnew\n<!-- /figures:x -->"
    )
