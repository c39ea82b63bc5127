"""The ``hmm`` flow (``dpmm hmm``): read and check the sequences -> ingest (sequences as groups)
-> MAP-iHMM passes (engine ``ihmm``) -> write-out (Viterbi and forward algorithm) -> outputs and
OUT/model; bad input leaves nothing behind.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pandas as pd
from prefect import flow

from flows.cluster import ingest_task, write_task
from flows.params import run_config
from flows.tasks import passes, step
from pipeline.core import outputs, storage
from pipeline.core.config import (
    DEFAULT_CHUNK_ROWS,
    GAMMA,
    IHMM_ALPHA,
    IHMM_PRIOR_SCALE,
    INIT_SAMPLE,
    MAX_PASSES,
    MIN_CHANGE,
    TOL,
)
from pipeline.data.store import StoreInfo
from pipeline.distributed.client import dask_client
from pipeline.distributed.summaries import identity_stage2
from pipeline.models.ihmm import check_temper
from pipeline.ops import hmm as dhmm
from pipeline.ops import run as dist


@step("read-sequences", retries=0)
def read_task(
    path: str, sequence_column: str, time_column: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    return dhmm.read_sequences(path, sequence_column, time_column)


@flow(name="hmm", validate_parameters=False)
def hmm(
    input: str,
    out: str,
    sequence_column: str,
    time_column: str,
    alpha: float = IHMM_ALPHA,
    gamma: float = GAMMA,
    family: Any = "auto",
    prior_scale: float | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    holdout: float = 0.0,
    init: str = "auto",
    init_sample: int = INIT_SAMPLE,
    max_passes: int = MAX_PASSES,
    tol: float = TOL,
    min_change: float = MIN_CHANGE,
    random_state: int | None = 0,
    temper: Any = "auto",
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = ":8787",
    overwrite: bool = False,
    report: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Fit MAP-iHMM to the sequences of ``input`` (``dpmm hmm``); ``out/run.json``'s content."""
    temper = check_temper(temper)
    cfg = run_config(locals(), engine="ihmm", alpha=float(alpha), group_column=sequence_column)
    t0 = time.perf_counter()
    if outputs.committed(storage.location(out)) and not overwrite:
        # before reading the input: refused at once, as the other commands
        raise ValueError(
            f"--out {storage.redact(str(out))}: already exists (pass --overwrite to replace it)"
        )
    timing: dict[str, float] = {}
    frame, meta = read_task(input, sequence_column, time_column)
    timing["read"] = time.perf_counter() - t0
    # an in-memory source: ingested into the partial output, which is removed on bad input
    partial, _ = dist.prepare_output(frame, cfg)
    try:
        with dask_client(
            scheduler, n_workers, processes, dashboard_address, warm=["ihmm"]
        ) as client:
            t = time.perf_counter()
            data, info, _ = ingest_task(client, frame, cfg, partial, progress, None)
            timing["ingest"] = time.perf_counter() - t
            t = time.perf_counter()
            ctx = dist.run_context(partial, data, info, cfg.params, progress)
            ctx.options.update(gamma=float(gamma), temper=temper)
            labels = partial / "labels.zarr"
            state: Any = passes(client, ctx, labels)
            timing["passes"] = time.perf_counter() - t
            t = time.perf_counter()
            # ``ctx.info``: with the run's prior (``pipeline.distributed.loop.with_prior_scale``)
            info = ctx.info
            written = write_task(
                client, ctx, state, identity_stage2(state.stats, info.family), labels
            )
            timing["write_out"] = time.perf_counter() - t
    except ValueError:
        dist.discard_output(partial)
        raise
    metrics, rows, A = dhmm.hmm_outputs(
        partial, data, info, state, meta, sequence_column, time_column
    )
    own = {"alpha": float(alpha), "gamma": float(gamma), "temper": temper}
    scale = IHMM_PRIOR_SCALE if prior_scale is None else float(prior_scale)
    # OUT/model: the ``MAPiHMM`` of the final states, with what it was fitted to
    fitted = {"input": storage.redact(str(input)), "n_rows": info.n_rows, "n_train": info.n_train}
    fitted.update(passes=len(state.history), objective=state.objective)
    fitted.update(converged=bool(state.converged))
    params = {**own, "family": family, "prior_scale": scale}
    dhmm.write_hmm_model(partial / "model", info, state, params, fitted)
    timing["total"] = time.perf_counter() - t0
    metrics.update(
        passes=len(state.history),
        converged=state.converged,
        objective=state.objective,
        stop=state.history[-1].get("stop") if state.history else None,
        records_per_second=info.n_rows / timing["total"],
    )
    columns = {"sequence_column": sequence_column, "time_column": time_column}
    run = _record(input, out, cfg, info, state, {**columns, **own, "prior_scale": prior_scale})
    run.update(timing=timing, metrics=metrics, write_out_seconds=written.seconds)
    features = frame.drop(columns=[sequence_column])
    sizes = state.stats[:, 0]
    run = dhmm.finish_hmm(
        partial, str(out), overwrite, run, report, rows, features, A, sizes, *columns.values()
    )
    if progress:
        m = run["metrics"]
        print(
            f"done: {info.n_rows:,} steps in {m['n_sequences']:,} sequences, {m['n_states']} "
            f"states, {m['passes']} passes, objective {m['objective']:.6g}, "
            f"{timing['total']:.1f} s -> {storage.redact(str(out))}",
            file=sys.stderr,
        )
    return run


def _record(
    input: str, out: str, cfg: dist.RunConfig, info: StoreInfo, state: Any, own: dict[str, Any]
) -> dict[str, Any]:
    """run.json's content but the timing and the metrics."""
    params = cfg.params
    return {
        "input": storage.redact(str(input)),
        "out": storage.redact(str(out)),
        "n_rows": info.n_rows,
        "n_train": info.n_train,
        "columns": info.schema.columns,
        "kinds": info.schema.kinds,
        "family": repr(info.family),
        "parameters": {
            "engine": "ihmm",
            **{k: own[k] for k in ("sequence_column", "time_column", "alpha", "gamma")},
            "prior_scale": own["prior_scale"],
            "chunk_rows": cfg.chunk_rows,
            "n_chunks": info.n_chunks,
            "holdout": cfg.holdout,
            "init": params.start,
            "init_sample": params.init_sample,
            "max_passes": params.max_passes,
            "tol": params.tol,
            "min_change": params.min_change,
            "seed": params.seed,
            "temper": own["temper"],
        },
        # the emission weight w and the residual autocorrelation rho it was measured from
        "temper": {"w": float(state.temper), "rho": state.rho},
        "init": state.init_record,
        "passes": state.history,
    }
