"""A whole run (``dpmm run``), step by step: the Prefect flow ``flows.cluster`` calls these as
tasks. A local run writes into a temporary sibling of OUT (``temp_sibling``) that is renamed
when complete; a run whose OUT is on object storage writes under OUT itself and is made visible
by OUT's manifest, written last (``pipeline.core.outputs.commit``). Running the same command again
after a crash resumes from the last checkpoint."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.core import outputs, storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE, FitParams
from pipeline.core.outputs import versions, write_json
from pipeline.data import dataset
from pipeline.data.store import Store, StoreInfo
from pipeline.distributed.loop import context
from pipeline.distributed.writeout import WriteSummary
from pipeline.engines.base import RunContext
from pipeline.engines.mixture_state import PassState
from pipeline.families import schema
from pipeline.families.stats import Stats

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class RunConfig:
    """Everything ``dpmm run`` is given, except where it runs (scheduler, workers)."""

    out: str
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    holdout: float = 0.0
    family: Any = "auto"
    prior_sample: int = PRIOR_SAMPLE
    params: FitParams = field(default_factory=FitParams)
    overwrite: bool = False
    report: bool = True
    label_column: str | None = None
    n_folds: int = N_FOLDS
    group_column: str | None = None
    # what the dataset store's X holds (``pipeline.data.store.STORE_DTYPES``)
    dtype: str = "float64"
    # where shared dataset stores live (None: ``pipeline.data.dataset.default_root``)
    data_dir: str | None = None
    summaries: int = 0
    stage2: str = "none"
    mcmc: int = 0
    # a model directory to start the passes from (``--warm-start``)
    warm_start: str | None = None
    # engine-specific settings (``RunContext.options``: the asugs engine's ``lam``, ...)
    engine_options: dict[str, Any] = field(default_factory=dict)
    # missing cells: "latent" (kept, the MAP-DP engine fills them by ICM) or "refuse"
    missing: str = "latent"
    # refuse a constant column rather than drop it
    strict: bool = False

    def ingest_options(self) -> dict[str, Any]:
        """The options that decide what ingest writes (``pipeline.data.dataset.ingest_options``)."""
        return {
            "family": self.family,
            "chunk_rows": self.chunk_rows,
            "holdout": self.holdout,
            "n_folds": self.n_folds,
            "prior_sample": self.prior_sample,
            "label_column": self.label_column,
            "group_column": self.group_column,
            "dtype": self.dtype,
            # kept by ingest unless refused; an engine that does not take them refuses them
            # before pass 1 (``pipeline.engines.base.check_missing``), so that engines share
            # the store
            "missing": self.missing == "latent",
            "strict": self.strict,
        }


def fingerprint(source: Any, cfg: RunConfig) -> str | None:
    """A run's identity: the same command on the same input resumes, anything else restarts;
    None for an in-memory input (such a run never resumes)."""
    if not dataset.is_path_source(source):
        return None
    import json

    params = replace(cfg.params, max_passes=0, tol=0.0, min_change=0.0)
    return json.dumps(
        {
            "input": dataset.fingerprint(source),
            "options": dataset.ingest_options(**cfg.ingest_options()),
            "params": repr(params),
            "engine_options": repr(sorted(cfg.engine_options.items())),
            "warm_start": cfg.warm_start,
        },
        sort_keys=True,
    )


def prepare_output(source: Any, cfg: RunConfig) -> tuple[storage.Loc, bool]:
    """Where the run writes until it is complete, and whether it resumes an earlier attempt of
    the same command (same input files and parameters): ``outputs.prepare_output``."""
    return outputs.prepare_output(cfg.out, fingerprint(source, cfg), cfg.overwrite)


def discard_output(partial: storage.Loc) -> None:
    """Remove a partial output (after bad input: nothing to resume)."""
    storage.rmtree(partial, ignore_errors=True)


def open_warm_start(cfg: RunConfig) -> Any:
    """The model of ``--warm-start`` (``pipeline.ops.score.open_model``), or None."""
    if cfg.warm_start is None:
        return None
    if not (isinstance(cfg.family, str) and cfg.family == "auto"):
        raise ValueError(
            f"--warm-start {cfg.warm_start}: the model's family and prior are used; leave "
            "--family out"
        )
    from pipeline.ops.score import open_model

    return open_model(cfg.warm_start)


def warm_start_of(model: Any, info: StoreInfo) -> tuple[Stats, float] | None:
    """``ctx.options[WARM_START]`` of a warm-started run: the model's clusters and concentration
    (``pipeline.engines.mixture_start.warm_state``)."""
    if model is None:
        return None
    return Stats(model.cluster_stats_, info.family), float(model.alpha_)


def step_ingest(
    client: Any,
    source: Any,
    cfg: RunConfig,
    partial: storage.Loc,
    progress: bool = False,
    model: Any = None,
) -> tuple[Store, StoreInfo, bool]:
    """The dataset store of the input (``open_dataset``: a file's store is shared, an in-memory
    input goes into ``partial/store.zarr``); with a warm-start ``model`` the records are encoded
    as its."""

    def tell(what: str, done: int, total: int) -> None:
        if progress and done == total:
            print(f"ingest: {total} {what} tasks done", file=sys.stderr)

    path = None if dataset.is_path_source(source) else partial / "store.zarr"
    # the workers may share no disk: the dataset store may go with OUT (``dataset.root_for``)
    root = dataset.root_for(partial, cfg.data_dir)
    options = cfg.ingest_options()
    if model is not None:
        # the records are encoded as the model's and keep its prior
        options.update(family=model.family_, schema=model.schema_)
    from pipeline.data.sources import MISSING_HINT, REFUSE_HINT

    store, info, reused = dataset.open_dataset(
        source,
        client=client,
        root=root,
        progress=tell,
        path=path,
        missing_hint=REFUSE_HINT if cfg.missing == "refuse" else MISSING_HINT,
        **options,
    )
    if reused and progress:
        print(f"ingest: reusing the dataset store {store.path}", file=sys.stderr)
    for line in info.schema.dropped_lines():
        # the in-memory fit's warning of a dropped column, on stderr as ``dpmm cluster`` says it
        print(f"dpmm: warning: {line}", file=sys.stderr)
    return store, info, reused


def run_context(
    partial: storage.Loc,
    data: Store,
    info: StoreInfo,
    params: FitParams,
    progress: bool,
    options: dict[str, Any] | None = None,
) -> RunContext:
    """The run's ``RunContext``: the dataset store and the run's state store under
    ``partial``, with the engine's ``options``."""
    ctx = context(data, partial / "state.zarr", info, params, progress)
    ctx.options.update(options or {})
    return ctx


