"""The GPU engines under numba's CUDA simulator: collected only by
``test_gpu_engine.test_under_the_cuda_simulator``, which runs this file in a process of its own
with ``NUMBA_ENABLE_CUDASIM=1`` (the variable is read when numba is imported, and a simulated
``numba.cuda`` in the main test process would stay there for every later test).

Each kernel against a NumPy reference of the same parallel step on tiny data (labels exact,
statistics to 1e-6 relative), and the engine contract for both GPU engines on an eighth of the
contract's records (the simulator runs every CUDA thread as a Python thread).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("runs under NUMBA_ENABLE_CUDASIM=1 only", allow_module_level=True)

from kernels import cuda_mapdp as cm
from kernels.obs import gaussian_nw
from pipeline.distributed import loop
from pipeline.engines import get_engine, gpu
from pipeline.engines.base import RunContext
from pipeline.families import GaussianNW
from tests.engine_contract import EngineContract, blobs


def problem(seed: int, n: int = 96, d: int = 3, K: int = 4, cells: bool = False) -> Any:
    """Records (float32 values as float64), a family, labels with every kind of record: in a
    cluster, in none (-1), alone in a cluster, far from every cluster (a new one)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 5.0, (K, d))[rng.integers(0, K, n)] + rng.normal(size=(n, d))
    # far away, each in its own direction
    X[0, 0] += 100.0
    X[1, 1 % d] += 100.0
    X[2, 1 % d] -= 100.0
    if cells:
        X = np.round(X)
    X = X.astype(np.float32).astype(np.float64)
    fam = GaussianNW.empirical_bayes(X).as_product()
    z = rng.integers(-1, K, n).astype(np.int64)
    z[3 : 3 + K - 1] = np.arange(K - 1)
    z[z == K - 1] = 0
    z[0] = K - 1  # far away and alone in its cluster
    z[1:3] = -1
    stats = fam.stats_of(X, z, K)
    return X, fam, z, stats


def reference_assign(X, fam, z, stats, train, log_alpha):
    """The parallel step in NumPy over the CPU kernels' predictives (``gaussian_nw``): every
    training record against the frozen clusters; K: a new cluster."""
    K = stats.shape[0]
    cache = fam.cache_of(stats)
    nk = stats[:, 0]
    empty_s, empty_c = np.zeros(stats.shape[1]), fam.empty_cache()
    out = z.copy()
    for i in np.flatnonzero(train):
        x, k0 = X[i], z[i]
        costs = np.full(K + 1, np.inf)
        for k in range(K):
            if k == k0:
                if nk[k] - 1.0 > 0.5:
                    loo = gaussian_nw.log_predictive_loo(x, stats[k], cache[k], fam.prior, True)
                    costs[k] = -loo - math.log(nk[k] - 1.0)
            elif nk[k] > 0:
                costs[k] = -gaussian_nw.log_predictive(x, stats[k], cache[k], fam.prior) - math.log(
                    nk[k]
                )
        costs[K] = -gaussian_nw.log_predictive(x, empty_s, empty_c, fam.prior) - log_alpha
        best = int(np.argmin(costs))
        if best == K and k0 >= 0 and nk[k0] == 1.0:
            best = k0
        out[i] = best
    return out


