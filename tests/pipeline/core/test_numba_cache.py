"""The kernels' numba cache: without a ``NUMBA_CACHE_DIR`` of the user's, ``import pipeline``
points numba at one directory (``pipeline.numba_cache_dir``), where each kernel is stamped with
every kernel source it can hold (``kernels._cache``): an edit recompiles the kernels that can
hold the edited code, never leaves a stale compiled caller in use (numba's own stamp is the
function's own file only), and leaves every other kernel cached."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernels
from kernels._cache import source_stamp
from tests.conftest import RECORD_COMPILES

PROBE = (
    "import os, pipeline, numba; "
    "print(os.environ['NUMBA_CACHE_DIR']); print(numba.config.CACHE_DIR)"
)


def _probe(env_extra: dict[str, str], unset: bool = True) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not (unset and k == "NUMBA_CACHE_DIR")}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _copy(tmp_path: Path) -> Path:
    """A copy of the kernels package under tmp_path (its caches left out)."""
    copy = tmp_path / "kernels"
    shutil.copytree(
        Path(kernels.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    return copy


def _edit(path: Path, old: str = "", new: str = "") -> None:
    text = path.read_text()
    path.write_text(text.replace(old, new) if old else text + "\n# edited\n")


def test_the_cache_is_one_directory_for_every_version(tmp_path: Path) -> None:
    env_dir, numba_dir = _probe({"XDG_CACHE_HOME": str(tmp_path)})
    assert env_dir == numba_dir
    assert Path(env_dir).name == "numba" and Path(env_dir).is_dir()


def test_a_cache_the_user_chose_is_kept(tmp_path: Path) -> None:
    mine = str(tmp_path / "mine")
    assert _probe({"NUMBA_CACHE_DIR": mine}, unset=False) == [mine, mine]


def test_a_kernel_is_stamped_with_the_sources_it_imports(tmp_path: Path) -> None:
    root = _copy(tmp_path)

    def stamps() -> dict[str, str]:
        files = ["mapdp.py", "tgmcmc.py", "special.py", "obs/_common.py"]
        return {f: source_stamp(root / f, root) for f in files}

    before = stamps()
    assert len(set(before.values())) == 4
    # a leaf no other kernel imports: its own stamp only
    _edit(root / "tgmcmc.py")
    after = stamps()
    assert [f for f in before if before[f] != after[f]] == ["tgmcmc.py"]
    # a kernel MAP-DP reaches through ``kernels.obs.product``: MAP-DP's stamp too
    _edit(root / "obs" / "gaussian_nw.py")
    again = stamps()
    assert [f for f in after if after[f] != again[f]] == ["mapdp.py", "tgmcmc.py"]
    # a package's __init__ is imported with its modules: ``kernels/obs/__init__.py``
    _edit(root / "obs" / "__init__.py")
    assert source_stamp(root / "mapdp.py", root) != again["mapdp.py"]
    assert source_stamp(root / "special.py", root) == again["special.py"]


_RUN = (
    "import json\n"
    + RECORD_COMPILES
    + "from kernels.obs import _common\n"
    + "print(json.dumps([_common.beta_log_evidence(2.0, 3.0, 5.0, 7.0), len(compiled)]))\n"
)


def _run(root: Path, cache: Path, numbas_own: bool = False) -> tuple[float, int]:
    """``kernels.obs._common.beta_log_evidence`` (which inlines ``kernels.special.lbeta``) from
    the copy at root in a fresh process: its value and the number of functions compiled."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(root.parent)}
    if numbas_own:
        # numba's own locator, stamped with the function's own file
        env["NUMBA_CACHE_LOCATOR_CLASSES"] = "UserProvidedCacheLocator"
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=root.parent,
    )
    value, n = json.loads(res.stdout.splitlines()[-1])
    return value, n


def test_numba_imported_first_loads_the_kernels_from_pipelines_cache(tmp_path: Path) -> None:
    """A program that imports numba (or a library using it) before ``import pipeline``: numba
    has read no ``NUMBA_CACHE_DIR``, and the kernels still load from the directory ``import
    pipeline`` names, the one ``make``'s ``dpmm warm`` filled (they were compiled again into
    ``__pycache__`` beside their sources: 142 functions, 90 s for a first Gaussian fit)."""
    root = _copy(tmp_path / "src")
    value, n = _run(root, root / "__pycache__" / "numba")
    assert n > 0
    script = _RUN.replace(
        "from kernels.obs import _common", "import pipeline\nfrom kernels.obs import _common"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = str(root.parent)
    probe = (
        "import numba, os\n"
        "print(json.dumps([os.environ['NUMBA_CACHE_DIR'], numba.config.CACHE_DIR]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script) + probe],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=root.parent,
    )
    got, (where, numbas) = (json.loads(line) for line in res.stdout.splitlines()[-2:])
    assert (where, numbas) == (str(root / "__pycache__" / "numba"), "")
    assert got == [value, 0]


def test_an_edit_recompiles_the_kernels_that_hold_it_and_no_others(tmp_path: Path) -> None:
    root, cache = _copy(tmp_path / "src"), tmp_path / "cache"
    value, n = _run(root, cache)
    assert n > 0
    # cached: loaded, nothing compiled; an edit of a kernel it does not import changes nothing
    assert _run(root, cache) == (value, 0)
    _edit(root / "tgmcmc.py")
    assert _run(root, cache) == (value, 0)
    # its callee's file edited: recompiled with the new callee, where numba's own stamp (the
    # caller's file only) loads the old code from a cache of its own
    own = tmp_path / "own"
    assert _run(root, own, numbas_own=True) == (value, n)
    lbeta = "math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)"
    _edit(root / "special.py", f"return {lbeta}", f"return 2.0 * ({lbeta})")
    edited, m = _run(root, cache)
    assert m > 0 and edited == pytest.approx(2.0 * value, rel=1e-12)
    assert _run(root, own, numbas_own=True) == (value, 0)
