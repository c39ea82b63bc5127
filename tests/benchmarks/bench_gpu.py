"""Measured figures of the GPU engines (``make bench-gpu``; ``-m bench`` only): for a machine with
an NVIDIA GPU and the GPU extra installed, no network needed; it installs nothing.

* The fused pass on the card (``kernels.cuda_mapdp``: the parallel assignment against K = 20
  frozen clusters plus a new one, then the statistics of the moved records) over 1M, 10M and
  100M x 10 resident float32 records: milliseconds and records per second, the labels copied
  back included. Goal at 100M: under 60 ms.
* One pass of the engine through the pass loop, everything it does included (labels read from
  and written to the run's state store, the host's step, the reduce), on the same store and the
  same start for ``device="cpu"`` (a LocalCluster of one worker per core) and ``device="gpu"``
  (one worker per GPU): seconds of the best pass and records per second, per size.
* ``dpmm run --device gpu`` end to end (the flow as the command runs it): time, passes, NMI
  against the truth, peak host memory (RSS of the process tree) and the card's memory in use
  at the end of the passes.

Sizes: ``BENCH_GPU_SIZES`` (records, comma separated; default 1M,10M,100M for the kernels,
the engine and the end-to-end run take the sizes up to ``BENCH_GPU_RUN_MAX``, default 10M);
under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the default is 2,000 records, to
check that the script runs. A part whose next size would pass the time budget
(``BENCH_GPU_BUDGET_S``, default 420 s for the whole module) is skipped and says so.
Results go to ``bench-results/gpu.json`` with the card's name.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.benchmarks.common import PeakSampler, save, table

pytestmark = pytest.mark.bench

D, K = 10, 20
SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
T0 = time.perf_counter()
BUDGET = float(os.environ.get("BENCH_GPU_BUDGET_S", "420"))
RESULTS: dict[str, Any] = {}


def sizes() -> list[int]:
    raw = os.environ.get("BENCH_GPU_SIZES", "2000" if SIM else "1000000,10000000,100000000")
    return [int(float(s)) for s in raw.split(",") if s]


def run_sizes() -> list[int]:
    cap = int(float(os.environ.get("BENCH_GPU_RUN_MAX", "1e7")))
    return [n for n in sizes() if n <= cap] or sizes()[:1]


def left() -> float:
    return BUDGET - (time.perf_counter() - T0)


def card() -> str:
    from kernels.cuda_device import import_cuda, simulated

    if simulated():
        return "numba CUDA simulator (no GPU)"
    name = import_cuda().get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


class DevicePeak(PeakSampler):
    """Peak of the card's memory in use (total - free, every process's), sampled in a thread;
    0 under the simulator."""

    def sample(self) -> int:
        from kernels.cuda_device import memory

        free, total = memory()
        return int(total - free)


def mixture(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n x D float32 records of a K-cluster full-covariance mixture and their labels."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 6.0, size=(K, D))
    chol = [
        np.linalg.cholesky(np.cov(rng.normal(size=(D, 3 * D))) + 0.3 * np.eye(D)) for _ in range(K)
    ]
    y = rng.integers(0, K, n)
    X = np.empty((n, D), dtype=np.float32)
    step = 2_000_000
    for a in range(0, n, step):
        b = min(a + step, n)
        E = rng.standard_normal((b - a, D))
        for j in range(K):
            m = y[a:b] == j
            X[a:b][m] = means[j] + E[m] @ chol[j].T
    return X, y


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    RESULTS["card"] = card()
    print(f"\ncard: {RESULTS['card']}")
    print(f"saved {save('gpu', RESULTS)}")


def test_fused_pass_on_the_card() -> None:
    """The two kernels of a pass over resident records, K = 20 frozen clusters."""
    from kernels import cuda_mapdp as cm
    from kernels.cuda_device import import_cuda
    from pipeline.families import GaussianNW

    cuda = import_cuda()
    rows = []
    for n in sizes():
        if left() < 60:
            rows.append({"records": n, "skipped": "time budget"})
            continue
        X, y = mixture(n)
        sample = X[: min(n, 200_000)].astype(np.float64)
        fam = GaussianNW.empirical_bayes(sample).as_product()
        stats = fam.stats_of(sample, y[: sample.shape[0]], K)
        stats[:, :] *= n / sample.shape[0]  # sizes and sums of all n records (about)
        P = cm.pack(fam.cache_of(stats), stats[:, 0].copy(), K, fam.empty_cache(), fam.prior, D)
        z_old = y.astype(np.int32)
        z_old[::100] = (z_old[::100] + 1) % K  # 1% of the records start in another cluster
        dX = cm.to_device(X)
        dtrain = cm.to_device(np.ones(n, dtype=np.uint8))
        times = []
        for rep in range(4):  # the first compiles
            cuda.synchronize()
            t0 = time.perf_counter()
            z, dz_old, dz_new = cm.assign(dX, dtrain, z_old, P, K, math.log(1.0), False)
            t1 = time.perf_counter()
            delta = cm.label_deltas(dX, dz_old, dz_new, K)
            cuda.synchronize()
            t2 = time.perf_counter()
            if rep:
                times.append((t1 - t0, t2 - t1, t2 - t0))
        a, s, tot = (float(np.median([t[i] for t in times])) for i in range(3))
        moved = int(np.count_nonzero(z != z_old))
        rows.append(
            {
                "records": n,
                "assign ms": 1e3 * a,
                "statistics ms": 1e3 * s,
                "pass ms": 1e3 * tot,
                "records/s": n / tot,
                "moved": moved,
                "n of delta": float(abs(delta[:, 0]).sum()),
            }
        )
        del dX, dtrain
    RESULTS["fused pass"] = rows
    print("\n" + table(rows))


def _store(n: int, root: Path, client: Any) -> tuple[Any, Any, np.ndarray]:
    from pipeline.data.ingest import ingest
    from pipeline.data.store import Store

    X, y = mixture(n, seed=1)
    store = Store(root / f"data-{n}")
    info = ingest(X.astype(np.float64), store, client=client, chunk_rows=min(n, 1_000_000))
    return store, info, y


def test_one_engine_pass_cpu_and_gpu_side_by_side() -> None:
    """The best of 3 passes of each engine through the pass loop, same store and start."""
    from pipeline.core.config import FitParams
    from pipeline.distributed import loop
    from pipeline.distributed.client import dask_client

    rows = []
    with tempfile.TemporaryDirectory(prefix="dpmm-bench-gpu-") as d:
        root = Path(d)
        for n in run_sizes():
            if left() < 120:
                rows.append({"records": n, "skipped": "time budget"})
                continue
            with dask_client(dashboard_address=None, quiet=True) as client:
                store, info, _ = _store(n, root, client)
            for device in ("cpu", "gpu"):
                params = FitParams(
                    engine="mapdp", seed=0, max_passes=3, tol=0.0, min_change=0.0, device=device
                ).checked()
                n_workers = 2 if (SIM and device == "cpu") else None
                with dask_client(
                    dashboard_address=None, quiet=True, device=device, n_workers=n_workers
                ) as client:
                    ctx = loop.context(store, root / f"state-{n}-{device}", info, params)
                    state: Any = loop.run_passes(client, ctx, resume=False)
                best = min(h["seconds"] for h in state.history)
                rows.append(
                    {
                        "records": n,
                        "device": device,
                        "best pass s": best,
                        "records/s": n / best,
                        "passes": state.pass_no,
                        "clusters": state.n_clusters,
                        "fallbacks": sum(h.get("fallbacks", 0) for h in state.history),
                    }
                )
    RESULTS["engine pass"] = rows
    print("\n" + table(rows))


def test_dpmm_run_device_gpu_end_to_end() -> None:
    """``dpmm run --device gpu`` as the command runs the flow."""
    import zarr
    from sklearn.metrics import normalized_mutual_info_score

    from flows.cluster import run_cluster_flow
    from tests.benchmarks.bench_distributed import PeakRSS

    rows = []
    with tempfile.TemporaryDirectory(prefix="dpmm-bench-gpu-run-") as d:
        root = Path(d)
        for n in run_sizes():
            if left() < 120:
                rows.append({"records": n, "skipped": "time budget"})
                continue
            X, y = mixture(n, seed=2)
            src = root / f"x{n}.npy"
            np.save(src, X.astype(np.float64))
            del X
            for rep, what in enumerate(("with ingest", "store ingested")):
                out = root / f"out-{n}-{rep}"
                with PeakRSS() as mem, DevicePeak() as dev:
                    t0 = time.perf_counter()
                    run = run_cluster_flow(
                        input=str(src),
                        out=str(out),
                        overwrite=True,
                        progress=False,
                        report=False,
                        device="gpu",
                        dashboard_address=None,
                        data_dir=str(root / "datasets"),
                        chunk_rows=min(n, 1_000_000),
                    )
                    wall = time.perf_counter() - t0
                label = zarr.open_array(str(out / "labels.zarr" / "label"))[:]
                t = run["timing"]
                rows.append(
                    {
                        "records": n,
                        "run": what,
                        "seconds": wall,
                        "ingest s": t["ingest"],
                        "passes + write-out s": t["passes"] + t["write_out"],
                        "passes": run["metrics"]["passes"],
                        "NMI": float(normalized_mutual_info_score(y, label)),
                        "peak host GiB": mem.peak / 2**30,
                        "peak card GiB": dev.peak / 2**30,
                    }
                )
    RESULTS["dpmm run --device gpu"] = rows
    print("\n" + table(rows))
