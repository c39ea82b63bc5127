"""The ``cluster`` flow: ingest -> stage-1 passes -> stage 2 -> write-out -> summaries.

Every step is a Prefect task around a ``pipeline.distributed`` function, on the Dask client the
flow opens; the passes are ``pipeline.distributed.loop.run_passes``, checkpointed after each, so a
rerun resumes. Tasks that do I/O retry (``flows.tasks.step``); bad input does not. With
``summaries=M`` stage 1 ends with a pass that splits clusters into about M summaries, which stage
2 maps to final clusters (``"none"``: identity; ``"bhc"``: ``pipeline.ops.stage2.run_stage2``,
writing its tree files into the partial output, so the final rename keeps the output atomic).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from prefect import flow

from flows.params import run_config
from flows.tasks import passes, run_flow, step
from pipeline.core.config import (
    ALPHA,
    DEFAULT_CHUNK_ROWS,
    INIT_SAMPLE,
    MAX_PASSES,
    MIN_CHANGE,
    N_FOLDS,
    TOL,
)
from pipeline.core.storage import Loc, local_dir, no_space, redact
from pipeline.data.store import Store, StoreInfo
from pipeline.distributed.client import dask_client
from pipeline.distributed.summaries import Summaries, identity_stage2, split_summaries
from pipeline.distributed.writeout import WriteSummary, write_out
from pipeline.engines import get_engine
from pipeline.engines.base import LoopState, RunContext
from pipeline.engines.mixture_start import WARM_START
from pipeline.families import ProductFamily
from pipeline.ops import run as dist

STAGE2 = ("none", "bhc")


@step("ingest")
def ingest_task(
    client: Any, source: Any, cfg: dist.RunConfig, partial: Loc, progress: bool, model: Any
) -> tuple[Store, StoreInfo, bool]:
    return dist.step_ingest(client, source, cfg, partial, progress, model)


@step("summaries")
def summaries_task(client: Any, ctx: RunContext, state: Any, M: int) -> Summaries:
    return split_summaries(client, ctx, state, M)


@step("stage2", retries=0)
def stage2_task(
    stats: np.ndarray,
    family: ProductFamily,
    name: str,
    alpha: float,
    out_dir: Loc,
    mcmc: int,
    seed: int,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Stage 2 over the summaries (K, S): the final cluster of each, and what run.json records."""
    info: dict[str, Any] = {"method": name}
    if name == "none":
        mapping = identity_stage2(stats, family)
    else:
        from pipeline.ops.stage2 import run_stage2

        # the tree's files are written by libraries that want a path (``local_dir``)
        with local_dir(out_dir) as files:
            res = run_stage2(
                stats, family, alpha, files, method=name, mcmc_iter=mcmc, random_state=seed
            )
        mapping = np.asarray(res.mapping, dtype=np.int64)
        info.update(res.info)
    mapping = np.asarray(mapping, dtype=np.int64)
    if mapping.shape != (stats.shape[0],) or (mapping.size and mapping.min() < 0):
        raise RuntimeError(f"stage 2 {name!r} returned a bad mapping of shape {mapping.shape}")
    return mapping, info


@step("write-out")
def write_task(
    client: Any, ctx: RunContext, state: LoopState, mapping: np.ndarray, labels: Loc
) -> WriteSummary:
    engine = get_engine(ctx.params.engine, ctx.params.device)
    return write_out(client, ctx, engine, state, mapping, labels)


@step("finish")
def finish_task(
    source: Any,
    cfg: dist.RunConfig,
    partial: Loc,
    info: StoreInfo,
    state: Any,
    mapping: np.ndarray,
    written: WriteSummary,
    timing: dict[str, float],
    extra: dict[str, Any],
) -> dict[str, Any]:
    return dist.finish(source, cfg, partial, info, state, mapping, written, timing, extra)


