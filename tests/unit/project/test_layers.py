"""The package is a picture of the pipeline: import-linter's contracts (pyproject.toml: the layers, and
reporting reading rows and registries only) hold, and no module imports a project module inside a function (where a cycle or a backward arrow hides)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[3] / "replaceme_exp"


def test_the_layers_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
    # reports stand on rows, the row format and registries: no direct import of a stage's module
    assert "reporting reads rows and registries KEPT" in proc.stdout, proc.stdout[-3000:]


def function_level_project_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("replaceme_exp"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{inner.lineno} from {inner.module}")
                if isinstance(inner, ast.Import) and any(a.name.startswith("replaceme_exp") for a in inner.names):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{inner.lineno} import")
    return found


def test_no_project_module_is_imported_inside_a_function():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in function_level_project_imports(path)]
    assert not found, found


def test_the_check_finds_a_function_level_import(tmp_path):
    module = tmp_path / "replaceme_exp" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from replaceme_exp.data import images\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, module.parent
    try:
        assert function_level_project_imports(module) == ["replaceme_exp/m.py:2 from replaceme_exp.data"]
    finally:
        PACKAGE = saved
