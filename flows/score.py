"""The ``score`` flow (``dpmm score``): ingest validated against the model's schema -> write-out
-> finish (``pipeline.ops.score``); bad input leaves nothing at OUT.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from prefect import flow

from flows.tasks import run_flow, step
from pipeline.core.config import DEFAULT_CHUNK_ROWS
from pipeline.core.storage import Loc
from pipeline.data.store import StoreInfo
from pipeline.distributed.client import dask_client
from pipeline.ops import score as sc


@step("ingest")
def ingest_task(client: Any, est: Any, source: Any, partial: Loc, chunk_rows: int) -> StoreInfo:
    return sc.step_ingest(client, est, source, partial, chunk_rows)


@step("write-out")
def write_task(
    client: Any, est: Any, info: StoreInfo, partial: Loc, progress: bool
) -> dict[str, Any]:
    return sc.write_scores(client, est, info, partial, progress)


@flow(name="score", validate_parameters=False)
def score(
    model: str,
    input: Any,
    out: str,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = "127.0.0.1:8787",
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Score the records of ``input`` with the model directory ``model`` into ``out``
    (``labels.zarr``: label and log_density per record in input order); returns the content of
    ``out/score.json``."""
    t0 = time.perf_counter()
    est = sc.open_model(model)
    partial = sc.prepare(out, overwrite)
    timing: dict[str, float] = {}
    try:
        with dask_client(scheduler, n_workers, processes, dashboard_address) as c:
            timing["cluster_start"] = time.perf_counter() - t0
            t = time.perf_counter()
            info = ingest_task(c, est, input, partial, int(chunk_rows))
            timing["ingest"] = time.perf_counter() - t
            t = time.perf_counter()
            written = write_task(c, est, info, partial, progress)
            timing["write_out"] = time.perf_counter() - t
            record = sc.finish(model, input, out, partial, est, info, written, timing, overwrite)
    except BaseException:
        sc.discard(partial)
        raise
    if progress:
        m = record["metrics"]
        print(
            f"done: {info.n_rows:,} records scored with {record['n_clusters']} clusters, mean "
            f"log density {m['mean_log_density']:.4g}, {m['new_cluster']:,} nearest a new "
            f"cluster, {record['timing']['total']:.1f} s ({m['records_per_second']:,.0f} "
            f"records/s) -> {out}",
            file=sys.stderr,
        )
    return record


def run_score_flow(**kwargs: Any) -> dict[str, Any]:
    """Run the ``score`` flow as ``dpmm score`` does (keyword arguments as ``score``)."""
    return run_flow(score, **kwargs)  # type: ignore[no-any-return]
