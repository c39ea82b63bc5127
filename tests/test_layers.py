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


def slice_assignments(path: Path) -> list[str]:
    """``a[... : ...] = b`` (or ``+=``) in a module whose ``b`` is not a number: numba lowers it
    through its slice assignment, whose shape-mismatch message costs about 2.8 s of compiling
    per process (``kernels.arrays``). A row assigned from a row (``a[i] = b[j]``) takes the same
    path but cannot be told from a scalar here: the warm-up test catches those it runs."""

    def number(v: ast.expr) -> bool:
        if isinstance(v, ast.UnaryOp):
            return number(v.operand)
        if isinstance(v, ast.Attribute):  # np.nan, np.inf
            return v.attr in {"nan", "inf"}
        return isinstance(v, ast.Constant)

    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AugAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for t in targets:
            if not isinstance(t, ast.Subscript) or number(value):
                continue
            index = t.slice.elts if isinstance(t.slice, ast.Tuple) else [t.slice]
            if any(isinstance(e, ast.Slice) for e in index):
                out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_kernels_copy_arrays_with_loops() -> None:
    found = [s for f in sorted((ROOT / "kernels").rglob("*.py")) for s in slice_assignments(f)]
    assert found == []


def test_the_check_sees_a_slice_assignment(tmp_path: Path) -> None:
    bad = tmp_path / "k.py"
    bad.write_text("def f(a, b, i):\n    a[:] = 0.0\n    a[i, :] = -np.inf\n    a[i, :] += b\n")
    assert [s.split(": ", 1)[1] for s in slice_assignments(bad)] == ["a[i, :] += b"]
