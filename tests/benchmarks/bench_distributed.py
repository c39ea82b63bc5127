"""Measured figures of the distributed pipeline (``make bench``; ``-m bench`` only).

* 1,000,000 x 10 records of a 20-cluster full-covariance mixture through the whole ``cluster``
  flow (ingest, passes to convergence, write-out with 1% held out): NMI against the truth, time
  with and without the one-off start of Prefect's temporary server, against scikit-learn's
  ``BayesianGaussianMixture`` (fitted on a 100,000-record sample and extrapolated linearly in N:
  its cost per EM iteration is O(N K d^2) and the number of iterations does not grow with N) and
  ``KMeans(n_init=1)`` on all records; and the speed-up from 1 to 2 workers.
* 10,000,000 x 10 records end to end with the peak memory of all processes together (RSS of
  the process tree, sampled in a thread).
* 1,000,000 x 10 records with ``summaries=1000``: stage 1, the summaries pass and BHC over the
  1,000 summaries (stage 2), with the NMI of the final labels.

The data are generated chunk by chunk into a ``.npy`` memmap, never as one array in memory.
``BENCH_DATA`` (default: a temporary directory) keeps them between runs.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zarr
from numpy.lib.format import open_memmap
from sklearn.metrics import normalized_mutual_info_score

from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench

D, K = 10, 20


def mixture_npy(path: Path, n: int, seed: int = 0, chunk: int = 500_000) -> Path:
    """n x 10 records of a 20-cluster full-covariance Gaussian mixture, written chunk by chunk
    to ``path`` (and the true labels to ``path`` with ``_y``)."""
    ypath = path.with_name(path.stem + "_y.npy")
    if path.exists() and ypath.exists():
        return path
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 6.0, size=(K, D))
    chol = []
    for _ in range(K):
        A = rng.normal(size=(D, D)) / np.sqrt(D)
        chol.append(np.linalg.cholesky(A @ A.T + 0.3 * np.eye(D)))
    w = rng.dirichlet(np.full(K, 5.0))
    X = open_memmap(path, mode="w+", dtype=np.float64, shape=(n, D))
    y = open_memmap(ypath, mode="w+", dtype=np.int64, shape=(n,))
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        r = np.random.default_rng([seed, a])
        yy = r.choice(K, size=b - a, p=w)
        E = r.standard_normal((b - a, D))
        Xc = np.empty((b - a, D))
        for j in range(K):
            m = yy == j
            Xc[m] = means[j] + E[m] @ chol[j].T
        X[a:b] = Xc
        y[a:b] = yy
    X.flush()
    y.flush()
    del X, y
    return path


class PeakRSS:
    """Peak of the summed RSS of this process and all its descendants, sampled in a thread."""

    def __init__(self, every: float = 0.05):
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak = max(self.peak, total)
            time.sleep(self.every)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def data_dir():
    keep = os.environ.get("BENCH_DATA")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
    else:
        with tempfile.TemporaryDirectory(prefix="dpmm-bench-") as d:
            yield Path(d)


@pytest.fixture(scope="module")
def prefect_server():
    """Start Prefect's temporary server once with a trivial flow; yields its start time."""
    from prefect import flow

    @flow
    def noop() -> int:
        return 1

    t0 = time.perf_counter()
    noop()
    return time.perf_counter() - t0


def _run(src: Path, out: Path, **kw: Any) -> tuple[dict[str, Any], float, int]:
    from flows.cluster import run_cluster_flow  # as ``dpmm run`` runs the flow

    with PeakRSS() as mem:
        t0 = time.perf_counter()
        run = run_cluster_flow(input=str(src), out=str(out), overwrite=True, progress=False, **kw)
        wall = time.perf_counter() - t0
    return run, wall, mem.peak


