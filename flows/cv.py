"""The ``cv`` flow (``dpmm cv``): a grid of MAP-DP configurations x K folds, each fit a Prefect
task run whose work is a Dask task on the cluster, then the chosen cell refitted on all records.

At most ``concurrency`` fits are in flight (the flow's ``ThreadPoolTaskRunner``). Each finished
fit is written at once into the partial output (``pipeline.ops.cv.ResultLog``), so a rerun skips
the fits done; the output appears at ``OUT`` only when complete. Bad input is a ``ValueError``
before any fit and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
from prefect import flow

from flows.tasks import run_flow, step
from pipeline.core import outputs, storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, MAX_ITER, SELECT
from pipeline.data import dataset
from pipeline.data.sources import REFUSE_HINT
from pipeline.distributed.client import dask_client
from pipeline.estimators.model import save_model
from pipeline.ops import cv as pcv


@step("cv-fit", task_run_name="fit-{cell}-fold{fold}", retries=1)
def fit_task(
    client: Any,
    store_path: str,
    params: dict[str, Any],
    cell: str,
    fold: int,
    seed: int,
    max_iter: int,
    log_dir: str,
) -> dict[str, Any]:
    """One (cell, fold) fit on the Dask cluster; its result persisted when it returns."""
    fut = client.submit(pcv.fold_fit, store_path, params, fold, seed, max_iter, pure=False)
    res: dict[str, Any] = fut.result()
    pcv.ResultLog(log_dir).put(res)
    return res


@step("refit", retries=0)
def refit_task(
    client: Any, store_path: str, params: dict[str, Any], seed: int, max_iter: int
) -> Any:
    return client.submit(pcv.refit, store_path, params, seed, max_iter, pure=False).result()


@flow(name="cv", validate_parameters=False)
def cv(
    input: Any,
    out: str,
    alphas: list[float],
    scales: list[float],
    families: list[str],
    n_folds: int = 5,
    select: str = "best",
    label_column: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    data_dir: str | None = None,
    missing: str = "latent",
    strict: bool = False,
    random_state: int = 0,
    max_iter: int = MAX_ITER,
    concurrency: int | None = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Score every cell of the grid (alphas x scales x families) by ``n_folds``-fold held-out
    log predictive density on the dataset store of ``input``, choose one (``select``), refit it
    on all records and write ``out``; ``missing`` and ``strict`` as ``dpmm run``'s. Returns the
    content of ``out/cv.json``."""
    t_start = time.perf_counter()
    cells = _cells(alphas, scales, families, select, int(n_folds))
    shown = storage.redact(str(storage.location(out)))
    key = {"cells": cells, "n_folds": int(n_folds), "seed": int(random_state)}
    key.update(max_iter=int(max_iter), label_column=label_column, chunk_rows=int(chunk_rows))
    fp = None  # with one, a later attempt of the same command resumes this one
    if dataset.is_path_source(input):
        fp = json.dumps({"input": dataset.fingerprint(input), **key}, sort_keys=True, default=str)
    partial, resumed = outputs.prepare_output(out, fp, overwrite)
    if resumed and progress:
        print(f"resuming the grid in {partial}", file=sys.stderr)
    timing: dict[str, float] = {}
    try:
        with dask_client(scheduler, n_workers, processes, dashboard_address, quiet=True) as client:
            t = time.perf_counter()
            store, info, reused = _open(
                client, input, partial, data_dir, key, missing, bool(strict)
            )
            timing["ingest"] = time.perf_counter() - t
            counts = pcv.check_folds(store, info, int(n_folds))
            t = time.perf_counter()
            fits = _fold_fits(client, str(store.path), cells, key, partial, info.n_rows, progress)
            timing["fits_wall"] = time.perf_counter() - t
            table = pcv.summarise(cells, fits.pop("results"), int(n_folds))
            best = pcv.choose(table, select)
            row = table.iloc[best]
            chosen = {
                "family": str(row["family"]),
                "prior_scale": float(row["prior_scale"]),
                "alpha": float(row["alpha"]),
            }
            t = time.perf_counter()
            model: Any = refit_task(
                client, str(store.path), chosen, int(random_state), int(max_iter)
            )
            timing["refit"] = time.perf_counter() - t
            y = None if label_column is None else np.asarray(store.array("y")[:])
        table["chosen"] = np.arange(len(table)) == best
        metrics = _metrics(model, row, y)
        timing["fits_sum"] = float(table["fit_seconds"].sum())
        timing["total"] = time.perf_counter() - t_start
        run = {
            "command": "cv",
            "input": storage.redact(str(input)) if dataset.is_path_source(input) else "<in memory>",
            "out": shown,
            "grid": {"alpha": list(alphas), "prior_scale": list(scales), "family": list(families)},
            "n_folds": int(n_folds),
            "fold_sizes": [int(c) for c in counts],
            "select": select,
            "chosen": chosen,
            "chosen_cell": str(row["cell"]),
            "concurrency": concurrency,
            **fits,
            "resumed": resumed,
            "dataset": {
                "path": storage.redact(str(store.path)),
                "reused": reused,
                "n_rows": info.n_rows,
            },
            "model": {"artifact": "model", "files": ["model"]},
            "metrics": metrics,
            "timing": timing,
            "versions": outputs.versions(),
        }
        _write(partial, run, table, best, model)
        outputs.publish_output(partial, out, overwrite, kind="cv")
    except (ValueError, TypeError):
        # bad input: nothing to resume, nothing left behind
        storage.rmtree(partial, ignore_errors=True)
        raise
    if progress:
        c, m = chosen, metrics
        print(
            f"chosen: family {c['family']}, prior scale {c['prior_scale']:g}, alpha "
            f"{c['alpha']:g} (held-out {m['mean_log_density']:.4g} ± {m['se_log_density']:.2g} "
            f"per record); refit: {m['n_clusters']} clusters -> {shown}",
            file=sys.stderr,
        )
    return run


