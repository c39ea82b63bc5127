"""The ``cluster`` flow: ingest -> stage-1 passes -> stage 2 -> write-out -> summaries.

Every step is a Prefect task around a ``pipeline.distributed`` function; the Dask work runs on
the client the flow opens (a ``LocalCluster`` of one process per core, or ``scheduler``). Tasks
that do I/O retry (bad input, a ``ValueError``, does not: it is reported as it is). After each
pass the driver's state is checkpointed in the output store, so running the same command again
after a crash resumes from the last completed pass and gives the same labels.

Stage 2 plugs in by name: ``STAGE2[name](stats, family) -> mapping`` maps each stage-1 cluster
to its final cluster (``"none"``: the identity, ``pipeline.distributed.identity_stage2``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipeline import distributed as dist
from pipeline.families import ProductFamily
from pipeline.store import Store, StoreInfo

STAGE2: dict[str, dist.Stage2] = {"none": dist.identity_stage2}


def _retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a failed I/O task unless the failure is bad input (``ValueError``)."""
    try:
        state.result(raise_on_failure=True)
    except ValueError:
        return False
    except BaseException:  # any other failure is worth a retry
        return True
    return True


RETRIES = 2


@task(
    name="ingest",
    retries=RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_bad_input,
    cache_policy=NO_CACHE,
)
def ingest_task(
    client: Any, source: Any, cfg: dist.RunConfig, partial: Path, progress: bool
) -> StoreInfo:
    return dist.step_ingest(client, source, cfg, partial, progress)


@task(
    name="start",
    retries=RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_bad_input,
    cache_policy=NO_CACHE,
)
def start_task(
    client: Any, partial: Path, info: StoreInfo, params: dist.FitParams
) -> dist.PassState:
    return dist.step_start(client, partial, info, params)


@task(
    name="pass",
    task_run_name="pass-{p}",
    retries=RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_bad_input,
    cache_policy=NO_CACHE,
)
def pass_task(
    client: Any,
    partial: Path,
    info: StoreInfo,
    params: dist.FitParams,
    state: dist.PassState,
    p: int,
    progress: bool,
) -> dist.PassState:
    return dist.run_pass(client, Store(partial / "store.zarr"), info, params, state, progress)


@task(name="stage2", cache_policy=NO_CACHE)
def stage2_task(stats: np.ndarray, family: ProductFamily, name: str) -> np.ndarray:
    """Stage 2 over the cluster summaries (K, S): the final cluster of each stage-1 cluster."""
    mapping = np.asarray(STAGE2[name](stats, family), dtype=np.int64)
    if mapping.shape != (stats.shape[0],) or (mapping.size and mapping.min() < 0):
        raise RuntimeError(f"stage 2 {name!r} returned a bad mapping of shape {mapping.shape}")
    return mapping


@task(
    name="write-out",
    retries=RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_bad_input,
    cache_policy=NO_CACHE,
)
def write_task(
    client: Any,
    partial: Path,
    info: StoreInfo,
    state: dist.PassState,
    mapping: np.ndarray,
    progress: bool,
) -> dist.WriteSummary:
    store = Store(partial / "store.zarr")
    return dist.write_out(client, store, info, state, mapping, partial / "labels.zarr", progress)


@task(
    name="finish",
    retries=RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_bad_input,
    cache_policy=NO_CACHE,
)
def finish_task(
    source: Any,
    cfg: dist.RunConfig,
    partial: Path,
    info: StoreInfo,
    state: dist.PassState,
    mapping: np.ndarray,
    written: dist.WriteSummary,
    timing: dict[str, float],
    extra: dict[str, Any],
) -> dict[str, Any]:
    return dist.finish(source, cfg, partial, info, state, mapping, written, timing, extra)


@flow(name="cluster", validate_parameters=False)
def cluster(
    input: Any,
    out: str,
    chunk_rows: int = dist.DEFAULT_CHUNK_ROWS,
    holdout: float = 0.0,
    engine: str = "mapdp",
    family: Any = "auto",
    alpha: float | str = "learn",
    init: str = "auto",
    n_seeds: int | None = None,
    max_passes: int = 50,
    tol: float = 1e-6,
    random_state: int | None = 0,
    stage2: str = "none",
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = ":8787",
    overwrite: bool = False,
    report: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Cluster the records of ``input`` into ``out`` (``dpmm run``; parameters as there).

    Returns the content of ``out/run.json``.
    """
    if stage2 not in STAGE2:
        raise ValueError(f"stage2 must be one of {sorted(STAGE2)}, got {stage2!r}")
    params = dist.FitParams(
        engine=engine,
        alpha=alpha,
        init=init,
        n_seeds=n_seeds,
        max_passes=max_passes,
        tol=tol,
        seed=dist.seed_entropy(random_state),
    ).checked()
    cfg = dist.RunConfig(
        out=str(out),
        chunk_rows=int(chunk_rows),
        holdout=float(holdout),
        family=family,
        params=params,
        overwrite=overwrite,
        report=report,
    )
    t0 = time.perf_counter()
    partial, resumed = dist.prepare_output(input, cfg)
    if resumed and progress:
        print(f"resuming the run in {partial}", file=sys.stderr)
    timing: dict[str, float] = {}
    with dist.dask_client(scheduler, n_workers, processes, dashboard_address) as client:
        timing["cluster_start"] = time.perf_counter() - t0
        t = time.perf_counter()
        try:
            info = ingest_task(client, input, cfg, partial, progress)
        except ValueError:
            dist.discard_output(partial)
            raise
        timing["ingest"] = time.perf_counter() - t
        t = time.perf_counter()
        state = start_task(client, partial, info, params)
        while not state.converged and state.pass_no < params.max_passes:
            state = pass_task(client, partial, info, params, state, state.pass_no + 1, progress)
            dist.check_fault(state)
        timing["passes"] = time.perf_counter() - t
        t = time.perf_counter()
        mapping = stage2_task(state.stats, info.family, stage2)
        timing["stage2"] = time.perf_counter() - t
        t = time.perf_counter()
        written = write_task(client, partial, info, state, mapping, progress)
        timing["write_out"] = time.perf_counter() - t
        t = time.perf_counter()
        extra = {"resumed": resumed, "stage2": stage2, "dashboard": client.dashboard_link}
        run = finish_task(input, cfg, partial, info, state, mapping, written, timing, extra)
    if progress:
        m = run["metrics"]
        held = m["heldout_mean_log_density"]
        print(
            f"done: {info.n_rows:,} records, {m['n_clusters']} clusters, {m['passes']} passes, "
            f"objective {m['objective']:.6g}, "
            + (f"held-out mean log density {held:.4g}, " if held is not None else "")
            + f"{run['timing']['total']:.1f} s ({m['records_per_second']:,.0f} records/s) "
            f"-> {out}",
            file=sys.stderr,
        )
    return run
