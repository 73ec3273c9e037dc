"""The layers, checked statically.

No module under core/, driver/ or sim/ may import Lightning or torch.distributed, and
arrows point down only: core/ imports only core/, driver/ only core/ and driver/, sim/ only
core/, driver/ and sim/.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "lightning_rex"
FORBIDDEN = ("lightning", "pytorch_lightning", "lightning_fabric", "torch.distributed")
FILES = sorted(p for d in ("core", "driver", "sim") for p in (ROOT / d).rglob("*.py"))
LAYERS = {"core": {"core"}, "driver": {"core", "driver"}, "sim": {"core", "driver", "sim"}}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_there_are_files_to_check():
    assert any(p.parent.name == "core" for p in FILES)
    assert any(p.parent.name == "sim" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_framework_imports(path):
    bad = [n for n in _imports(path) if _forbidden(n)]
    assert not bad, f"{path} imports {bad}"


def test_checker_catches_violations(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "import torch\nfrom torch import distributed\ndef g():\n    import lightning.pytorch\n"
    )
    assert [n for n in _imports(f) if _forbidden(n)] == ["torch.distributed", "lightning.pytorch"]
    f.write_text("from lightning_rex.core import plan\nimport lightning_utilities\n")
    assert not [n for n in _imports(f) if _forbidden(n)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_arrows_point_down(path):
    allowed = LAYERS[path.relative_to(ROOT).parts[0]]
    ours = [n for n in _imports(path) if n.startswith("lightning_rex.")]
    bad = [n for n in ours if n.split(".")[1] not in allowed]
    assert not bad, f"{path} imports {bad} from above its layer"


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its last line of output."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


LOADED = "print('lightning' in sys.modules, 'torch.distributed' in sys.modules)"


def test_importing_the_framework_free_layers_loads_no_framework_at_run_time():
    # the layers' source is clean (above); importing them must not load a framework either,
    # through the root package or a heavy dependency (torch itself imports torch.distributed)
    code = f"import sys, lightning_rex.core, lightning_rex.driver, lightning_rex.sim; {LOADED}"
    assert _fresh(code) == "False False"
    assert _fresh(f"import sys, lightning_rex; {LOADED}") == "False False"


def test_the_command_line_help_loads_no_framework():
    code = (
        "import sys\nfrom lightning_rex.__main__ import build_parser\nbuild_parser()\n"
        "print('lightning' in sys.modules, 'torch' in sys.modules)"
    )
    assert _fresh(code) == "False False"


@pytest.mark.parametrize(
    "imports",
    [
        "import lightning_rex; import lightning as L",
        "import lightning as L; import lightning_rex",
        "import lightning_rex; from lightning.pytorch import Trainer; import lightning as L",
    ],
)
def test_strategy_rex_works_after_import_lightning_rex_in_any_order(imports):
    code = (
        f"{imports}\nt = L.Trainer(strategy='rex', accelerator='cpu', devices=2, logger=False)\n"
        "print(type(t.strategy).__name__, t.strategy._start_method)"
    )
    assert _fresh(code) == "RexStrategy popen"


def _module_graph() -> dict[str, set[str]]:
    """Every import between the package's modules: top level, in functions, TYPE_CHECKING."""
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for n in _imports(p):
            while n and n not in mods:
                n = n.rsplit(".", 1)[0] if "." in n else ""
            # a module importing its own package's __init__ (re-exports) is not a cycle
            if n and n != m and not m.startswith(n + "."):
                graph[m].add(n)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # command for the figure: python -m pytest tests/test_import_boundary.py -k cycles
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