def _nmi(out: Path, ypath: Path) -> float:
    label = zarr.open_array(str(out / "labels.zarr" / "label"))[:]
    return float(normalized_mutual_info_score(np.load(ypath), label))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_1m_end_to_end(data_dir: Path, prefect_server: float) -> None:
    from sklearn.cluster import KMeans
    from sklearn.mixture import BayesianGaussianMixture

    src = mixture_npy(data_dir / "mix1m.npy", 1_000_000)
    ypath = data_dir / "mix1m_y.npy"
    rows = []
    runs = {}
    for engine, workers in (("mapdp", 2), ("kmeans", 2), ("mapdp", 1)):
        run, wall, peak = _run(
            src,
            data_dir / f"out-{engine}-{workers}",
            engine=engine,
            holdout=0.01,
            n_workers=workers,
            dashboard_address=None,
        )
        runs[(engine, workers)] = run
        m = run["metrics"]
        rows.append(
            {
                "what": f"dpmm run --engine {engine}, {workers} workers",
                "seconds": wall,
                "seconds + prefect start": wall + prefect_server,
                "passes": m["passes"],
                "stop": m.get("stop"),
                "clusters": m["n_clusters"],
                "NMI": _nmi(data_dir / f"out-{engine}-{workers}", ypath),
                "held-out log dens": m["heldout_mean_log_density"],
                "peak GB": peak / 1e9,
                "cluster start": run["timing"]["cluster_start"],
                "ingest": run["timing"]["ingest"],
                "sample init": (run.get("init") or {}).get("seconds"),
                "passes s": run["timing"]["passes"],
                "write-out": run["timing"]["write_out"],
            }
        )
    X = np.load(src, mmap_mode="r")
    y = np.load(ypath)
    idx = np.random.default_rng(0).choice(X.shape[0], 100_000, replace=False)
    idx.sort()
    Xs = np.asarray(X[idx])
    t0 = time.perf_counter()
    bgm = BayesianGaussianMixture(n_components=K + 10, covariance_type="full", random_state=0)
    bgm.fit(Xs)
    t_bgm = time.perf_counter() - t0
    rows.append(
        {
            "what": "BayesianGaussianMixture, 100k sample (x10 for 1M)",
            "seconds": 10 * t_bgm,
            "NMI": float(normalized_mutual_info_score(y[idx], bgm.predict(Xs))),
            "passes": bgm.n_iter_,
        }
    )
    Xf = np.asarray(X)
    t0 = time.perf_counter()
    km = KMeans(n_clusters=K, n_init=1, random_state=0).fit(Xf)
    t_km = time.perf_counter() - t0
    rows.append(
        {
            "what": "KMeans(n_init=1), all 1M",
            "seconds": t_km,
            "NMI": float(normalized_mutual_info_score(y, km.labels_)),
        }
    )
    speedup = runs[("mapdp", 1)]["timing"]["passes"] / runs[("mapdp", 2)]["timing"]["passes"]
    speedup_total = rows[2]["seconds"] / rows[0]["seconds"]
    print()
    print(table(rows))
    print(f"prefect temporary server start: {prefect_server:.2f} s")
    print(f"speed-up 1 -> 2 workers: passes {speedup:.2f}x, end to end {speedup_total:.2f}x")
    print(f"BGM (extrapolated) / dpmm mapdp: {10 * t_bgm / rows[0]['seconds']:.1f}x")
    print(f"dpmm mapdp / KMeans: {rows[0]['seconds'] / t_km:.1f}x")
    save(
        "distributed_1m",
        {
            "rows": rows,
            "prefect_start": prefect_server,
            "speedup_passes": speedup,
            "speedup_total": speedup_total,
        },
    )


def test_10m_memory(data_dir: Path, prefect_server: float) -> None:
    src = mixture_npy(data_dir / "mix10m.npy", 10_000_000)
    out = data_dir / "out-10m"
    run, wall, peak = _run(src, out, engine="mapdp", holdout=0.01, dashboard_address=None)
    nmi = _nmi(out, data_dir / "mix10m_y.npy")
    m = run["metrics"]
    print()
    print(
        f"10M x 10: {wall:.1f} s (+{prefect_server:.1f} s Prefect start), peak RSS of the "
        f"process tree {peak / 1e9:.2f} GB, {m['passes']} passes, {m['n_clusters']} clusters, "
        f"NMI {nmi:.4f}, timing {run['timing']}"
    )
    save("distributed_10m", {"seconds": wall, "peak_bytes": peak, "nmi": nmi, "run": run})
    assert peak < 3e9


def test_1m_summaries_stage2(data_dir: Path, prefect_server: float) -> None:
    src = mixture_npy(data_dir / "mix1m.npy", 1_000_000)
    out = data_dir / "out-summaries"
    run, wall, peak = _run(
        src, out, engine="mapdp", holdout=0.01, dashboard_address=None, summaries=1000
    )
    nmi = _nmi(out, data_dir / "mix1m_y.npy")
    m = run["metrics"]
    s2 = run["stage2_info"]
    print()
    print(
        f"1M x 10, --summaries 1000: {wall:.1f} s (+{prefect_server:.1f} s Prefect start), "
        f"{m['n_summaries']} summaries -> {m['n_clusters']} clusters (stage 1: "
        f"{m['n_clusters_stage1']}), NMI {nmi:.4f}, summaries pass "
        f"{run['timing']['summaries']:.2f} s, stage 2 {run['timing']['stage2']:.2f} s, "
        f"peak {peak / 1e9:.2f} GB"
    )
    save(
        "distributed_summaries_1m",
        {
            "seconds": wall,
            "prefect_start": prefect_server,
            "nmi": nmi,
            "n_summaries": m["n_summaries"],
            "n_clusters": m["n_clusters"],
            "timing": run["timing"],
            "stage2_info": s2,
            "peak_bytes": peak,
        },
    )
