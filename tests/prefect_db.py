"""Prefect databases for the tests: one created and migrated once, copied into every new home.

A Prefect server that finds no database under ``PREFECT_HOME`` creates one and runs every
migration, which triples its start (on a 2-core machine 21 s against 8 s, most of it CPU). The
suite starts some twenty servers in homes of their own: the test harness of each test process
(``tests/flows/conftest.py``), the commands of each process (``tests/conftest.py``) and the
tests of the servers, the security watch and the program's exit status. Each now starts from a
copy of ``template()``: the database ``dpmm warm`` leaves, the one a machine's first command
would make (the commands' temporary server, started and stopped once), kept under ``out/`` for
the installed Prefect's version and the code that made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the file Prefect's default connection URL names under ``PREFECT_HOME``
DATABASE = "prefect.db"
#: ``dpmm warm`` with its compiling processes doing nothing: what it leaves under PREFECT_HOME is
#: the database a machine's first command would have made (its temporary server, started once)
WARM_PREFECT_ONLY = """
import sys
from flows.cli import main, warm
warm._WARM = "pass"
sys.exit(main(["warm"]))
"""
#: the code that makes the template: a change of it makes a new one
MAKERS = ("flows/cli/warm.py", "flows/cli/prefect_api.py")


def copy_database(src: Path, dst: Path) -> None:
    """Copy the SQLite database ``src`` to ``dst`` as one consistent file (SQLite's backup,
    which also takes what a write-ahead log still holds)."""
    if not src.is_file():  # connecting would make an empty one
        raise FileNotFoundError(f"no database at {src}")
    with (
        contextlib.closing(sqlite3.connect(src)) as a,
        contextlib.closing(sqlite3.connect(dst)) as b,
    ):
        a.backup(b)


def template() -> Path:
    """The migrated database of the installed Prefect, created on first use (by one process
    at a time: the others wait for it, as the test processes of ``pytest -n 3`` would)."""
    made_by = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in MAKERS)).hexdigest()
    version = f"{importlib.metadata.version('prefect')}-{made_by[:12]}"
    keep = ROOT / "out" / f"prefect-template-{version}"
    db = keep / DATABASE
    if db.exists():
        return db
    keep.parent.mkdir(parents=True, exist_ok=True)
    with open(keep.parent / f".prefect-template-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if db.exists():
            return db
        tmp = Path(tempfile.mkdtemp(dir=keep.parent, prefix=".prefect-template-"))
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
            env.update(
                PREFECT_HOME=str(tmp / "home"),
                PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
            )
            subprocess.run(
                [sys.executable, "-c", WARM_PREFECT_ONLY],
                env=env,
                cwd=ROOT,
                check=True,
                timeout=900,
            )
            (tmp / "db").mkdir()
            copy_database(tmp / "home" / DATABASE, tmp / "db" / DATABASE)
            # whole or not at all: a process that finds the folder finds the database complete
            (tmp / "db").rename(keep)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return db


def new_home(path: Path) -> str:
    """``path`` made a ``PREFECT_HOME`` whose database is a copy of ``template()``; returned as
    a string, for an environment."""
    path.mkdir(parents=True, exist_ok=True)
    copy_database(template(), path / DATABASE)
    return str(path)


def harness_dir() -> str:
    """A new directory holding a copy of ``template()`` under the name Prefect's test harness
    gives its database (``prefect_test_harness``, which makes it in such a directory)."""
    d = tempfile.mkdtemp(prefix="dpmm-tests-harness-")
    copy_database(template(), Path(d) / "prefect-test.db")
    return d
