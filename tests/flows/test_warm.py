"""How many kernels a first fit of each kind of table compiles (issue 56), and ``dpmm warm``.

A first ``MAPDP().fit(X).predict(X)`` in a fresh process asks numba for a few entry points
(kernels called from Python), each compiled with every kernel it calls, or loaded from the cache
whole: their number, the same with an empty cache or a full one, is what a first fit costs, and
a change that adds entries or specialisations shows here (docs/performance.md states the
figures). A second process then compiles nothing: every kernel it needs was cached.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.cli import build_parser
from tests import prefect_db
from tests.conftest import AT_THE_CALL, COUNT_ONLY, RECORD_COMPILES

_COUNT = (
    RECORD_COMPILES
    + """
import json, sys
import numpy as np, pandas as pd
from numba.core.dispatcher import Dispatcher
from pipeline import MAPDP

entries, depth = set(), [0]
_compile = Dispatcher.compile


def compile(self, sig):
    # a request from Python only: typing a caller's call comes inside that caller's compile
    if depth[0] == 0 and tuple(sig) not in self.overloads:
        entries.add((self.py_func.__qualname__, str(sig)))
    depth[0] += 1
    try:
        return _compile(self, sig)
    finally:
        depth[0] -= 1


Dispatcher.compile = compile
rng = np.random.default_rng(0)
g = rng.normal(size=(200, 3)) + 3.0 * rng.integers(0, 3, 200)[:, None]
cat = np.array(list("xyz"))[rng.integers(0, 3, (200, 3))]
tables = {
    "gaussian": g,
    "binary": g > 2.0,
    "categorical": cat,
    "mixed": {"g": g[:, 0], "c": cat[:, 0]},
}
out = {}
for kind in sys.argv[1:]:
    X = pd.DataFrame(tables[kind])
    MAPDP(random_state=0).fit(X).predict(X)
    out[kind] = len(entries)
names = sorted({name for name, _ in signatures})
print(json.dumps(
    {"entries": out, "compiled": len(compiled), "names": names, "again": compiled_again()}
))
"""
)

# the entry points a first fit and prediction of each table asks for (docs/performance.md); a
# table of several Gaussian columns fits the diagonal family too, for the held-out choice of its
# covariance (``Schema.choose_structure``), on the same int32 spec: no entries of its own
MAX_ENTRIES = dict.fromkeys(["gaussian", "binary", "categorical", "mixed"], 9)


def _first_fit(*kinds: str, cache: Path | None = None) -> dict:
    """What a first fit and prediction of each table of ``kinds`` in a fresh process asks numba
    for (with its own numba ``cache`` directory if given)."""
    env = {**os.environ, **({"NUMBA_CACHE_DIR": str(cache), **COUNT_ONLY} if cache else {})}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COUNT), *kinds],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        env=env,
    )
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_first_fit_compiles_few_kernels_and_a_second_process_none() -> None:
    for kind, limit in MAX_ENTRIES.items():
        # a fresh process per table: what a user's first fit of such a table asks for
        entries = _first_fit(kind)["entries"][kind]
        assert 0 < entries <= limit, (kind, entries)
    # the cache now holds every kernel those fits compiled: loaded, none compiled again
    assert _first_fit(*MAX_ENTRIES)["compiled"] == 0


# what a first fit of the binary table compiles with an empty cache, every kernel it calls
# included (docs/performance.md: 148 on 2026-11-29, 162 before the int64 kernels dropped the
# Normal-Wishart fast paths)
MAX_COMPILED_BINARY = 150
FAST_PATHS = [
    "kernels.obs.gaussian_nw.block_quad_forms",
    "kernels.obs.gaussian_nw.pack_columns",
    "kernels.obs.gaussian_nw.packed_log_predictive_bounds",
    "kernels.obs.gaussian_nw.restore_factor",
    "kernels.obs.gaussian_nw.merged_logdet_lower",
    "kernels.partition._keep_factor",
]


@pytest.mark.slow
def test_a_first_fit_of_a_binary_table_compiles_no_normal_wishart_fast_path(tmp_path: Path) -> None:
    # an empty cache: every kernel the fit needs is compiled, and seen, here
    got = _first_fit("binary", cache=tmp_path / "numba")
    assert got["compiled"] <= MAX_COMPILED_BINARY
    # the int64 kernels dispatch over every family, the Normal-Wishart's included (the probe
    # sees its kernels), but a spec of any family never takes the packed or bounded paths
    assert "kernels.obs.gaussian_nw.refresh" in got["names"]
    assert [f for f in FAST_PATHS if f in got["names"]] == []
    # and no kernel twice for the literal values a caller's variable starts from
    assert set(got["again"]) <= AT_THE_CALL, got["again"]


def test_warm_is_a_command() -> None:
    args = build_parser().parse_args(["warm"])
    assert args.func.__name__ == "cmd_warm"


def _alembic_version(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return [v for (v,) in con.execute("SELECT version_num FROM alembic_version")]


@pytest.mark.slow
def test_warm_creates_prefects_database_unless_an_api_is_configured(tmp_path: Path) -> None:
    """``dpmm warm`` starts the commands' temporary Prefect server once, so that the database a
    machine's first command would create is there, at Prefect's last migration: the suite's
    template is what it leaves (``tests.prefect_db``). With an API configured the commands use
    that server's database, and none is made."""
    from alembic.script import ScriptDirectory
    from prefect.server import database

    steps = Path(database.__file__).parent / "_migrations"
    sqlite = ScriptDirectory(str(steps), version_locations=[str(steps / "versions" / "sqlite")])
    assert _alembic_version(prefect_db.template()) == list(sqlite.get_heads())
    home = tmp_path / "configured"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(PREFECT_HOME=str(home), PREFECT_API_URL="http://127.0.0.1:9/api")
    subprocess.run([sys.executable, "-c", prefect_db.WARM_PREFECT_ONLY], env=env, check=True)
    assert not (home / prefect_db.DATABASE).exists()