@pytest.mark.parametrize("cells", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_assign_and_label_deltas_equal_numpy(seed: int, cells: bool) -> None:
    X, fam, z, stats = problem(seed, cells=cells)
    K, d = stats.shape[0], X.shape[1]
    assert bool(gaussian_nw.has_cells(fam.prior, d)) == cells
    rng = np.random.default_rng(seed + 10)
    train = rng.random(X.shape[0]) < 0.9
    train[:3] = True
    log_alpha = math.log(0.7)
    P = cm.pack(fam.cache_of(stats), stats[:, 0].copy(), K, fam.empty_cache(), fam.prior, d)
    dX = cm.to_device(X.astype(np.float32))
    got, dz_old, dz_new = cm.assign(
        dX, cm.to_device(train.astype(np.uint8)), z.astype(np.int32), P, K, log_alpha, cells
    )
    ref = reference_assign(X, fam, z, stats, train, log_alpha)
    np.testing.assert_array_equal(got, ref)
    assert (got[1:3] == K).all()  # far, in no cluster: a new one
    assert got[0] == K - 1  # far and alone: it stays
    assert (got[~train] == z[~train]).all()
    # the statistics of the moves between frozen clusters
    delta = cm.label_deltas(dX, dz_old, dz_new, K)
    want = np.zeros_like(delta)
    moved = np.flatnonzero((got != z) & (got < K))
    assert moved.size > 0
    ones = np.ones(X.shape[0], dtype=np.int64)
    for i in moved:
        s = fam.stats_of(X[i : i + 1], ones[:1] * 0, 1)[0]
        if z[i] >= 0:
            want[z[i]] -= s
        want[got[i]] += s
    np.testing.assert_allclose(delta, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_label_deltas_over_several_tiles_and_blocks() -> None:
    """More records than one tile (``TILE``) with the blocks' partials added in order."""
    rng = np.random.default_rng(3)
    n, d, K = 2 * cm.TILE + 17, 2, 3
    X = rng.normal(size=(n, d)).astype(np.float32)
    z_old = rng.integers(-1, K, n).astype(np.int32)
    z_new = rng.integers(0, K + 2, n).astype(np.int32)
    delta = cm.label_deltas(cm.to_device(X), cm.to_device(z_old), cm.to_device(z_new), K)
    Xd = X.astype(np.float64)
    want = np.zeros_like(delta)
    for i in np.flatnonzero((z_old != z_new) & (z_new < K)):
        s = np.concatenate([[1.0], Xd[i], np.outer(Xd[i], Xd[i]).ravel()])
        if z_old[i] >= 0:
            want[z_old[i]] -= s
        want[z_new[i]] += s
    np.testing.assert_allclose(delta, want, rtol=1e-6, atol=1e-9)


class GpuContract(EngineContract):
    """The contract on an eighth of its records (the simulator is slow)."""

    device = "gpu"

    def context(
        self, client: Any, tmp: Path, name: str, n: int = 1200, chunk_rows: int = 300, **kw: Any
    ) -> RunContext:
        return super().context(client, tmp, name, n // 8, chunk_rows // 8, **kw)


class TestMapdpGpuEngine(GpuContract):
    engine = "mapdp"


class TestKmeansGpuEngine(GpuContract):
    engine = "kmeans"
    init = "seeds"


def test_records_stay_on_the_card_and_the_fit_matches_the_cpu(client, tmp_path: Path) -> None:
    """After the first pass the chunks are resident; the clusters equal the CPU engine's on
    well separated blobs (same number, labels equal up to renaming)."""
    from pipeline.core.config import FitParams
    from pipeline.data.ingest import ingest
    from pipeline.data.store import Store

    store = Store(tmp_path / "data")
    info = ingest(blobs(240, seed=7), store, client=client, chunk_rows=80, holdout=0.0)
    labels = {}
    for device in ("cpu", "gpu"):
        params = FitParams(engine="mapdp", init="sequential", seed=1, device=device).checked()
        ctx = loop.context(store, tmp_path / f"state-{device}", info, params)
        state: Any = loop.run_passes(client, ctx)
        assert get_engine("mapdp", device).name == ("mapdp-gpu" if device == "gpu" else "mapdp")
        from pipeline.engines.mixture_state import read_labels

        labels[device] = read_labels(ctx, state)
    assert len(gpu._RESIDENT) >= 3
    from sklearn.metrics import normalized_mutual_info_score

    assert len(set(labels["gpu"])) == len(set(labels["cpu"]))
    assert normalized_mutual_info_score(labels["cpu"], labels["gpu"]) > 0.99


def test_a_store_beyond_the_resident_budget_streams_with_the_same_result(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``DPMM_GPU_RESIDENT_BYTES`` below one chunk nothing stays on the card: every pass
    reads its chunks again, and the fit is the same bit for bit."""
    from pipeline.core.config import FitParams
    from pipeline.data.ingest import ingest
    from pipeline.data.store import Store
    from pipeline.engines.gpu import RESIDENT_ENV
    from pipeline.engines.mixture_state import read_labels

    store = Store(tmp_path / "data")
    info = ingest(blobs(160, seed=9), store, client=client, chunk_rows=40, holdout=0.0)
    params = FitParams(engine="mapdp", init="sequential", seed=2, device="gpu").checked()
    got = []
    for budget in ("1000000", "100"):
        monkeypatch.setenv(RESIDENT_ENV, budget)
        gpu._RESIDENT.clear()  # their device memory is freed with them
        ctx = loop.context(store, tmp_path / f"state-{budget}", info, params)
        state: Any = loop.run_passes(client, ctx)
        got.append((state.objective, read_labels(ctx, state), len(gpu._RESIDENT)))
    assert got[0][2] == 4 and got[1][2] == 0
    assert got[0][0] == got[1][0]
    np.testing.assert_array_equal(got[0][1], got[1][1])
