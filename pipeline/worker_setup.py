"""Dask worker preload for the ``LocalCluster`` the pipeline starts (``dask_client``).

A new worker process imports the pipeline (pandas, zarr, numba, SciPy: over a second) and loads
the numba kernels from their cache the first time a task needs them. Done lazily, both costs
land inside the first ingest, sample-fit and pass tasks, one after the other. Done here, they
run while the worker starts, in every worker at once, while the driver waits for the cluster
anyway. The kernels are compiled per argument type, not per family, so two toy Gaussian blobs
load the code every family uses.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


def warm_kernels() -> None:
    """Load every numba kernel a chunk task or the sample start calls, on 40 toy records."""
    from kernels import bayes_kmeans as kbk
    from kernels import mapdp as kmapdp
    from kernels.rng import shuffle
    from pipeline.families import GaussianNW
    from pipeline.mapdp_core import run_mapdp, seed_state

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-4.0, 1.0, (20, 2)), rng.normal(4.0, 1.0, (20, 2))])
    family = GaussianNW.empirical_bayes(X).as_product()
    spec, prior, empty_c = family.spec, family.prior, family.empty_cache()
    n = X.shape[0]
    order = np.arange(n, dtype=np.int64)
    shuffle(seed_state(np.random.SeedSequence(0)), order)
    z = np.zeros(n, dtype=np.int64)
    stats = family.stats_of(X, z, 1)
    cache = family.cache_of(stats)
    nk = np.ascontiguousarray(stats[:, 0])
    kmapdp.sweep_scored(
        X,
        order,
        z.copy(),
        stats.copy(),
        cache.copy(),
        nk.copy(),
        1,
        spec,
        prior,
        empty_c,
        1.0,
        np.empty(n),
    )
    kbk.assign(X, order, z.copy(), stats, cache, nk, 1, spec, prior, empty_c, 0.0)
    kbk.label_deltas(X, order, z, z, 1, 0, spec, family.n_stats)
    kmapdp.predict(X, stats, cache, nk, spec, prior, empty_c, 1.0)
    run_mapdp(X, family, order, 1.0, True, (2.0, 1.0), 5, 1e-6, "sequential")


def dask_setup(worker: Any) -> None:
    """Called by Dask when the worker starts. A failure only costs the speed-up."""
    try:
        warm_kernels()
    except Exception:  # the tasks load what they need anyway
        logger.warning("dpmm worker warm-up failed", exc_info=True)