def write_run_model(
    directory: storage.Loc,
    cfg: RunConfig,
    info: StoreInfo,
    stats: NDArray[np.float64],
    alpha: float,
    metrics: dict[str, Any],
) -> None:
    """The run's model: a ``MAPDP`` of the final clusters ``stats`` (K, S), whose ``predict`` /
    ``score_samples`` are the write-out's; ``dpmm score`` and ``--warm-start`` read it."""
    from pipeline.estimators.model import run_model_record, write_record

    p = cfg.params
    directory.mkdir(exist_ok=True)
    record = run_model_record(
        info.schema,
        info.family,
        stats,
        alpha,
        {"alpha": p.alpha, "family": cfg.family, "alpha_prior": tuple(p.alpha_prior), "tol": p.tol},
        engine=p.engine,
        metadata={
            "input": info.source,
            "n_rows": info.n_rows,
            "n_train": info.n_train,
            "passes": metrics["passes"],
            "objective": metrics["objective"],
            "converged": bool(metrics["converged"]),
        },
    )
    write_record(directory, record)


def _metrics(
    state: PassState,
    final: NDArray[np.float64],
    written: WriteSummary,
    info: StoreInfo,
    cfg: RunConfig,
    extra: dict[str, Any],
    total: float,
) -> dict[str, Any]:
    """run.json's ``metrics`` (pops stage 2's ``n_clusters_stage1`` from ``extra``)."""
    pass_seconds = sum(h.get("seconds", 0.0) for h in state.history)
    n_passes = len(state.history)
    metrics = {
        "n_clusters": int(final.shape[0]),
        "n_clusters_stage1": int(extra.pop("n_clusters_stage1", state.n_clusters)),
        "n_summaries": int(state.n_clusters) if cfg.summaries > 0 else None,
        "passes": n_passes,
        "converged": state.converged,
        "objective": state.objective,
        "alpha": state.alpha,
        "heldout_mean_log_density": written.heldout_mean_log_density,
        "train_mean_log_density": written.train_mean_log_density,
        "n_heldout": written.n_heldout,
        "heldout_new_cluster": written.heldout_new_cluster,
        "records_per_second": info.n_rows / total if total > 0 else None,
        "sweep_records_per_second": info.n_train * n_passes / pass_seconds
        if pass_seconds > 0
        else None,
        "stop": state.history[-1].get("stop") if state.history else None,
        # the pass that also wrote the output, when it moved no record (no write-out tasks)
        "written_by_pass": written.by_pass,
    }
    if written.scores is not None:
        metrics.update(written.scores)
    return metrics


