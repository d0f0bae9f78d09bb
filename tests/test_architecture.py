"""Project rules from DESIGN.md, held by parsing the package's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

PKG = REPO / "src" / "x1_pretrain"


def imports(module: Path) -> tuple[set[str], set[str]]:
    """(internal module names, external top-level packages) imported anywhere in the file."""
    internal, external = set(), set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.module:
                    internal.add(node.module.split(".")[0])
                else:
                    internal.update(a.name for a in node.names)
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            external.update(a.name.split(".")[0] for a in node.names)
    return internal, external


MODULES = {p.stem: imports(p) for p in PKG.glob("*.py")}


def test_only_tracking_and_runs_touch_mlflow():
    users = sorted(m for m, (_, ext) in MODULES.items() if "mlflow" in ext)
    assert users == ["runs", "tracking"]


def test_data_and_model_never_import_each_other():
    assert "model" not in MODULES["data"][0]
    assert "data" not in MODULES["model"][0]


def test_the_budget_decision_is_pure():
    internal, external = MODULES["budget_guard"]
    assert internal <= {"errors", "config"}
    assert not external & {"torch", "numpy", "mlflow"}


def test_the_dod_checker_reads_only_files():
    internal, external = MODULES["dod"]
    assert not internal & {"runs", "tracking", "train", "loop"} and "mlflow" not in external


def test_importing_any_module_does_nothing(tmp_path):
    names = sorted(MODULES)
    code = f"import importlib\nfor n in {names!r}:\n    importlib.import_module('x1_pretrain.' + n)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and list(Path(tmp_path).iterdir()) == []


def test_every_cli_has_main_and_the_guard():
    for p in PKG.glob("*.py"):
        text = p.read_text()
        if "argparse" in text and "def main(" in text:
            assert 'if __name__ == "__main__":\n    raise SystemExit(main())' in text, p.name
