"""The starts of the mixture engines (``FitParams.start``): in-memory MAP-DP on a hash sample
(the default), no cluster, one cluster, random seed records, or the clusters of one ASUGS-PM
streaming pass over every chunk or over the sample.

The "sample" start fits ``run_mapdp`` (sweeps, split and merge moves, learned concentration) to
``init_sample`` training rows of the prior's sample, so the passes only refine it; the sample's
rows keep their labels in pass 1.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

from kernels import mapdp as kmapdp
from kernels import partition as kpartition
from pipeline.core.config import MAX_SEEDS, FitParams
from pipeline.core.seeds import seed_state
from pipeline.core.tasks import on_scattered
from pipeline.data.store import StoreInfo, iter_chunks
from pipeline.engines.base import Chunk, RunContext
from pipeline.engines.mixture_state import IntArray, PassState, chunk_seed, init_sample_rows
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats
from pipeline.models.concentration import map_concentration
from pipeline.models.mapdp import fit_missing, run_mapdp

WARM_START = "warm_start"


def initial_state(client: Any, ctx: RunContext) -> PassState:
    """The state before pass 1: a warm start (``ctx.options["warm_start"]``: the ``Stats`` of a
    fitted model's clusters and its concentration), else ``FitParams.start``."""
    info, params = ctx.info, ctx.params
    fam = info.family
    alpha = 1.0 if params.learn_alpha else float(params.alpha)
    empty = np.zeros(0, dtype=np.int64)
    if ctx.options.get(WARM_START) is not None:
        return warm_state(ctx, *ctx.options[WARM_START])
    start = params.start
    if start == "sample":
        return sample_state(client, info, params)
    if start in ("asugs", "asugs-sample"):
        if info.train_missing:
            from pipeline.core.errors import InputError

            raise InputError(
                f"{info.source}: --init {start} does not take missing cells (column "
                f"{info.first_missing[1] if info.first_missing else '?'!r}); leave --init out"
            )
        return asugs_state(client, ctx)
    if start == "sequential":
        stats = np.zeros((0, fam.n_stats))
        return PassState(0, stats, alpha, empty, 0, empty, init_rows=empty, init_labels=empty)
    if start == "one-cluster":
        futs = [
            client.submit(_train_stats_task, str(ctx.data.path), a, b, fam, pure=False)
            for _c, a, b in iter_chunks(info)
        ]
        parts = client.gather(futs)
        stats = np.sum(parts, axis=0).reshape(1, -1)
        return PassState(0, stats, alpha, np.zeros(1, dtype=np.int64), 1, empty, init_label=0)
    # seeds: random training records as singleton clusters
    n_seeds = params.n_seeds or min(math.ceil(math.sqrt(max(info.n_train, 1))), MAX_SEEDS)
    n_seeds = max(1, min(int(n_seeds), info.n_train))
    rng = np.random.default_rng(chunk_seed(params.seed, params.restart, 0, 0))
    # stored positions of training rows (padding of a grouped store is neither)
    cand = rng.permutation(info.n_stored).astype(np.int64)
    train = ~np.asarray(ctx.data.array("holdout")[:], dtype=bool)
    if info.grouped:
        train &= np.asarray(ctx.data.array("row")[:]) >= 0
    cand = cand[train[cand]]
    seed_rows = np.sort(cand[:n_seeds])
    Xs = np.asarray(
        ctx.data.array("X").get_orthogonal_selection((seed_rows, slice(None))), dtype=np.float64
    )
    labels = np.arange(seed_rows.shape[0], dtype=np.int64)
    stats = fam.stats_of(prior_filled(np.ascontiguousarray(Xs), fam), labels, seed_rows.shape[0])
    return PassState(
        0,
        stats,
        alpha,
        np.arange(seed_rows.shape[0], dtype=np.int64),
        seed_rows.shape[0],
        empty,
        init_rows=seed_rows,
        init_labels=labels,
    )


def prior_filled(X: FloatArray, fam: ProductFamily) -> FloatArray:
    """Records X (n, D) with each missing cell at its prior predictive's conditional mode given
    the row's other cells: the completed records of rows no start placed."""
    if not np.isnan(X).any():
        return X
    return fam.impute(X, fam.empty_stats(), np.full(X.shape[0], -1, dtype=np.int64))


def _sample_fit_task(
    Xs: FloatArray, fam: ProductFamily, order: IntArray, alpha: float, params: FitParams
) -> tuple[IntArray, FloatArray, float, int, float, FloatArray | None]:
    def fit(X: FloatArray, z0: IntArray | None) -> Any:
        return run_mapdp(
            X,
            fam,
            order,
            alpha,
            params.learn_alpha,
            params.alpha_prior,
            100,
            1e-6,
            "sequential",
            z0=z0,
        )

    miss = np.isnan(Xs)
    if not miss.any():
        res = fit(Xs, None)
        return res.labels, res.stats, float(res.alpha), res.n_iter, res.objective, None
    # missing cells by the in-memory ICM (``fit_missing``); the filled cells go with the
    # labels, so that pass 1 starts from the completed records the statistics are of
    res = fit_missing(Xs, fam, fit)
    assert res.completed is not None
    fill = np.where(miss, res.completed, np.nan)
    return res.labels, res.stats, float(res.alpha), res.n_iter, res.objective, fill


def sample_state(client: Any, info: StoreInfo, params: FitParams) -> PassState:
    """The "sample" start: in-memory MAP-DP (``run_mapdp``, with moves) on a hash sample of
    training rows as one Dask task; its rows keep their labels in pass 1."""
    t0 = time.perf_counter()
    fam = info.family
    alpha = 1.0 if params.learn_alpha else float(params.alpha)
    pos = init_sample_rows(info, int(params.init_sample))
    rows = np.asarray(info.sample_rows, dtype=np.int64)[pos]
    Xs = fam.arrange(np.asarray(info.sample)[pos])
    rng = np.random.default_rng(chunk_seed(params.seed, params.restart, 0, 0))
    order = rng.permutation(rows.shape[0]).astype(np.int64)
    # the fit keeps one worker busy and the driver idle: it loads what it will need meanwhile
    threading.Thread(
        target=warm_driver, args=(prior_filled(Xs[:40], fam), fam), daemon=True
    ).start()
    # the sample scattered, not embedded in the task graph
    labels, stats, alpha, n_iter, e, fill = on_scattered(
        client,
        [Xs],
        lambda Xs_f: client.submit(
            _sample_fit_task, Xs_f, fam, order, alpha, params, pure=False
        ).result(),
        what="sample start",
    )
    K = int(stats.shape[0])
    record = {
        "pass": 0,
        "init": "sample",
        "sample_rows": int(rows.shape[0]),
        "sample_iterations": int(n_iter),
        "sample_objective": float(e),
        "n_clusters": K,
        "alpha": float(alpha),
        "seconds": time.perf_counter() - t0,
    }
    return PassState(
        0,
        np.ascontiguousarray(stats),
        float(alpha),
        np.arange(K, dtype=np.int64),
        K,
        np.zeros(0, dtype=np.int64),
        init_rows=rows,
        init_labels=np.asarray(labels, dtype=np.int64),
        init_record=record,
        # a sample of every training row fitted alpha for (n_train, K) already
        alpha_k=K if params.learn_alpha and rows.shape[0] == info.n_train else -1,
        init_fill=fill,
    )


#: the warm-up step of ``warm_reduce``'s kernels (``pipeline.engines.warmup.compile_once``)
MIXTURE_REDUCE_STEP = "mixture-reduce"


def warm_driver(X: FloatArray | None = None, family: ProductFamily | None = None) -> None:
    """Load the kernels ``reduce_pass`` calls, on records X (n, D) of the run's ``family`` when
    given; compiled by one process of the run only (``warmup.compile_once``)."""
    from pipeline.engines.warmup import compile_once

    compile_once(MIXTURE_REDUCE_STEP, lambda: warm_reduce(X, family))


def warm_reduce(X: FloatArray | None = None, family: ProductFamily | None = None) -> None:
    """Load ``reduce_pass``'s kernels on records X of ``family``, by default toy ones."""
    from pipeline.engines.warmup import toy_family

    if X is None or family is None:
        X, family = toy_family()
    n = X.shape[0]
    stats = family.stats_of(X, np.zeros(n, dtype=np.int64), 1)
    nk = np.ascontiguousarray(stats[:, 0])
    kpartition.greedy_merge(stats, nk, family.spec, family.prior, 0.0)
    kmapdp.objective(stats, nk, 1, family.spec, family.prior, 1.0)
    map_concentration(n, 1)


def _train_stats_task(data: str, a: int, b: int, fam: ProductFamily) -> FloatArray:
    chunk = Chunk(data, "", 0, a, b, 0)
    X, hold = chunk.X, chunk.holdout
    return fam.stats_of(prior_filled(np.ascontiguousarray(X[~hold]), fam))[0]


def asugs_state(client: Any, ctx: RunContext) -> PassState:
    """The "asugs" / "asugs-sample" starts: the clusters of one ASUGS-PM pass over every chunk,
    or over the sample start's rows, as a warm start (``warm_state``), with ASUGS's alpha_n
    starting a learned alpha; under ASUGS's own prior unless the run gives a scale."""
    from pipeline.engines.asugs import ENGINE, stream_chunks, stream_sample
    from pipeline.models.asugs import DEFAULT_LAM, PM_INTERVAL, PRUNE_WEIGHT, check_stream_params

    t0 = time.perf_counter()
    info, params, opts = ctx.info, ctx.params, ctx.options
    sp = check_stream_params(
        opts.get("lam", DEFAULT_LAM),
        None,
        opts.get("select", "greedy"),
        True,
        opts.get("pm_interval", PM_INTERVAL),
        opts.get("prune_weight", PRUNE_WEIGHT),
    )
    rng = seed_state(chunk_seed(params.seed, params.restart, 0, 0))
    sinfo = info if params.prior_scale is not None else ENGINE.run_info(info, params)
    if params.start == "asugs":
        st, task_seconds = stream_chunks(client, str(ctx.data.path), sinfo, sp, rng)
    else:
        st = stream_sample(sinfo, params.init_sample, sp, rng)
        task_seconds = time.perf_counter() - t0
    alpha = sp.concentration(st.K, st.n_seen)
    state = warm_state(ctx, Stats(st.cluster_stats, info.family), alpha)
    state.init_record = {
        "pass": 0,
        "init": params.start,
        "asugs_records": int(st.n_seen),
        "asugs_clusters": int(st.K),
        "asugs_pruned": int(st.n_pruned),
        "asugs_merges": int(st.n_merged),
        "asugs_alpha": float(alpha),
        "n_clusters": int(st.K),
        "alpha": float(state.alpha),
        "task_seconds": float(task_seconds),
        "seconds": time.perf_counter() - t0,
    }
    return state


def warm_state(ctx: RunContext, clusters: Stats, alpha: float) -> PassState:
    """A warm start from a fitted model: pass 1 assigns every training record against its
    clusters, then the reduce takes the model's statistics out (``PassState.warm``)."""
    fam = ctx.info.family
    if clusters.signature != fam.signature():
        raise ValueError(
            "the warm start's clusters are of another family, column group or prior than this "
            f"data's: {clusters.signature} and {fam.signature()}"
        )
    K = len(clusters)
    if K == 0:
        raise ValueError("a warm start needs at least one cluster")
    a = float(alpha) if ctx.params.learn_alpha else float(ctx.params.alpha)
    empty = np.zeros(0, dtype=np.int64)
    record = {"pass": 0, "init": "warm", "n_clusters": K, "alpha": a}
    return PassState(
        0,
        clusters.array.copy(),
        a,
        np.arange(K, dtype=np.int64),
        K,
        empty,
        init_record=record,
        warm=clusters.array.copy(),
    )