def _cells(
    alphas: list[float], scales: list[float], families: list[str], select: str, n_folds: int
) -> list[dict[str, Any]]:
    """The grid's cells; a bad grid, ``select`` or number of folds is a ``GridError``."""
    grid = pcv.Grid(tuple(alphas), tuple(scales), tuple(families))
    if select not in SELECT:
        raise pcv.GridError(f"--select must be one of {SELECT}, got {select!r}")
    if n_folds < 2:
        raise pcv.GridError(f"--folds {n_folds}: at least 2 folds are needed")
    return grid.cells()


def _open(
    client: Any,
    input: Any,
    partial: storage.Loc,
    data_dir: str | None,
    key: dict[str, Any],
    missing: str,
    strict: bool,
) -> tuple[Any, Any, bool]:
    """The shared dataset store of ``input`` with ``key``'s folds, its info and reuse flag."""
    path = None if dataset.is_path_source(input) else partial / "store.zarr"
    # the workers may share no disk: a store may go with OUT (as in ``dpmm run``)
    return dataset.open_dataset(
        input,
        client=client,
        root=dataset.root_for(partial, data_dir),
        chunk_rows=key["chunk_rows"],
        n_folds=key["n_folds"],
        label_column=key["label_column"],
        path=path,
        missing=missing == "latent",
        strict=strict,
        missing_hint=REFUSE_HINT if missing == "refuse" else None,
    )


def _fold_fits(
    client: Any,
    store_path: str,
    cells: list[dict[str, Any]],
    key: dict[str, Any],
    partial: storage.Loc,
    n_rows: int,
    progress: bool,
) -> dict[str, Any]:
    """Every (cell, fold) fit not done before, each a task run: all results, and the counts."""
    n_folds = key["n_folds"]
    log = pcv.ResultLog(partial / "fits")
    todo = [
        (p, pcv.cell_id(p), j)
        for p in cells
        for j in range(n_folds)
        if log.get(pcv.cell_id(p), j) is None
    ]
    n_done = len(cells) * n_folds - len(todo)
    if progress:
        print(
            f"cv: {len(cells)} cells x {n_folds} folds on {n_rows:,} records; "
            f"{n_done} fits done before, {len(todo)} to run",
            file=sys.stderr,
        )
    seed, max_iter, log_dir = key["seed"], key["max_iter"], str(partial / "fits")
    futs = [
        fit_task.submit(client, store_path, p, cid, j, seed, max_iter, log_dir)
        for p, cid, j in todo
    ]
    for f in futs:
        f.result()
    results = [log.get(pcv.cell_id(p), j) for p in cells for j in range(n_folds)]
    assert all(r is not None for r in results)
    return {"results": results, "fits_run": len(todo), "fits_reused": n_done}


def _metrics(model: Any, row: Any, y: np.ndarray | None) -> dict[str, Any]:
    """The refit's clusters and alpha, the chosen cell's held-out density, NMI and ARI."""
    metrics: dict[str, Any] = {
        "n_clusters": int(model.n_clusters_),
        "alpha": float(model.alpha_),
        "mean_log_density": float(row["mean_log_density"]),
        "se_log_density": float(row["se_log_density"]),
    }
    if y is not None:
        from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

        keep = y >= 0
        metrics["nmi"] = float(normalized_mutual_info_score(y[keep], model.labels_))
        metrics["ari"] = float(adjusted_rand_score(y[keep], model.labels_))
    return metrics


def _write(partial: storage.Loc, run: dict[str, Any], table: Any, best: int, model: Any) -> None:
    """cv.parquet, cv.png, the model, cv.json and the report into ``partial``; scratch removed."""
    # pandas and matplotlib want a path: on object storage a local directory is uploaded
    with storage.local_dir(partial) as files:
        table.to_parquet(files / "cv.parquet", index=False)
        pcv.plot_grid(table, best, files / "cv.png")
        save_model(model, files / "model")
    outputs.write_json(partial / "cv.json", run)
    with storage.local_dir(partial) as files:
        pcv.write_report(files, run, table)
    storage.rmtree(partial / "fits", ignore_errors=True)
    storage.rmtree(partial / "store.zarr", ignore_errors=True)


def run_cv_flow(**kwargs: Any) -> dict[str, Any]:
    """Run the ``cv`` flow (keyword arguments as ``cv``) as ``dpmm cv`` does."""
    from prefect.task_runners import ThreadPoolTaskRunner

    limit = kwargs.get("concurrency") or kwargs.get("n_workers") or os.cpu_count() or 1
    kwargs["concurrency"] = int(limit)
    runner: Any = ThreadPoolTaskRunner(max_workers=int(limit))
    return run_flow(cv.with_options(task_runner=runner), **kwargs)  # type: ignore[no-any-return]