def _parameters(cfg: RunConfig, info: StoreInfo) -> dict[str, Any]:
    """run.json's ``parameters``: the run's configuration as given."""
    return {
        "chunk_rows": cfg.chunk_rows,
        "n_chunks": info.n_chunks,
        "holdout": cfg.holdout,
        "engine": cfg.params.engine,
        "device": cfg.params.device,
        "alpha": cfg.params.alpha,
        "alpha_prior": cfg.params.alpha_prior,
        "prior_scale": cfg.params.prior_scale,
        "init": cfg.params.start,
        "n_seeds": cfg.params.n_seeds,
        "max_passes": cfg.params.max_passes,
        "tol": cfg.params.tol,
        "min_change": cfg.params.min_change,
        "init_sample": cfg.params.init_sample,
        "seed": cfg.params.seed,
        "prior_sample": cfg.prior_sample,
        "label_column": cfg.label_column,
        "summaries": cfg.summaries,
        "stage2": cfg.stage2,
        "mcmc": cfg.mcmc,
        "warm_start": None if cfg.warm_start is None else storage.redact(cfg.warm_start),
        "engine_options": cfg.engine_options,
        "missing": cfg.missing,
        "strict": cfg.strict,
    }


def finish(
    source: Any,
    cfg: RunConfig,
    partial: storage.Loc,
    info: StoreInfo,
    state: PassState,
    mapping: IntArray,
    written: WriteSummary,
    timing: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``clusters.parquet``, ``model/``, ``run.json`` and the report, then rename ``partial``
    to ``out`` (local), or write OUT's manifest (object storage: ``partial`` is OUT)."""
    from pipeline.ops import report as rep
    from pipeline.ops.profile import RunData

    final = Stats(state.stats, info.family).merged(mapping).array
    clusters = schema.cluster_table(final, state.alpha, info.family, info.schema)
    total = sum(timing.values())
    extra = dict(extra or {})
    out_loc = storage.location(cfg.out)
    data = extra.get("dataset")
    if partial != out_loc and isinstance(data, dict):
        # a store under the staged place ends up under OUT once published
        staged = storage.redact(str(partial))
        if str(data.get("path", "")).startswith(staged + "/"):
            rest = data["path"][len(staged) :]
            extra["dataset"] = {**data, "path": storage.redact(str(out_loc)) + rest}
    metrics = _metrics(state, final, written, info, cfg, extra, total)
    run = {
        "input": info.source,
        "out": storage.redact(str(storage.location(cfg.out))),
        "n_rows": info.n_rows,
        "n_cols": info.n_cols,
        "n_train": info.n_train,
        "columns": info.schema.columns,
        "kinds": info.schema.kinds,
        "structure": info.schema.structure,
        "dropped_constant_columns": info.schema.dropped,
        "missing_cells": info.missing_cells,
        "family": repr(info.family),
        "parameters": _parameters(cfg, info),
        "notes": info.notes,
        "versions": versions(),
        "init": state.init_record,
        "passes": state.history,
        "timing": {**timing, "total": total},
        "metrics": metrics,
        **extra,
    }
    # the small files are written by libraries that want a path (``storage.local_dir``)
    with storage.local_dir(partial) as files:
        clusters.to_parquet(files / "clusters.parquet", index=False)
        if cfg.report:
            t0 = time.perf_counter()
            data = RunData(
                history=state.history,
                stats=final,
                family=info.family,
                schema=info.schema,
                mean=info.moments.mean,
                cov=info.moments.cov,
                plot_X=written.plot_X,
                plot_labels=written.plot_labels,
                contingency=written.contingency,
            )
            rep.write_report(files, run, clusters, data)
            # after "total": the report is timed but is not part of the records per second
            run["timing"]["report"] = time.perf_counter() - t0
        write_run_model(files / "model", cfg, info, final, state.alpha, metrics)
        write_json(files / "run.json", run)
    outputs.publish_output(partial, cfg.out, cfg.overwrite, kind="run")
    return run