@flow(name="cluster", validate_parameters=False)
def cluster(
    input: Any,
    out: str,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    holdout: float = 0.0,
    engine: str = "mapdp",
    family: Any = "auto",
    alpha: float | str = ALPHA,
    init: str = "auto",
    n_seeds: int | None = None,
    max_passes: int = MAX_PASSES,
    tol: float = TOL,
    min_change: float = MIN_CHANGE,
    init_sample: int = INIT_SAMPLE,
    prior_scale: float | None = None,
    random_state: int | None = 0,
    label_column: str | None = None,
    n_folds: int = N_FOLDS,
    group_column: str | None = None,
    dtype: str = "float64",
    data_dir: str | None = None,
    summaries: int = 0,
    stage2: str | None = None,
    mcmc: int = 0,
    warm_start: str | None = None,
    engine_options: dict[str, Any] | None = None,
    missing: str = "latent",
    strict: bool = False,
    device: str = "cpu",
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = "127.0.0.1:8787",
    overwrite: bool = False,
    report: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Cluster the records of ``input`` into ``out`` (``dpmm run``; parameters as there).

    ``summaries`` (M > 0) splits the stage-1 clusters into about M summaries for stage 2
    (``stage2`` "bhc" by default then, else "none"). The input is ingested once into a dataset
    store under ``data_dir`` that later runs with the same options reuse. ``warm_start``, a model
    directory: the input is encoded with its schema and family and pass 1 starts from its
    clusters. ``engine_options`` are the engine's own settings (``RunContext.options``).

    Returns the content of ``out/run.json``.
    """
    if stage2 is None:
        stage2 = "bhc" if int(summaries) > 0 else "none"
    if stage2 not in STAGE2:
        raise ValueError(f"stage2 must be one of {STAGE2}, got {stage2!r}")
    if int(summaries) < 0 or int(mcmc) < 0:
        raise ValueError(f"summaries and mcmc must be >= 0, got {summaries} and {mcmc}")
    if int(summaries) > 0 and not get_engine(engine).summaries:
        raise ValueError(f"--summaries: the {engine} engine has no summaries pass; drop it")
    cfg = run_config(locals())
    t0 = time.perf_counter()
    if report:
        from pipeline.ops.page import preload

        preload()  # the report's drawing library loads while the run works
    model = dist.open_warm_start(cfg)
    partial, resumed = dist.prepare_output(input, cfg)
    if resumed and progress:
        print(f"resuming the run in {partial}", file=sys.stderr)
    timing: dict[str, float] = {}
    with dask_client(
        scheduler, n_workers, processes, dashboard_address, warm=[engine], device=device
    ) as client:
        timing["cluster_start"] = time.perf_counter() - t0
        t = time.perf_counter()
        try:
            data, info, reused = ingest_task(client, input, cfg, partial, progress, model)
            # an engine that does not take the records' missing cells refuses them here
            ctx = dist.run_context(partial, data, info, cfg.params, progress, cfg.engine_options)
        except (ValueError, OSError) as err:
            # nothing to resume after bad input; a full disk needs the space back
            if isinstance(err, ValueError) or no_space(err):
                dist.discard_output(partial)
            raise
        timing["ingest"] = time.perf_counter() - t
        ctx.options[WARM_START] = dist.warm_start_of(model, info)
        extra: dict[str, Any] = {
            "resumed": resumed,
            "dataset": {"path": redact(str(data.path)), "reused": reused},
            "stage2": stage2,
        }
        try:
            state, mapping, written = _stages(client, ctx, partial, cfg, extra, timing)
            extra["dashboard"] = client.dashboard_link
            # ``ctx.info``: with the run's prior (``pipeline.distributed.loop.with_prior_scale``)
            run = finish_task(input, cfg, partial, ctx.info, state, mapping, written, timing, extra)
        except OSError as err:
            if no_space(err):
                dist.discard_output(partial)
            raise
    if progress:
        m, held = run["metrics"], run["metrics"]["heldout_mean_log_density"]
        print(
            f"done: {ctx.info.n_rows:,} records, {m['n_clusters']} clusters, "
            f"{m['passes']} passes, objective {m['objective']:.6g}, "
            + (f"held-out mean log density {held:.4g}, " if held is not None else "")
            + (
                f"NMI {m['nmi']:.4f}, ARI {m['ari']:.4f} against '{label_column}', "
                if "nmi" in m
                else ""
            )
            + f"{run['timing']['total']:.1f} s ({m['records_per_second']:,.0f} records/s) "
            f"-> {out}",
            file=sys.stderr,
        )
    return run


def _stages(
    client: Any,
    ctx: RunContext,
    partial: Loc,
    cfg: dist.RunConfig,
    extra: dict[str, Any],
    timing: dict[str, float],
) -> tuple[Any, np.ndarray, WriteSummary]:
    """Stage 1, the summaries, stage 2 and the write-out, timed into ``timing``, into ``extra``."""
    t = time.perf_counter()
    labels = partial / "labels.zarr"
    state: Any = passes(client, ctx, labels)
    timing["passes"] = time.perf_counter() - t
    extra["n_clusters_stage1"] = state.n_clusters
    if cfg.summaries > 0:
        t = time.perf_counter()
        split = summaries_task(client, ctx, state, cfg.summaries)
        state = split.state
        extra["summaries"] = split.record
        timing["summaries"] = time.perf_counter() - t
    t = time.perf_counter()
    mapping, s2info = stage2_task(
        state.stats, ctx.info.family, cfg.stage2, state.alpha, partial, cfg.mcmc, ctx.params.seed
    )
    timing["stage2"] = time.perf_counter() - t
    extra["stage2_info"] = {**s2info, "seconds": timing["stage2"]}
    t = time.perf_counter()
    written = write_task(client, ctx, state, mapping, labels)
    timing["write_out"] = time.perf_counter() - t
    return state, mapping, written


def run_cluster_flow(**kwargs: Any) -> dict[str, Any]:
    """Run the ``cluster`` flow as ``dpmm run`` does (keyword arguments as ``cluster``)."""
    return run_flow(cluster, **kwargs)
