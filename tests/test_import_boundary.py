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
