"""The layers of docs/architecture.md that ``lint-imports`` (pyproject.toml) cannot state:
a kernel imports numpy, numba, math and other kernels, and nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# llvmlite is numba's code generator: a numba ``@intrinsic`` (``kernels.arrays.prefetch``) builds
# its body with llvmlite's IR builder, so it belongs to "numba and nothing else"
KERNEL_IMPORTS = {"__future__", "numpy", "numba", "llvmlite", "math", "kernels"}


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


# but ``kernels._cache``, numba's cache locator for the kernels, which stamps each kernel with a
# hash of the kernel sources it can hold (read from their import statements), as numba itself
# hashes a function's source file
CACHE_MODULE, CACHE_IMPORTS = "kernels/_cache.py", {"ast", "functools", "hashlib", "os", "pathlib"}


def test_kernels_import_only_numpy_numba_math() -> None:
    """Beside the standard library's math, only numpy and numba (with its code generator)."""
    stray = stray_imports("kernels", KERNEL_IMPORTS)
    assert [s for s in stray if not s.startswith(CACHE_MODULE + ":")] == []
    assert {s.rsplit(" ", 1)[1] for s in stray} <= CACHE_IMPORTS


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


def import_circles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module of an import graph (Tarjan):
    each is a circle of modules that import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        # iterative DFS: the graph is deep enough to exhaust the recursion limit
        work = [(v, iter(sorted(graph.find_modules_directly_imported_by(v))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in graph.modules:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))

    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    """No two modules of the product import each other, directly or through others, counting
    imports inside functions (a circle closed in a function is still a circle); an import for
    an annotation only (``if TYPE_CHECKING:``) is not one."""
    import grimp

    graph = grimp.build_graph("pipeline", "flows", "kernels", exclude_type_checking_imports=True)
    assert import_circles(graph) == []


def test_the_circle_check_sees_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import grimp

    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from circ import b\n")
    (pkg / "b.py").write_text("from circ import c\n")
    (pkg / "c.py").write_text("import circ.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circ", cache_dir=None)
    assert import_circles(graph) == [["circ.a", "circ.b", "circ.c"]]


def test_ruff_checks_every_tracked_python_file() -> None:
    """A folder named like a build output (``dist``, ``build``) is skipped by ruff's defaults:
    every file git tracks must be among those ruff checks."""
    import subprocess
    import sys

    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:
        pytest.fail("git ls-files listed no Python file: not a checkout?")
    ruff = Path(sys.executable).parent / "ruff"
    shown = subprocess.run(
        [str(ruff), "check", "--show-files", "."], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    checked = {str(Path(p).resolve().relative_to(ROOT)) for p in shown if p.endswith(".py")}
    assert sorted(set(tracked) - checked) == []


PIPELINE_LAYERS = [
    "core",
    "families",
    "data",
    "models",
    "engines",
    "distributed",
    "estimators",
    "ops",
]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) > 1 and parts[0] == "pipeline" and parts[1] in PIPELINE_LAYERS:
        return PIPELINE_LAYERS.index(parts[1])
    return None


def test_no_module_imported_by_name_from_a_higher_layer() -> None:
    """``importlib.import_module("pipeline....")`` with a literal name is an import that
    import-linter cannot see: it too points down (or stays in its layer)."""
    found = []
    for f in sorted((ROOT / "pipeline").rglob("*.py")):
        here = _layer(".".join(f.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                there = _layer(node.args[0].value)
                if here is not None and there is not None and there > here:
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno} -> {node.args[0].value}")
    assert found == []


#: what ships or is read by users: the product, its configuration, its documentation
SHIPPED = ("pipeline", "kernels", "flows", "infra", "docs")
SHIPPED_FILES = ("README.md", "pyproject.toml", "Makefile")


def shipped_texts() -> list[Path]:
    """The files git tracks or would add (not what it ignores: the docs' built site, caches)."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *SHIPPED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    files = [ROOT / f for f in SHIPPED_FILES]
    files += sorted(ROOT / f for f in listed if f and (ROOT / f).is_file())
    return files


def test_the_shipped_texts_include_the_docs_but_not_their_build() -> None:
    found = {str(p.relative_to(ROOT)) for p in shipped_texts()}
    assert {"docs/conf.py", "docs/index.md", "README.md", "pipeline/__init__.py"} <= found
    assert not [f for f in found if f.startswith(("docs/_build/", "docs/auto_tutorials/"))]


def test_nothing_shipped_points_outside_the_repository_or_names_a_seed_file() -> None:
    """Papers are cited by authors and year ("Raykov et al. 2016, eq. 3.4"), never by the team's
    file numbers, and nothing refers to the folder beside the checkout that users do not have."""
    found = []
    for f in shipped_texts():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if "../shared" in line or re.search(r"\bseeds? 00[0-9]\b", line, re.IGNORECASE):
                found.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == []
