"""The ``longitudinal`` flow (``dpmm longitudinal``): the mixed-effects model of Raykov et al.
2016, Section 7 over the subjects of a longitudinal table, on Dask: read and check -> ingest
(subjects as groups) -> the ``mixed_effects`` engine's passes -> results -> with ``folds=K``, K
cross-validation fits together -> outputs, in a temporary sibling of ``out`` renamed at the end.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow
from prefect.utilities.annotations import quote

from flows.params import fit_params
from flows.tasks import passes, step
from pipeline.core import outputs, storage
from pipeline.core.config import ALPHA, DEFAULT_CHUNK_ROWS, MAX_PASSES, MIN_CHANGE, TOL, FitParams
from pipeline.data.ingest import ingest
from pipeline.data.store import Store, StoreInfo
from pipeline.distributed import loop
from pipeline.distributed.client import dask_client
from pipeline.models.mixed_effects_start import SHRINK
from pipeline.ops import longitudinal as lon


@step("read-input", retries=0)
def read_task(path: str, cols: lon.Columns) -> pd.DataFrame:
    return lon.read_input(path, cols)


@step("ingest", retries=0)
def ingest_task(
    client: Any, df: pd.DataFrame, store: Store, cols: lon.Columns, chunk_rows: int, folds: int
) -> StoreInfo:
    return ingest(
        df,
        store,
        client=client,
        family="gaussian",
        chunk_rows=chunk_rows,
        group_column=cols.subject,
        n_folds=folds,
    )


@step("cv-fold", task_run_name="cv-fold-{fold}", retries=0)
def fold_task(
    client: Any,
    store: Store,
    info: StoreInfo,
    params: FitParams,
    cols: lon.Columns,
    shrink: float | str,
    state_dir: storage.Loc,
    fold: int,
) -> dict[str, np.ndarray]:
    """Fit with the subjects of ``fold`` held out; their held-out results."""
    ctx = lon.fit_context(store, state_dir, info, params, cols, shrink, fold=fold)
    state = loop.run_passes(client, ctx)
    res = lon.subject_results(client, ctx, state)
    keep = ~res["train"]
    return {k: v[keep] for k, v in res.items()}


@flow(name="longitudinal", validate_parameters=False)
def longitudinal(
    input: str,
    out: str,
    subject: str,
    response: str,
    covariates: list[str],
    time_column: str | None = None,
    folds: int | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    alpha: float | str = ALPHA,
    shrink: float | str = SHRINK,
    init: str = "auto",
    max_passes: int = MAX_PASSES,
    tol: float = TOL,
    min_change: float = MIN_CHANGE,
    random_state: int | None = 0,
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = ":8787",
    overwrite: bool = False,
    report: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Fit the mixed-effects model to ``input`` into ``out`` (``dpmm longitudinal``); run.json."""
    covs = list(covariates)
    if time_column is not None and time_column not in covs:
        covs.insert(0, time_column)
    cols = lon.Columns(subject, response, tuple(covs), time_column)
    if folds is not None and int(folds) < 2:
        raise ValueError(f"--folds must be at least 2, got {folds}")
    params = fit_params(
        random_state,
        engine=lon.ENGINE,
        alpha=alpha,
        init="one-cluster" if init == "one-cluster" else "auto",
        max_passes=max_passes,
        tol=tol,
        min_change=min_change,
    )
    # OUT appears only when complete: a renamed sibling, or a manifest on object storage
    partial, _ = outputs.prepare_output(out, None, overwrite)
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    try:
        df = read_task(input, cols)
        with dask_client(
            scheduler, n_workers, processes, dashboard_address, warm=["mixed_effects"]
        ) as client:
            t = time.perf_counter()
            store = Store(partial / "store.zarr")
            info = ingest_task(client, df, store, cols, int(chunk_rows), int(folds or 10))
            timing["ingest"] = time.perf_counter() - t
            t = time.perf_counter()
            ctx = lon.fit_context(
                store, partial / "state.zarr", info, params, cols, shrink, progress=progress
            )
            state: Any = passes(client, ctx)
            timing["fit"] = time.perf_counter() - t
            t = time.perf_counter()
            res = lon.subject_results(client, ctx, state)
            timing["write_out"] = time.perf_counter() - t
            cv = None
            if folds:
                t = time.perf_counter()
                # every subject's held-out results: the fold fits submitted together
                futs = [
                    fold_task.submit(  # type: ignore[call-overload]
                        client,
                        store,
                        quote(info),
                        params,
                        cols,
                        shrink,
                        partial / f"cv-{f}.zarr",
                        f,
                    )
                    for f in range(int(folds))
                ]
                parts = [f.result() for f in futs]
                cv = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
                timing["cv"] = time.perf_counter() - t
    except ValueError:
        storage.rmtree(partial, ignore_errors=True)
        raise
    parameters = {
        "input": storage.redact(str(input)),
        "subject": subject,
        "response": response,
        "covariates": covs,
        "time": time_column,
        "folds": folds,
        "chunk_rows": int(chunk_rows),
        "alpha": alpha,
        "shrink": shrink,
        "init": init,
        "max_passes": max_passes,
        "tol": tol,
        "min_change": min_change,
        "random_state": random_state,
    }
    timing["total"] = time.perf_counter() - t0
    run = lon.finish(partial, df, cols, info, state, res, cv, parameters, timing, report)
    outputs.publish_output(partial, out, overwrite, kind="longitudinal")
    return run
