"""Fixed costs as a user meets them (issue 13, "Cold start and fixed costs"), one run:

* ``dpmm demo`` in a fresh process with an empty numba cache (every kernel compiles), then warm
  (kernels cached, data and dataset store kept), then warm against a long-lived Prefect server
  (``dpmm server``, ``PREFECT_API_URL``) instead of the temporary server of each command;
* ``dpmm run`` of the 1,000,000 x 10 benchmark in a fresh process, both ways, against
  scikit-learn's ``KMeans(n_init=1)`` on the same data, as ratios.

Run with ``make bench`` (or ``pytest -m bench tests/benchmarks/bench_coldstart.py -s``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from flows.cli.server import free_port, wait_healthy
from tests.benchmarks.bench_distributed import K, mixture_npy
from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench


def _dpmm(args: list[str], env: dict[str, str]) -> float:
    exe = Path(sys.executable).with_name("dpmm")
    t0 = time.perf_counter()
    subprocess.run([str(exe), *args], check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def test_cold_and_warm_start() -> None:
    from sklearn.cluster import KMeans

    with tempfile.TemporaryDirectory(prefix="dpmm-cold-") as d:
        root = Path(d)
        base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
        base["PREFECT_HOME"] = str(root / "prefect")
        cold = {**base, "NUMBA_CACHE_DIR": str(root / "numba")}
        rows = []
        demo = ["demo", "--out", str(root / "demo"), "--quiet"]
        rows.append({"what": "dpmm demo, empty numba cache", "seconds": _dpmm(demo, cold)})
        rows.append({"what": "dpmm demo, warm", "seconds": _dpmm(demo, cold)})
        src = mixture_npy(root / "mix1m.npy", 1_000_000)
        run = ["run", str(src), "--out", str(root / "out"), "--holdout", "0.01"]
        run += ["--overwrite", "--quiet", "--data-dir", str(root / "datasets")]
        # the dataset store is kept between the runs: a scheduled refit reuses it too; the
        # first run ingests
        t_first = _dpmm(run, cold)
        t_run = _dpmm(run, cold)
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
            t_demo_served = _dpmm(demo, served)
            t_run_served = _dpmm(run, served)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
        X = np.load(src)
        km = []
        for _ in range(3):
            t0 = time.perf_counter()
            KMeans(n_clusters=K, n_init=1, random_state=0).fit(X)
            km.append(time.perf_counter() - t0)
        t_km = float(np.median(km))
    rows.append({"what": "dpmm demo, warm, long-lived server", "seconds": t_demo_served})
    rows.append({"what": "dpmm run 1M, fresh process, first (ingests)", "seconds": t_first})
    rows.append({"what": "dpmm run 1M, fresh process", "seconds": t_run, "x KMeans": t_run / t_km})
    rows.append(
        {
            "what": "dpmm run 1M, fresh process, long-lived server",
            "seconds": t_run_served,
            "x KMeans": t_run_served / t_km,
        }
    )
    rows.append({"what": "KMeans(n_init=1), 1M", "seconds": t_km, "x KMeans": 1.0})
    print()
    print(table(rows))
    save("coldstart", {"rows": rows})
