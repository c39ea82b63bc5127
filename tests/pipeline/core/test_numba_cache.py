"""``pipeline.numba_cache_dir``: without a ``NUMBA_CACHE_DIR`` of the user's, ``import pipeline``
points numba at a cache named after the kernels' sources, so that an edit of one kernel file
can never leave a stale compiled caller in use (numba checks only a function's own file)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kernels
from pipeline import numba_cache_dir

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


def _source_hash(root: Path) -> str:
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def test_the_cache_is_named_after_the_kernel_sources(tmp_path: Path) -> None:
    env_dir, numba_dir = _probe({"XDG_CACHE_HOME": str(tmp_path)})
    assert env_dir == numba_dir
    root = Path(kernels.__file__).parent
    assert Path(env_dir).name == f"numba-{_source_hash(root)}"
    assert Path(env_dir).is_dir()


def test_an_edited_kernel_gets_another_cache(tmp_path: Path) -> None:
    """A copy of the kernels, then the same copy with one file edited."""
    copy = tmp_path / "kernels"
    shutil.copytree(
        Path(kernels.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    before = numba_cache_dir(copy)
    assert before is not None and before.parent == copy / "__pycache__"
    assert before.name == f"numba-{_source_hash(copy)}"
    target = copy / "obs" / "gaussian_nw.py"
    target.write_text(target.read_text() + "\n# edited\n")
    after = numba_cache_dir(copy)
    assert after is not None and after.parent == before.parent and after != before


def test_a_cache_the_user_chose_is_kept(tmp_path: Path) -> None:
    mine = str(tmp_path / "mine")
    assert _probe({"NUMBA_CACHE_DIR": mine}, unset=False) == [mine, mine]
