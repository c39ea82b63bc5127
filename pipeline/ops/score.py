"""Scoring new records with a fitted model (``dpmm score``), step by step: the Prefect flow
``flows.score`` calls these as tasks.

Ingest validates and encodes the records against the model's schema (``schema=``) into a store in
OUT's temporary sibling; one write-out task per chunk writes each record's eq. 3.5 label (-1: a
new cluster) and eq. 3.4 log density into ``labels.zarr``; the sibling is then renamed to OUT.
Unseen categories are refused, not guessed: the model has no level for them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core import outputs, storage
from pipeline.core.outputs import versions, write_json
from pipeline.core.tasks import map_chunks, on_scattered
from pipeline.data.labels import WriteResult, create_labels, emit_chunk
from pipeline.data.store import Store, StoreInfo, iter_chunks
from pipeline.families import FloatArray, ProductFamily


def open_model(model: str | Path) -> Any:
    """The fitted estimator of ``model`` (a ``PersistError`` naming the file when unreadable),
    which must score with flat clusters: a run's model, MAPDP, the Gibbs samplers or tgMCMC."""
    from pipeline.estimators.model import load_model

    # a model on object storage counts only once its output is committed (its manifest)
    outputs.require_visible(storage.location(model), "model")
    est = load_model(model)
    where = storage.redact(str(storage.location(model) / "model.json"))
    if not hasattr(est, "cluster_stats_") or not hasattr(est, "family_"):
        raise ValueError(
            f"{where}: a {type(est).__name__} model has no cluster "
            "statistics to score with (dpmm score needs a run's model, MAPDP, CollapsedGibbs, "
            "UncollapsedGibbs or TreeGuidedMCMC)"
        )
    if hasattr(est, "state_"):
        # record by record, as a mixture, would ignore the transitions: not the HMM's density
        raise ValueError(
            f"{where}: a {type(est).__name__} model scores whole sequences "
            "(its score_samples(X, lengths)), not records one by one as dpmm score does"
        )
    return est


def prepare(out: str | Path, overwrite: bool) -> storage.Loc:
    """Where the scores are written until complete (``outputs.prepare_output``, never resumed);
    an existing ``out`` is refused unless ``overwrite``."""
    return outputs.prepare_output(out, None, overwrite)[0]


def discard(partial: storage.Loc) -> None:
    storage.rmtree(partial, ignore_errors=True)


def step_ingest(
    client: Any, est: Any, source: Any, partial: storage.Loc, chunk_rows: int
) -> StoreInfo:
    """Validate and encode ``source`` against the model's schema into ``partial/store.zarr``,
    without the columns the fit dropped; missing cells kept unless the model refuses them."""
    from pipeline.data.ingest import ingest

    return ingest(
        source,
        Store(partial / "store.zarr"),
        client=client,
        family=est.family_,
        schema=est.schema_,
        chunk_rows=chunk_rows,
        missing_hint="; the model refuses missing cells (fitted with --missing refuse)",
    )


def score_chunk_task(
    store: str,
    labels: str,
    c: int,
    a: int,
    b: int,
    stats: FloatArray,
    alpha: float,
    family: ProductFamily,
) -> WriteResult:
    """Label (eq. 3.5) and log density (eq. 3.4) of the stored rows [a, b), written to
    ``labels``; the chunk's write-out summary."""
    from pipeline.engines.mixture_state import predict

    X = np.ascontiguousarray(Store(store).array("X")[a:b])
    label, logdens = predict(X, stats, alpha, family)
    hold = np.zeros(b - a, dtype=bool)
    res = emit_chunk(store, labels, c, a, X, hold, label, logdens, 0.0, False)
    # no record is held out here: count the new-cluster labels of all of them
    return replace(res, new_cluster=int((label < 0).sum()))


def write_scores(
    client: Any, est: Any, info: StoreInfo, partial: storage.Loc, progress: bool = False
) -> dict[str, Any]:
    """Every chunk's rows scored into ``partial/labels.zarr`` (``map_chunks``); the summary of
    what was written."""
    t0 = time.perf_counter()
    store = str(partial / "store.zarr")
    labels = str(partial / "labels.zarr")
    create_labels(labels, info, overwrite=True)
    model = (np.ascontiguousarray(est.cluster_stats_), float(est.alpha_), est.family_)
    results: list[WriteResult] = on_scattered(
        client,
        [model],
        lambda model_f: map_chunks(
            client, _score_chunk_packed, list(iter_chunks(info)), (store, labels), (model_f,)
        ),
        what="scoring",
    )
    n = sum(r.train_n for r in results)
    if progress:
        print(f"write-out: {n:,} records scored", file=sys.stderr)
    return {
        "mean_log_density": sum(r.train_sum for r in results) / max(n, 1),
        "new_cluster": sum(r.new_cluster for r in results),
        "seconds": time.perf_counter() - t0,
    }


def _score_chunk_packed(
    store: str, labels: str, c: int, a: int, b: int, model: tuple[Any, ...]
) -> WriteResult:
    stats, alpha, family = model
    return score_chunk_task(store, labels, c, a, b, stats, alpha, family)


def finish(
    model: str | Path,
    source: Any,
    out: str | Path,
    partial: storage.Loc,
    est: Any,
    info: StoreInfo,
    written: dict[str, Any],
    timing: dict[str, float],
    overwrite: bool,
) -> dict[str, Any]:
    """``score.json``, the encoded store removed, then ``partial`` renamed to ``out`` (an
    ``out`` another writer completed meanwhile is replaced only if ``overwrite``)."""
    storage.rmtree(partial / "store.zarr", ignore_errors=True)
    total = sum(timing.values())
    record = {
        "model": storage.redact(str(model)),
        "input": info.source,
        "out": storage.redact(str(out)),
        "n_rows": info.n_rows,
        "columns": info.schema.columns,
        "n_clusters": int(est.n_clusters_),
        "alpha": float(est.alpha_),
        "metrics": {**written, "records_per_second": info.n_rows / total if total > 0 else None},
        "timing": {**timing, "total": total},
        "versions": versions(),
    }
    write_json(partial / "score.json", record)
    outputs.publish_output(partial, out, overwrite, kind="score")
    return record
