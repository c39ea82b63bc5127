"""Dask worker preload for the ``LocalCluster`` the pipeline starts (``dask_client``).

A new worker process imports the pipeline (pandas, zarr, numba, SciPy: over a second) and loads
the numba kernels from their cache the first time a task needs them. Done lazily, both costs
land inside the first ingest, sample-fit and pass tasks, one after the other. Done here, they
run while the worker starts, in every worker at once, while the driver waits for the cluster
anyway. Every registered engine loads what its chunk tasks call (``Engine.warm_up``); the
kernels are compiled per argument type, not per family, so toy Gaussian blobs load the code
every family uses.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from pipeline.families import FloatArray, ProductFamily

logger = logging.getLogger(__name__)


def toy_family() -> tuple[FloatArray, ProductFamily]:
    """40 records (40, 2) of two Gaussian blobs and their empirical-Bayes family."""
    from pipeline.families import GaussianNW

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-4.0, 1.0, (20, 2)), rng.normal(4.0, 1.0, (20, 2))])
    return X, GaussianNW.empirical_bayes(X).as_product()


def warm_kernels() -> None:
    """Load every numba kernel a chunk task or the sample start of any engine calls."""
    from pipeline.engines import all_engines

    for engine in all_engines():
        engine.warm_up()


def dask_setup(worker: Any) -> None:
    """Called by Dask when the worker starts. A failure only costs the speed-up."""
    try:
        warm_kernels()
    except Exception:  # the tasks load what they need anyway
        logger.warning("dpmm worker warm-up failed", exc_info=True)
