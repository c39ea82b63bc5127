"""Write-out: each chunk's step (several chunks a task) writes each row's final label and log
predictive density (eq. 3.4) into the run's ``labels.zarr`` group (label, log_density, holdout),
through the engine's ``score_chunk``; the driver adds the chunks' summaries (held-out sums, the
picture's sample, the contingency table against true labels)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from pipeline.core import storage
from pipeline.core.tasks import map_chunks, on_scattered
from pipeline.data.labels import WriteResult, create_labels
from pipeline.data.store import StoreInfo, iter_chunks
from pipeline.families import FloatArray

if TYPE_CHECKING:
    from pipeline.engines.base import Engine, LoopState, RunContext

IntArray = NDArray[np.int64]


def label_scores(pairs: IntArray) -> dict[str, float]:
    """NMI (arithmetic) and ARI from the contingency triples (3, P) of (true code, label,
    count): additive over chunks, so no labels travel to the driver."""
    import scipy.sparse as sp

    _, ti = np.unique(pairs[0], return_inverse=True)
    _, pi = np.unique(pairs[1], return_inverse=True)
    C = sp.coo_matrix((pairs[2].astype(np.float64), (ti, pi))).tocsr()
    C.sum_duplicates()
    n = float(C.sum())
    a = np.asarray(C.sum(axis=1)).ravel()
    b = np.asarray(C.sum(axis=0)).ravel()

    def entropy(c: FloatArray) -> float:
        p = c[c > 0] / n
        return float(-(p * np.log(p)).sum())

    ht, hp = entropy(a), entropy(b)
    if a.size == b.size == 1 or (ht == 0.0 and hp == 0.0):
        nmi = 1.0
    else:
        # I = H(true) + H(label) - H(true, label), without scikit-learn's mutual_info_score,
        # whose import is most of a second of a command's start-up
        mi = max(ht + hp - entropy(C.data), 0.0)
        nmi = mi / max((ht + hp) / 2.0, np.finfo(np.float64).eps)

    def comb2(v: FloatArray) -> float:
        return float((v * (v - 1.0)).sum() / 2.0)

    sum_ij = comb2(C.data)
    sa, sb = comb2(a), comb2(b)
    expected = sa * sb / (n * (n - 1.0) / 2.0) if n > 1 else 0.0
    top = (sa + sb) / 2.0
    ari = 1.0 if top == expected else (sum_ij - expected) / (top - expected)
    return {"nmi": float(nmi), "ari": float(ari)}


@dataclass
class WriteSummary:
    heldout_mean_log_density: float | None
    train_mean_log_density: float
    n_heldout: int
    heldout_new_cluster: int
    plot_X: FloatArray
    plot_labels: IntArray
    seconds: float
    scores: dict[str, float] | None = None
    by_pass: int | None = None  # the pass that wrote everything (no write-out tasks ran)
    # (3, P): (true label code, label, count), each pair once; None without a label column
    contingency: IntArray | None = None


def write_out(
    client: Any,
    ctx: RunContext,
    engine: Engine,
    state: LoopState,
    mapping: IntArray,
    labels_path: storage.Where,
) -> WriteSummary:
    """Every chunk's rows written to ``labels_path`` (zarr group: label, log_density,
    holdout), several chunks a task (``map_chunks``)."""
    from pipeline.distributed.loop import score_task

    t0 = time.perf_counter()
    info = ctx.info
    labels_path = str(labels_path)
    done = engine.written_by_pass(state, labels_path, mapping)
    if done is not None:
        # the last pass moved nothing and wrote every chunk already
        if ctx.progress:
            print(
                f"write-out: done by pass {state.pass_no}, which moved no record", file=sys.stderr
            )
        return summarize_written(list(done), info, time.perf_counter() - t0, state.pass_no)
    create_labels(labels_path, info, overwrite=True)
    msg = engine.write_input(state, mapping, ctx)
    results: list[WriteResult] = on_scattered(
        client,
        [msg],
        lambda msg_f: map_chunks(
            client,
            score_task,
            list(iter_chunks(info)),
            (engine.name, str(ctx.data.path), str(ctx.state.path), labels_path),
            (state.pass_no + 1, msg_f),
            "write-out" if ctx.progress else None,
        ),
        what="write-out",
    )
    return summarize_written(results, info, time.perf_counter() - t0)


def summarize_written(
    results: list[WriteResult], info: StoreInfo, seconds: float, by_pass: int | None = None
) -> WriteSummary:
    """The ``WriteSummary`` of the chunks' write-out results (any order)."""
    results = sorted(results, key=lambda r: r.c)
    n_hold = sum(r.heldout_n for r in results)
    n_train = sum(r.train_n for r in results)
    scores = contingency = None
    if info.label_column is not None:
        pairs = np.hstack([r.pairs for r in results if r.pairs is not None])
        scores = label_scores(pairs)
        both, at = np.unique(pairs[:2], axis=1, return_inverse=True)
        contingency = np.vstack([both, np.bincount(at.ravel(), weights=pairs[2]).astype(np.int64)])
    return WriteSummary(
        heldout_mean_log_density=(sum(r.heldout_sum for r in results) / n_hold) if n_hold else None,
        train_mean_log_density=sum(r.train_sum for r in results) / max(n_train, 1),
        n_heldout=n_hold,
        heldout_new_cluster=sum(r.new_cluster for r in results),
        plot_X=np.concatenate([r.plot_X for r in results]),
        plot_labels=np.concatenate([r.plot_labels for r in results]),
        seconds=seconds,
        scores=scores,
        by_pass=by_pass,
        contingency=contingency,
    )
