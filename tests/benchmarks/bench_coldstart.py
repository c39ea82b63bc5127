"""Fixed costs as a user meets them (issue 13, "Cold start and fixed costs"), one run:

* ``dpmm demo`` in a fresh process with an empty numba cache (every kernel compiles), as a
  machine's first command (which also creates Prefect's database) and as a later one, then warm
  (kernels cached, data and dataset store kept); both with the demo's default workers (threads
  of the command's process) and with ``--no-threads`` (worker processes), each from its own
  empty cache; then warm against a long-lived Prefect server (``dpmm server``,
  ``PREFECT_API_URL``) instead of the temporary server each command starts;
* ``dpmm run`` of the 1,000,000 x 10 benchmark in a fresh process, with worker processes (the
  default) and ``--threads``, both ways, against scikit-learn's ``KMeans(n_init=1)`` on the
  same data, as ratios.

Each row is the median of ``REPEAT`` runs (one for the cold ones) with the CPU seconds of the
command and its descendants (user + system; the worker processes a fork server forked too):
on 2 cores the fixed costs are CPU-bound.
Run with ``make bench`` (or ``pytest -m bench tests/benchmarks/bench_coldstart.py -s``).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flows.cli.server import free_port, wait_healthy
from tests.benchmarks.bench_distributed import K, mixture_npy
from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench


REPEAT = 3


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux ``prctl``), so that the
    CPU of the worker processes a fork server forked, which are no children of the command and
    outlive it by a moment, is counted too (``_reap_orphans``)."""
    import ctypes

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(quiet_for: float = 0.5) -> None:
    """Wait for the orphans a command left (its fork server and workers, which exit when it
    has), until none has exited for ``quiet_for`` seconds; children still running (the
    long-lived server) are left alone."""
    last = time.perf_counter()
    while time.perf_counter() - last < quiet_for:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            last = time.perf_counter()
        else:
            time.sleep(0.02)


def _dpmm(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the command and its descendants) of one ``dpmm`` command."""
    exe = Path(sys.executable).with_name("dpmm")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([str(exe), *args], check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _row(what: str, args: list[str], env: dict[str, str], repeat: int = REPEAT) -> dict[str, Any]:
    runs = [_dpmm(args, env) for _ in range(repeat)]
    wall = float(np.median([w for w, _ in runs]))
    cpu = float(np.median([c for _, c in runs]))
    return {"what": what, "seconds": wall, "cpu_seconds": cpu, "runs": [w for w, _ in runs]}


def test_cold_and_warm_start() -> None:
    from sklearn.cluster import KMeans

    _adopt_orphans()
    with tempfile.TemporaryDirectory(prefix="dpmm-cold-") as d:
        root = Path(d)
        base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
        base["PREFECT_HOME"] = str(root / "prefect")
        cold = {**base, "NUMBA_CACHE_DIR": str(root / "numba")}
        cold_procs = {**base, "NUMBA_CACHE_DIR": str(root / "numba-procs")}
        rows = []
        demo = ["demo", "--out", str(root / "demo"), "--quiet"]
        procs = [*demo, "--no-threads"]
        # a machine's first command also creates Prefect's database (its migrations: about 5
        # CPU s more in the temporary server); the next one with an empty numba cache finds it
        first = "dpmm demo, empty numba cache, new Prefect database"
        rows.append(_row(first, demo, cold, 1))
        again = {**base, "NUMBA_CACHE_DIR": str(root / "numba-again")}
        rows.append(_row("dpmm demo, empty numba cache", demo, again, 1))
        rows.append(_row("dpmm demo, warm", demo, cold))
        rows.append(_row("dpmm demo --no-threads, empty numba cache", procs, cold_procs, 1))
        rows.append(_row("dpmm demo --no-threads, warm", procs, cold_procs))
        src = mixture_npy(root / "mix1m.npy", 1_000_000)
        run = ["run", str(src), "--out", str(root / "out"), "--holdout", "0.01"]
        run += ["--overwrite", "--quiet", "--data-dir", str(root / "datasets")]
        # the dataset store is kept between the runs: a scheduled refit reuses it too; the
        # first run ingests
        rows.append(_row("dpmm run 1M, fresh process, first (ingests)", run, cold, 1))
        rows.append(_row("dpmm run 1M, fresh process", run, cold))
        rows.append(_row("dpmm run 1M --threads, fresh process", [*run, "--threads"], cold))
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("dpmm")), "server", "--port", str(port)],
            env=base,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_healthy(api, 300, server)
            served = {**cold, "PREFECT_API_URL": api}
            _dpmm(demo, served)  # the server's first flow run creates its records
            rows.append(_row("dpmm demo, warm, long-lived server", demo, served))
            rows.append(_row("dpmm run 1M, long-lived server", run, served))
            rows.append(
                _row("dpmm run 1M --threads, long-lived server", [*run, "--threads"], served)
            )
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=90)
        X = np.load(src)
        km = []
        for _ in range(3):
            t0 = time.perf_counter()
            KMeans(n_clusters=K, n_init=1, random_state=0).fit(X)
            km.append(time.perf_counter() - t0)
        t_km = float(np.median(km))
    for r in rows:
        if "1M" in r["what"]:
            r["x KMeans"] = r["seconds"] / t_km
    rows.append({"what": "KMeans(n_init=1), 1M", "seconds": t_km, "x KMeans": 1.0})
    print()
    print(table([{k: v for k, v in r.items() if k != "runs"} for r in rows]))
    save("coldstart", {"rows": rows})
