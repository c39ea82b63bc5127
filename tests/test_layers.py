"""The layers of ``../shared/DESIGN.md`` that ``lint-imports`` (pyproject.toml) cannot state:
a kernel imports numpy, numba, math and other kernels, and nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_IMPORTS = {"__future__", "numpy", "numba", "math", "kernels"}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module, including those inside
    functions; a relative import is its own package's."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0] if node.level == 0 else "kernels"
            out.append((node.lineno, top))
    return out


def stray_imports(package: str, allowed: set[str]) -> list[str]:
    return [
        f"{f.relative_to(ROOT)}:{line} imports {top}"
        for f in sorted((ROOT / package).rglob("*.py"))
        for line, top in imported(f)
        if top not in allowed
    ]


def test_kernels_import_only_numpy_numba_math() -> None:
    assert stray_imports("kernels", KERNEL_IMPORTS) == []


def test_the_check_sees_a_stray_import(tmp_path: Path) -> None:
    bad = tmp_path / "k.py"
    bad.write_text("import math\n\ndef f():\n    import pandas as pd\n    from . import rng\n")
    assert [top for _l, top in imported(bad)] == ["math", "pandas", "kernels"]


@pytest.mark.parametrize("package", ["pipeline", "kernels"])
def test_no_upward_import_of_flows(package: str) -> None:
    found = [
        f"{f.relative_to(ROOT)}:{line}"
        for f in sorted((ROOT / package).rglob("*.py"))
        for line, top in imported(f)
        if top in {"flows", "prefect"}
    ]
    assert found == []