# a first fit and prediction of a Gaussian table in a fresh process: what it compiled, where its
# kernels came from, and its labels
_SHIPPED_FIT = (
    RECORD_COMPILES
    + """
import json
import numpy as np
import kernels
from pipeline import MAPDP

rng = np.random.default_rng(0)
X = rng.normal(size=(200, 3)) + 3.0 * rng.integers(0, 3, 200)[:, None]
m = MAPDP(random_state=0).fit(X)
out = {"compiled": compiled, "again": compiled_again(), "kernels": kernels.__file__}
out["labels"] = m.predict(X).tolist()
print(json.dumps(out))
"""
)


def _shipped_fit(where: Path, cwd: Path, **env: str) -> dict:
    """``_SHIPPED_FIT`` in a fresh process importing the package from ``where``."""
    full = {k: v for k, v in os.environ.items() if k != "DPMM_SHIPPED_KERNELS"}
    full.update(PYTHONPATH=str(where), **env)
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SHIPPED_FIT)],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        env=full,
    )
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_wheel_ships_its_kernels_compiled_and_its_install_compiles_none(tmp_path: Path) -> None:
    from kernels._cache import PORTABLE_ENV

    repo = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "_compiled", "*.nbi", "*.nbc")
    for name in ("pipeline", "kernels", "flows"):
        shutil.copytree(repo / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    # what `dpmm warm --portable` does for every engine, for this one fit: compiled for any
    # CPU into the copy's kernels/_compiled, and nothing into the numba cache
    build_cache = tmp_path / "build-cache"
    built = _shipped_fit(src, tmp_path, NUMBA_CACHE_DIR=str(build_cache), **PORTABLE_ENV)
    assert built["compiled"] and built["kernels"] == str(src / "kernels" / "__init__.py")
    assert set(built["again"]) <= AT_THE_CALL, built["again"]
    assert not list(build_cache.rglob("*.nbi"))
    assert list((src / "kernels" / "_compiled").rglob("*.nbi"))
    dist = tmp_path / "dist"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "build", "-q", "--wheel", "--out-dir", dist, src], check=True)
    (wheel,) = dist.glob("*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--python",
            sys.executable,
            "--target",
            site,
            wheel,
        ],
        check=True,
    )
    # a fresh install elsewhere, with an empty cache of its own: the fit loads every kernel
    user_cache = tmp_path / "user-cache"
    got = _shipped_fit(site, tmp_path, NUMBA_CACHE_DIR=str(user_cache))
    assert got["kernels"] == str(site / "kernels" / "__init__.py")
    assert got["compiled"] == []
    assert got["labels"] == built["labels"]
    assert not list(user_cache.rglob("*.nbi"))


def test_compiling_the_shipped_kernels_needs_the_portable_cpu() -> None:
    env = {**os.environ, "DPMM_SHIPPED_KERNELS": "1"}
    env.pop("NUMBA_CPU_NAME", None)
    res = subprocess.run(
        [sys.executable, "-c", "import kernels"], capture_output=True, text=True, env=env
    )
    assert res.returncode != 0
    assert "NUMBA_CPU_NAME=generic" in res.stderr.splitlines()[-1]
