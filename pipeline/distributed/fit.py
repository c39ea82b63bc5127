"""Stage 1 on Dask from Python (``fit_distributed``, ``MAPDP.fit`` on a dask collection): ingest
into a dataset store, then the pass loop with the run's state in a separate state store.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.core import config
from pipeline.core.config import FitParams
from pipeline.core.seeds import seed_entropy
from pipeline.data.ingest import ingest
from pipeline.data.store import Store, StoreInfo
from pipeline.distributed import loop
from pipeline.distributed.client import dask_client
from pipeline.engines.mixture_start import WARM_START
from pipeline.engines.mixture_state import PassState, read_labels
from pipeline.families import FloatArray
from pipeline.families.stats import Stats
from pipeline.models.mapdp import set_fitted

IntArray = NDArray[np.int64]


@dataclass
class DistributedResult:
    """A stage-1 run on Dask: ``MapdpResult``'s fields plus what ingest learned."""

    labels: IntArray
    stats: FloatArray
    alpha: float
    objective: float
    history: list[float]
    n_iter: int
    converged: bool
    seconds: float
    passes: list[dict[str, Any]]
    info: StoreInfo
    restart_objectives: list[float] = field(default_factory=list)

    @property
    def nk(self) -> FloatArray:
        """Cluster sizes (K,): the statistics' counts."""
        return np.ascontiguousarray(self.stats[:, 0])


def fit_distributed(
    X: Any,
    family: Any = "auto",
    alpha: float | str = config.ALPHA,
    *,
    engine: str = "mapdp",
    init: str = "auto",
    n_seeds: int | None = None,
    alpha_prior: tuple[float, float] = config.ALPHA_PRIOR,
    max_passes: int = config.MAX_PASSES,
    tol: float = config.TOL,
    min_change: float = config.MIN_CHANGE,
    init_sample: int = config.INIT_SAMPLE,
    prior_scale: float | None = None,
    n_restarts: int = 1,
    random_state: Any = None,
    chunk_rows: int = config.DEFAULT_CHUNK_ROWS,
    prior_sample: int = config.PRIOR_SAMPLE,
    client: Any = None,
    store_path: str | Path | None = None,
    progress: bool = False,
    warm_start: tuple[Stats, float] | None = None,
    device: str = "cpu",
    dtype: str = "float64",
    missing: str = "latent",
    strict: bool = False,
) -> DistributedResult:
    """Stage 1 of the pipeline on records that may not fit in one process.

    Parameters
    ----------
    X : dask array / DataFrame, numpy array, pandas DataFrame, or a path (``pipeline.data.sources``)
    family, alpha, missing : as ``MAPDP``'s
    engine : "mapdp" or "kmeans"
    init, n_seeds, alpha_prior, max_passes, tol, min_change, init_sample, prior_scale : see
        ``FitParams``
    n_restarts : int
        Runs from different seeds over the same store; the lowest objective wins.
    random_state : int, SeedSequence, Generator or None
    chunk_rows, prior_sample, dtype : as ``pipeline.data.ingest.ingest``
    client : distributed.Client, optional
        Default: a LocalCluster of one single-threaded worker process per core.
    store_path : path, optional
        Where to write the store; default a temporary directory, removed afterwards.
    warm_start : (Stats, float), optional
        Clusters (of the fitted model's family) and concentration to start from instead of
        ``init`` (``pipeline.engines.mixture_start.warm_state``).
    device : "cpu" or "gpu"
        "gpu": the passes on NVIDIA GPUs, one worker per GPU; ``DeviceError`` without one.
    strict : bool
        Refuse a constant column instead of dropping it.
    progress : bool
        A line on stderr after each pass.

    Returns
    -------
    DistributedResult
    """
    t0 = time.perf_counter()
    params = FitParams(
        engine=engine,
        alpha=alpha,
        alpha_prior=config.check_alpha_prior(alpha_prior),
        init=init,
        n_seeds=n_seeds,
        max_passes=max_passes,
        tol=float(tol),
        min_change=float(min_change),
        init_sample=init_sample,
        seed=seed_entropy(random_state),
        prior_scale=prior_scale,
        device=device,
    ).checked()
    n_restarts = config.check_int(n_restarts, "n_restarts")
    with _place(client, store_path, device, engine) as (client, store, state):
        info = ingest(
            X,
            store,
            client=client,
            family=family,
            chunk_rows=chunk_rows,
            prior_sample=prior_sample,
            dtype=dtype,
            missing=missing == "latent",
            strict=strict,
        )
        res = best_of_restarts(client, store, state, info, params, n_restarts, warm_start, progress)
    res.seconds = time.perf_counter() - t0
    return res


@contextlib.contextmanager
def _place(
    client: Any, store_path: str | Path | None, device: str, engine: str
) -> Iterator[tuple[Any, Store, Path]]:
    """Where a fit runs (``client``, else a new local cluster) and keeps its stores; what is
    made here is closed when the fit ends."""
    if device == "gpu":
        from pipeline.engines.gpu import require_device

        require_device()
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(
                dask_client(
                    dashboard_address=None,
                    quiet=True,
                    device=device,
                    warm=[engine] if device == "gpu" else None,
                )
            )
        if store_path is None:
            store_path = stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmm-")) + "/s"
        yield client, Store(store_path), Path(store_path) / "state"


def best_of_restarts(
    client: Any,
    store: Store,
    state: Path,
    info: StoreInfo,
    params: FitParams,
    n_restarts: int,
    warm_start: tuple[Stats, float] | None = None,
    progress: bool = False,
) -> DistributedResult:
    """``n_restarts`` runs of the pass loop over ``store``, restart r seeded by ``replace(params,
    restart=r)``: the lowest objective's, its labels read back, and every run's objective."""
    t0 = time.perf_counter()
    best: tuple[PassState, IntArray] | None = None
    objectives = []
    for r in range(n_restarts):
        ctx = loop.context(store, state, info, replace(params, restart=r))
        info = ctx.info  # with the run's prior
        ctx.progress = progress
        ctx.options[WARM_START] = warm_start
        loop.clear_checkpoint(ctx)
        st = loop.run_passes(client, ctx)
        assert isinstance(st, PassState)
        objectives.append(st.objective)
        if best is None or st.objective < best[0].objective:
            best = (st, read_labels(ctx, st))
    assert best is not None
    st, labels = best
    return DistributedResult(
        labels=labels,
        stats=st.stats,
        alpha=st.alpha,
        objective=st.objective,
        history=[h["objective"] for h in st.history],
        n_iter=st.pass_no,
        converged=st.converged,
        seconds=time.perf_counter() - t0,
        passes=st.history,
        info=info,
        restart_objectives=objectives,
    )


def fit_estimator(est: Any, X: Any, client: Any = None) -> Any:
    """``MAPDP.fit`` for a dask collection, setting the same fitted attributes."""
    from sklearn.exceptions import ConvergenceWarning

    # "sequential" is the in-memory start; on Dask a sample's fit needs fewer passes
    res = fit_distributed(
        X,
        family=est.family,
        alpha=est.alpha,
        engine="mapdp",
        init="sample" if est.init == "sequential" else est.init,
        alpha_prior=tuple(est.alpha_prior),
        max_passes=est.max_iter,
        tol=est.tol,
        prior_scale=getattr(est, "prior_scale", None),
        # the distributed fit starts from one sample fit; restarts there are explicit only
        n_restarts=1 if est.n_restarts == "auto" else int(est.n_restarts),
        random_state=est.random_state,
        client=client,
        device=getattr(est, "device", "cpu"),
        missing=getattr(est, "missing", "latent"),
        strict=bool(getattr(est, "strict", False)),
    )
    if not res.converged:
        warnings.warn(
            f"MAP-DP did not converge in max_iter={est.max_iter} passes; increase max_iter or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
    info = res.info
    est.schema_ = info.schema
    est.family_ = info.family
    est.n_features_in_ = len(info.schema.columns)
    if info.schema.from_frame:
        est.feature_names_in_ = np.asarray(info.schema.columns, dtype=object)
    elif hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    set_fitted(est, res, res.restart_objectives, info.family)
    return est
