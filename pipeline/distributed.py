"""Stage 1 on Dask: passes with merged global statistics, reconciliation, write-out.

One pass is one Dask task per chunk of the store (``pipeline.store``). A task reads its chunk, the
labels the previous pass wrote for it and a copy of the global statistics, sweeps its training
records (MAP-DP, seed 000 Algorithm 1, ``kernels.mapdp.sweep``; or Bayes K-means, seed 001
Section 5, ``kernels.bayes_kmeans.assign``), writes the chunk's new labels to the other label
buffer itself and returns only statistic deltas and the statistics of the clusters it opened.

Start (``initial_state``, ``FitParams.start``): by default the in-memory MAP-DP of
``pipeline.mapdp_core.run_mapdp`` - sweeps plus split and merge moves, learned concentration - is
fitted to a hash sample of ``init_sample`` training rows (a subset of the prior's sample that ingest
already drew), so pass 1 starts from about the right clusters and global statistics and the
distributed passes only refine them. The sample's rows keep their labels in pass 1; every other
training row is assigned in pass 1.

The driver (``reduce_pass``) adds the deltas in chunk order, merges every new cluster into
another one, new or existing, while a merge lowers the objective (eq. 3.3, from the families' log
marginals; Bayes K-means tests every pair, as its Section 5 merge step), then runs merge moves
over all clusters (``kernels.mapdp.greedy_merge``: the pair whose merge lowers the objective most,
until none does), drops empty clusters and records how the labels written in this pass map to
the new cluster numbers (``PassState.remap``): labels are relabelled lazily, by the next task that
reads them. The objective comes from the statistics alone.

Stop rule (``stop_reason``): after a pass, the run stops when the objective decreased by at most
``tol * |objective|`` (relative) or when at most ``min_change * N_train`` records changed cluster
(moved by the sweeps, or relabelled by a merge of existing clusters), or after ``max_passes``.

Summaries (``split_summaries``): with ``--summaries M`` one more distributed pass after stage 1
splits cluster k into m_k = max(1, round(M n_k / N)) slabs between normal quantiles of the
projection on its principal axis (from its statistics), writes the sub-cluster labels and
returns their statistics; stage 2 (``pipeline.stage2``) maps them to final clusters, and the
write-out applies the mapping.

Determinism: the visiting order of chunk c in pass p is drawn from the SeedSequence child
(restart, p, c) of ``random_state``; a task reads one buffer and writes the other; deltas are
added in chunk order. So the labels do not depend on the number of workers, and a task that is
run again (a worker died, a retry) gives the same result.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from numpy.typing import NDArray

from kernels import bayes_kmeans as kbk
from kernels import mapdp as kmapdp
from kernels.rng import shuffle
from pipeline.concentration import log_gamma_prior, map_concentration
from pipeline.config import INIT_SAMPLE, INITS, MAX_SEEDS, FitParams  # noqa: F401
from pipeline.engines import ENGINES  # noqa: F401
from pipeline.families import FloatArray, ProductFamily
from pipeline.mapdp_core import as_seed_sequence, run_mapdp, seed_state
from pipeline.persist import register
from pipeline.store import (
    DEFAULT_CHUNK_ROWS,
    PLOT_SALT,
    PRIOR_SAMPLE,
    BoolArray,
    Store,
    StoreInfo,
    holdout_mask_of,
    ingest,
    iter_chunks,
    row_uniform,
)

IntArray = NDArray[np.int64]
INIT_SALT = 0x5EED_0004
FAULT_ENV = "DPMM_FAULT_AFTER_PASS"
PLOT_POINTS = 4000


class InjectedFault(RuntimeError):
    """Raised after the pass named by ``$DPMM_FAULT_AFTER_PASS`` (crash-and-resume tests)."""


# -- parameters and state -----------------------------------------------------------------


def seed_entropy(random_state: Any) -> int:
    """One integer of entropy from ``random_state`` (None draws a fresh one)."""
    seq = as_seed_sequence(random_state)
    return int(seq.generate_state(2, dtype=np.uint64).view(np.uint64)[0])


@register
@dataclass
class PassState:
    """The driver's state after ``pass_no`` passes: all a resumed run needs.

    ``remap``, ``k_written`` and ``offsets`` decode the labels the last pass wrote
    (``decode_labels``); ``init_rows`` / ``init_labels`` / ``init_label`` give the start of
    pass 1 (the labels no pass wrote).
    """

    pass_no: int
    stats: FloatArray
    alpha: float
    remap: IntArray
    k_written: int
    offsets: IntArray
    history: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False
    init_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    init_labels: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    init_label: int = -1
    init_record: dict[str, Any] | None = None
    # the learned alpha is the mode of eq. A.1 for (n_train, alpha_k clusters); -1: for
    # something else (fixed, or fitted to the start's sample)
    alpha_k: int = -1
    # when the pass moved no record and left statistics and alpha bit for bit as they were,
    # its chunk tasks have already written every row's final label and eq. 3.4 density into
    # ``scored_into`` (``sweep_chunk_task``): their write-out results, by chunk
    scored: list[WriteResult] | None = None
    scored_into: str | None = None

    @property
    def n_clusters(self) -> int:
        return int(self.stats.shape[0])

    @property
    def nk(self) -> FloatArray:
        return np.ascontiguousarray(self.stats[:, 0])

    @property
    def objective(self) -> float:
        return float(self.history[-1]["objective"]) if self.history else math.inf

    @property
    def buffer(self) -> str:
        """The label buffer the last pass wrote (z0 before any pass: only -1)."""
        return f"z{self.pass_no % 2}"


def decode_labels(raw: IntArray, remap: IntArray, k_written: int, offset: int) -> IntArray:
    """Labels as a pass wrote them for a chunk (0..K-1 for the clusters the pass started with,
    K.. for those the chunk opened) as the current cluster numbers; -1 stays -1."""
    out = np.full(raw.shape[0], -1, dtype=np.int64)
    m = raw >= 0
    lab = raw[m]
    idx = np.where(lab < k_written, lab, lab + offset)
    out[m] = remap[idx]
    return out


# -- the chunk task ----------------------------------------------------------------------------


@dataclass
class PassInput:
    """What every chunk task of one pass receives (scattered once per pass)."""

    p: int
    engine: str
    stats: FloatArray
    alpha: float
    remap: IntArray
    k_written: int
    offsets: IntArray
    family: ProductFamily
    seed: int
    restart: int
    init_rows: IntArray
    init_labels: IntArray
    init_label: int
    # write-out fused into the pass (MAP-DP engine): the labels group to write into, the
    # share of rows kept for the projection picture, and whether the store has true labels
    scores_into: str | None = None
    plot_rate: float = 0.0
    has_y: bool = False


@dataclass
class ChunkResult:
    c: int
    delta: FloatArray
    new_stats: FloatArray
    n_changed: int
    n_train: int
    seconds: float
    written: WriteResult | None = None


def chunk_seed(seed: int, restart: int, p: int, c: int) -> np.random.SeedSequence:
    """The SeedSequence child (restart, pass, chunk) of the run's entropy."""
    return np.random.SeedSequence(seed, spawn_key=(restart, p, c))


def sweep_chunk_task(store: str, c: int, a: int, b: int, msg: PassInput) -> ChunkResult:
    """One chunk of one pass (module docstring). Idempotent: reads buffer z[(p-1) % 2], writes
    buffer z[p % 2], and its random order depends only on (seed, restart, p, c)."""
    t0 = time.perf_counter()
    fam = msg.family
    X = np.ascontiguousarray(zarr.open_array(f"{store}/X", mode="r")[a:b])
    hold = np.asarray(zarr.open_array(f"{store}/holdout", mode="r")[a:b])
    raw = np.asarray(zarr.open_array(f"{store}/z{(msg.p - 1) % 2}", mode="r")[a:b])
    K = msg.stats.shape[0]
    if msg.p == 1:
        z = np.full(b - a, -1, dtype=np.int64)
        if msg.init_label >= 0:
            z[~hold] = msg.init_label
        sel = (msg.init_rows >= a) & (msg.init_rows < b)
        z[msg.init_rows[sel] - a] = msg.init_labels[sel]
    else:
        z = decode_labels(raw, msg.remap, msg.k_written, int(msg.offsets[c]))
    order = np.flatnonzero(~hold).astype(np.int64)
    shuffle(seed_state(chunk_seed(msg.seed, msg.restart, msg.p, c)), order)
    z_old = z.copy()
    spec, prior = fam.spec, fam.prior
    empty_c = fam.empty_cache()
    log_alpha = math.log(msg.alpha)
    written = None
    if msg.engine == "mapdp":
        cap = K + 8
        stats = np.zeros((cap, fam.n_stats))
        stats[:K] = msg.stats
        cache = np.zeros((cap, fam.n_cache))
        cache[:K] = fam.cache_of(msg.stats)
        nk = np.zeros(cap)
        nk[:K] = msg.stats[:, 0]
        logdens = np.full(b - a, np.nan) if msg.scores_into else np.empty(0)
        stats, cache, nk, n_slots, n_changed = kmapdp.sweep_scored(
            X, order, z, stats, cache, nk, K, spec, prior, empty_c, msg.alpha, logdens
        )
        if msg.scores_into and n_changed == 0:
            # nothing moved: every training row was scored against msg.stats; score the
            # held-out rows against them too and write the chunk out (``write_chunk_task``)
            label = z.copy()
            if hold.any():
                pred, ld = kmapdp.predict(
                    X[hold], msg.stats, cache[:K], nk[:K], spec, prior, empty_c, msg.alpha
                )
                label[hold] = pred
                logdens[hold] = ld
            written = emit_chunk(
                store, msg.scores_into, c, a, X, hold, label, logdens, msg.plot_rate, msg.has_y
            )
        # number the slots opened here K, K + 1, ... in slot order
        slot_map = np.arange(max(n_slots, K), dtype=np.int64)
        new_slots = [s for s in range(K, n_slots) if nk[s] > 0]
        for j, s in enumerate(new_slots):
            slot_map[s] = K + j
        z = np.where(z >= K, slot_map[np.maximum(z, 0)], z)
        M = len(new_slots)
    else:
        cache_k = fam.cache_of(msg.stats)
        nk_k = np.ascontiguousarray(msg.stats[:, 0])
        new_stats, n_changed = kbk.assign(
            X, order, z, msg.stats, cache_k, nk_k, K, spec, prior, empty_c, log_alpha
        )
        M = new_stats.shape[0]
    delta, new_stats = kbk.label_deltas(X, order, z_old, z, K, M, spec, fam.n_stats)
    z[hold] = -1
    zarr.open_array(f"{store}/z{msg.p % 2}", mode="r+")[a:b] = z
    return ChunkResult(
        c,
        delta,
        new_stats,
        int(n_changed),
        int(order.shape[0]),
        time.perf_counter() - t0,
        written,
    )


# -- the driver ----------------------------------------------------------------------------------


def objective(stats: FloatArray, alpha: float, family: ProductFamily, params: FitParams) -> float:
    """-log p(X, z | N0) (seed 000, eq. 3.3) from the statistics, minus log p(N0) when learned."""
    nk = np.ascontiguousarray(stats[:, 0])
    e = float(kmapdp.objective(stats, nk, stats.shape[0], family.spec, family.prior, alpha))
    if params.learn_alpha:
        e -= log_gamma_prior(alpha, *params.alpha_prior)
    return e


def reconcile(
    stats: FloatArray, candidates: IntArray, family: ProductFamily, log_alpha: float
) -> tuple[FloatArray, IntArray, int]:
    """Greedy merges: each candidate j in turn merges into the cluster k that lowers the
    objective most (``kernels.bayes_kmeans.merge_costs``), if any does; repeated until no merge
    happens. Returns the merged statistics (merged rows zeroed), the cluster each row ended in,
    and the number of merges."""
    stats = stats.copy()
    spec, prior = family.spec, family.prior
    logm = kbk.log_marginals(stats, spec, prior)
    alive = stats[:, 0] > 0
    parent = np.arange(stats.shape[0], dtype=np.int64)
    merges = 0
    changed = True
    while changed:
        changed = False
        for j in candidates:
            if not alive[j]:
                continue
            costs = kbk.merge_costs(stats, logm, alive, int(j), spec, prior, log_alpha)
            k = int(np.argmin(costs))
            if costs[k] < 0.0:
                stats[k] += stats[j]
                stats[j] = 0.0
                alive[j] = False
                parent[j] = k
                logm[k] = family.log_marginal_stats(stats[k])
                merges += 1
                changed = True
    # follow chains j -> k -> ... to the surviving cluster
    for j in range(parent.shape[0]):
        r = j
        while parent[r] != r:
            r = parent[r]
        parent[j] = r
    return stats, parent, merges


def merged_records(sizes: FloatArray, target: IntArray) -> int:
    """Records whose cluster number changes when clusters of ``sizes`` merge by ``target``:
    all but the largest contributor of each merged cluster."""
    if sizes.size == 0:
        return 0
    best = np.zeros(int(target.max()) + 1)
    np.maximum.at(best, target, sizes)
    return round(float(sizes.sum() - best.sum()))


def stop_reason(
    e_old: float, e_new: float, changed: int, n_train: int, params: FitParams
) -> str | None:
    """Why the run stops after a pass (None: it goes on; ``max_passes`` is the caller's).

    "objective": the pass lowered the objective by at most ``tol * |e_new|`` (relative; a pass
    that raised it stops too); "changes": at most ``min_change * n_train`` records changed
    cluster (sweep moves plus records relabelled by merges of existing clusters).
    """
    if changed <= params.min_change * n_train:
        return "changes"
    if math.isfinite(e_old) and e_old - e_new <= params.tol * abs(e_new):
        return "objective"
    return None


def reduce_pass(
    state: PassState,
    results: list[ChunkResult],
    family: ProductFamily,
    params: FitParams,
    n_train: int,
    scored_into: str | None = None,
) -> tuple[PassState, dict[str, Any]]:
    """The driver's half of a pass (module docstring): new state and the pass's record.

    ``scored_into``: the labels group the chunk tasks wrote their scores into, if asked to.
    """
    results = sorted(results, key=lambda r: r.c)
    K = state.n_clusters
    stats = state.stats.copy()
    for r in results:
        stats += r.delta
    offsets = np.zeros(len(results), dtype=np.int64)
    blocks = [stats]
    m = 0
    for r in results:
        offsets[r.c] = m
        blocks.append(r.new_stats)
        m += r.new_stats.shape[0]
    everything = np.vstack(blocks)
    alpha = state.alpha
    n_changed = sum(r.n_changed for r in results)
    if params.engine == "kmeans" or params.merge_all:
        # Section 5's merge step: every pair, greedily, after the assignment step
        candidates = np.arange(everything.shape[0], dtype=np.int64)
    else:
        candidates = np.arange(K, everything.shape[0], dtype=np.int64)
    log_alpha = math.log(alpha)
    merged, parent, merges = reconcile(everything, candidates, family, log_alpha)
    keep = merged[:, 0] > 0.5
    new_id = np.full(merged.shape[0], -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    stats = np.ascontiguousarray(merged[keep])
    # merge moves over all clusters, by the exact decrease of the objective
    target, stats, global_merges = kmapdp.greedy_merge(
        stats, np.ascontiguousarray(stats[:, 0]), family.spec, family.prior, log_alpha
    )
    stats = np.ascontiguousarray(stats)
    idx = new_id[parent]
    remap = np.where(idx >= 0, target[np.maximum(idx, 0)], -1).astype(np.int64)
    relabelled = merged_records(merged[keep][:, 0], target)
    if params.learn_alpha and state.alpha_k != stats.shape[0]:
        # eq. A.1 depends on the data only through N and K: with both unchanged the current
        # alpha is already its mode, and keeping it exactly is what lets a pass that moved
        # nothing leave the model bit for bit as it was
        alpha = map_concentration(n_train, stats.shape[0], *params.alpha_prior, start=alpha)
    e = objective(stats, alpha, family, params)
    changed = int(n_changed) + relabelled
    record: dict[str, Any] = {
        "pass": state.pass_no + 1,
        "objective": e,
        "n_clusters": int(stats.shape[0]),
        "n_new": int(m),
        "merges": int(merges),
        "global_merges": int(global_merges),
        "n_changed": int(n_changed),
        "changed_fraction": changed / max(n_train, 1),
        "alpha": float(alpha),
        "task_seconds": float(sum(r.seconds for r in results)),
    }
    reason = stop_reason(state.objective, e, changed, n_train, params)
    record["stop"] = reason
    converged = reason is not None
    scored = None
    unchanged = (
        stats.shape == state.stats.shape
        and bool(np.array_equal(stats, state.stats))
        and alpha == state.alpha
        and bool(np.array_equal(remap, np.arange(K)))
    )
    if unchanged and results and all(r.written is not None for r in results):
        scored = [r.written for r in results if r.written is not None]
    new = PassState(
        pass_no=state.pass_no + 1,
        stats=stats,
        alpha=float(alpha),
        remap=remap,
        k_written=K,
        offsets=offsets,
        history=[*state.history, record],
        converged=bool(converged),
        init_record=state.init_record,
        alpha_k=int(stats.shape[0]) if params.learn_alpha else -1,
        scored=scored,
        scored_into=scored_into if scored is not None else None,
    )
    return new, record


def initial_state(client: Any, store: Store, info: StoreInfo, params: FitParams) -> PassState:
    """The state before pass 1 (``FitParams.start``)."""
    fam = info.family
    alpha = 1.0 if params.learn_alpha else float(params.alpha)
    empty = np.zeros(0, dtype=np.int64)
    start = params.start
    if start == "sample":
        return sample_state(client, info, params)
    if start == "sequential":
        stats = np.zeros((0, fam.n_stats))
        return PassState(0, stats, alpha, empty, 0, empty, init_rows=empty, init_labels=empty)
    if start == "one-cluster":
        futs = [
            client.submit(_train_stats_task, str(store.path), a, b, fam, pure=False)
            for _c, a, b in iter_chunks(info)
        ]
        parts = client.gather(futs)
        stats = np.sum(parts, axis=0).reshape(1, -1)
        return PassState(0, stats, alpha, np.zeros(1, dtype=np.int64), 1, empty, init_label=0)
    # seeds: random training records as singleton clusters
    n_seeds = params.n_seeds or min(math.ceil(math.sqrt(max(info.n_train, 1))), MAX_SEEDS)
    n_seeds = max(1, min(int(n_seeds), info.n_train))
    rng = np.random.default_rng(chunk_seed(params.seed, params.restart, 0, 0))
    cand = rng.permutation(info.n_rows).astype(np.int64)
    cand = cand[~holdout_mask_of(cand, info.holdout)]
    seed_rows = np.sort(cand[:n_seeds])
    Xs = np.asarray(store.array("X").get_orthogonal_selection((seed_rows, slice(None))))
    labels = np.arange(seed_rows.shape[0], dtype=np.int64)
    stats = fam.stats_of(np.ascontiguousarray(Xs), labels, seed_rows.shape[0])
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


def init_sample_rows(info: StoreInfo, n: int) -> IntArray:
    """Positions in ``info.sample`` of the "sample" start: the ``n`` prior-sample rows with the
    smallest hash ``row_uniform(row, INIT_SALT)``, in row order (all of them when fewer)."""
    rows = np.asarray(info.sample_rows, dtype=np.int64)
    if rows.shape[0] <= n:
        return np.arange(rows.shape[0], dtype=np.int64)
    pick = np.argsort(row_uniform(rows, INIT_SALT), kind="stable")[:n]
    return np.sort(pick).astype(np.int64)


def _sample_fit_task(
    Xs: FloatArray, fam: ProductFamily, order: IntArray, alpha: float, params: FitParams
) -> tuple[IntArray, FloatArray, float, int, float]:
    res = run_mapdp(
        Xs,
        fam,
        order,
        alpha,
        params.learn_alpha,
        params.alpha_prior,
        100,
        1e-6,
        "sequential",
    )
    return res.labels, res.stats, float(res.alpha), res.n_iter, res.objective


def sample_state(client: Any, info: StoreInfo, params: FitParams) -> PassState:
    """The "sample" start (module docstring): in-memory MAP-DP (``pipeline.mapdp_core.run_mapdp``,
    with split and merge moves) on a hash sample of training rows, run as one Dask task; its
    rows keep their labels in pass 1 and its statistics are pass 1's global statistics."""
    t0 = time.perf_counter()
    fam = info.family
    alpha = 1.0 if params.learn_alpha else float(params.alpha)
    pos = init_sample_rows(info, int(params.init_sample))
    rows = np.asarray(info.sample_rows, dtype=np.int64)[pos]
    Xs = fam.arrange(np.asarray(info.sample)[pos])
    rng = np.random.default_rng(chunk_seed(params.seed, params.restart, 0, 0))
    order = rng.permutation(rows.shape[0]).astype(np.int64)
    Xs_f = client.scatter(Xs, hash=False)  # not embedded in the task graph
    fut = client.submit(_sample_fit_task, Xs_f, fam, order, alpha, params, pure=False)
    # the fit keeps one worker busy and the driver idle: the driver loads what it will need
    # meanwhile (workers did so when they started: ``pipeline.worker_setup``)
    few = np.ascontiguousarray(Xs[: min(4, Xs.shape[0])])
    threading.Thread(target=warm_driver, args=(few, fam), daemon=True).start()
    labels, stats, alpha, n_iter, e = fut.result()
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
    )


def warm_driver(X: FloatArray, family: ProductFamily) -> None:
    """Load, on a few records X (n, D), the numba kernels ``reduce_pass`` calls and the report's
    matplotlib, so that their first real call does not pay for loading them."""
    spec, prior = family.spec, family.prior
    n = X.shape[0]
    stats = family.stats_of(X, np.zeros(n, dtype=np.int64), 1)
    nk = np.ascontiguousarray(stats[:, 0])
    logm = kbk.log_marginals(stats, spec, prior)
    kbk.merge_costs(stats, logm, np.ones(1, dtype=np.bool_), 0, spec, prior, 0.0)
    kmapdp.greedy_merge(stats, nk, spec, prior, 0.0)
    kmapdp.objective(stats, nk, 1, spec, prior, 1.0)
    map_concentration(max(n, 2), 1)
    from pipeline import report

    report.load_matplotlib()


def _train_stats_task(store: str, a: int, b: int, fam: ProductFamily) -> FloatArray:
    X = np.ascontiguousarray(zarr.open_array(f"{store}/X", mode="r")[a:b])
    hold = np.asarray(zarr.open_array(f"{store}/holdout", mode="r")[a:b])
    return fam.stats_of(np.ascontiguousarray(X[~hold]))[0]


def run_pass(
    client: Any,
    store: Store,
    info: StoreInfo,
    params: FitParams,
    state: PassState,
    progress: bool = False,
    labels_out: str | os.PathLike[str] | None = None,
) -> PassState:
    """One pass: a task per chunk, then ``reduce_pass``; checkpoints the new state.

    With ``labels_out`` (the write-out's labels group) and the MAP-DP engine, every chunk task
    that moves no record also writes its rows' labels and eq. 3.4 densities there; when the
    whole pass moved nothing, ``write_out`` has nothing left to do.
    """
    from distributed import as_completed

    t0 = time.perf_counter()
    p = state.pass_no + 1
    scores_into = None
    if labels_out is not None and params.engine == "mapdp":
        scores_into = str(labels_out)
        create_labels(scores_into, info, overwrite=False)
    msg = PassInput(
        p=p,
        engine=params.engine,
        stats=state.stats,
        alpha=state.alpha,
        remap=state.remap,
        k_written=state.k_written,
        offsets=state.offsets,
        family=info.family,
        seed=params.seed,
        restart=params.restart,
        init_rows=state.init_rows,
        init_labels=state.init_labels,
        init_label=state.init_label,
        scores_into=scores_into,
        plot_rate=plot_rate(info),
        has_y=info.label_column is not None,
    )
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    futs = [
        client.submit(sweep_chunk_task, str(store.path), c, a, b, msg_f, pure=False)
        for c, a, b in iter_chunks(info)
    ]
    bar = _bar(progress, info.n_train, f"pass {p}")
    results = []
    for fut in as_completed(futs):
        r = fut.result()
        results.append(r)
        if bar is not None:
            bar.update(r.n_train)
    if bar is not None:
        bar.close()
    del msg_f
    new, record = reduce_pass(state, results, info.family, params, info.n_train, scores_into)
    seconds = time.perf_counter() - t0
    record["seconds"] = seconds
    record["records_per_second"] = info.n_train / seconds if seconds > 0 else math.inf
    save_checkpoint(store, new, params)
    if progress:
        print(
            f"pass {p}: objective {record['objective']:.6g}, {record['n_clusters']} clusters, "
            f"{record['n_changed']} moved, {record['merges']} merges, "
            f"{record['records_per_second']:,.0f} records/s",
            file=sys.stderr,
        )
    return new


def _bar(progress: bool, total: int, desc: str) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="rec", unit_scale=True, leave=False, file=sys.stderr)


def save_checkpoint(store: Store, state: PassState, params: FitParams) -> None:
    """The state after a completed pass, replaced atomically (the record ``checkpoint_state``)."""
    store.save("checkpoint_state", {"params": params, "state": state})
    import json

    store.save_text(
        "checkpoint.json",
        json.dumps(
            {
                "pass": state.pass_no,
                "objective": state.objective,
                "n_clusters": state.n_clusters,
                "converged": state.converged,
            }
        ),
    )


def load_checkpoint(store: Store, params: FitParams) -> PassState | None:
    """The last completed pass's state if the store has one from the same parameters."""
    if not store.exists("checkpoint_state"):
        return None
    ck = store.load("checkpoint_state", dict)
    saved: FitParams = ck["params"]
    same = replace(
        saved, max_passes=params.max_passes, tol=params.tol, min_change=params.min_change
    )
    if same != params:
        return None
    state: PassState = ck["state"]
    return state


def run_passes(
    client: Any,
    store: Store,
    info: StoreInfo,
    params: FitParams,
    progress: bool = False,
    resume: bool = True,
    on_pass: Callable[[PassState], None] | None = None,
    labels_out: str | os.PathLike[str] | None = None,
) -> PassState:
    """Passes until convergence or ``max_passes``, resuming from the store's checkpoint
    (``labels_out``: as ``run_pass``)."""
    params = params.checked()
    state = load_checkpoint(store, params) if resume else None
    if state is None:
        state = initial_state(client, store, info, params)
    elif progress:
        print(f"resuming after pass {state.pass_no}", file=sys.stderr)
    while not state.converged and state.pass_no < params.max_passes:
        state = run_pass(client, store, info, params, state, progress, labels_out)
        check_fault(state)
        if on_pass is not None:
            on_pass(state)
    return state


def check_fault(state: PassState) -> None:
    """Raise ``InjectedFault`` after the pass named by ``$DPMM_FAULT_AFTER_PASS`` (tests)."""
    fault = os.environ.get(FAULT_ENV)
    if fault and int(fault) == state.pass_no:
        raise InjectedFault(f"fault injected after pass {state.pass_no} (${FAULT_ENV})")


# -- summaries: stage 1 split into about M sub-clusters ----------------------------------------


def summary_counts(nk: FloatArray, M: int) -> IntArray:
    """Sub-clusters of each stage-1 cluster: m_k = max(1, round(M n_k / N))."""
    n = float(nk.sum())
    return np.maximum(1, np.rint(M * nk / max(n, 1.0))).astype(np.int64)


def gaussian_moments(stats: FloatArray, family: ProductFamily) -> tuple[FloatArray, FloatArray]:
    """Mean (K, D) and covariance (K, D, D) of each cluster's records from its statistics, when
    every group of the family is a full-covariance Gaussian (block-diagonal across groups)."""
    from kernels.families import product as kp

    K, D = stats.shape[0], family.n_cols
    mean = np.zeros((K, D))
    cov = np.zeros((K, D, D))
    n = np.maximum(stats[:, 0], 1.0)
    for r in family.spec:
        c0, nc, s0 = int(r[kp.COL0]), int(r[kp.NCOL]), int(r[kp.STAT0])
        m = stats[:, s0 + 1 : s0 + 1 + nc] / n[:, None]
        xx = stats[:, s0 + 1 + nc : s0 + 1 + nc + nc * nc].reshape(K, nc, nc) / n[:, None, None]
        mean[:, c0 : c0 + nc] = m
        cov[:, c0 : c0 + nc, c0 : c0 + nc] = xx - m[:, :, None] * m[:, None, :]
    return mean, cov


def _moments_task(store: str, c: int, a: int, b: int, msg: SplitInput) -> tuple[Any, ...]:
    X = np.ascontiguousarray(zarr.open_array(f"{store}/X", mode="r")[a:b])
    raw = np.asarray(zarr.open_array(f"{store}/{msg.buffer}", mode="r")[a:b])
    z = decode_labels(raw, msg.remap, msg.k_written, int(msg.offsets[c]))
    m = z >= 0
    K, D = msg.n_parent, X.shape[1]
    n = np.bincount(z[m], minlength=K).astype(np.float64)
    s1 = np.zeros((K, D))
    np.add.at(s1, z[m], X[m])
    s2 = np.zeros((K, D, D))
    order = np.argsort(z[m], kind="stable")
    Xm, zm = X[m][order], z[m][order]
    bounds = np.searchsorted(zm, np.arange(K + 1))
    for k in range(K):
        Xk = Xm[bounds[k] : bounds[k + 1]]
        s2[k] = Xk.T @ Xk
    return n, s1, s2


def data_moments(
    client: Any, store: Store, info: StoreInfo, state: PassState
) -> tuple[FloatArray, FloatArray]:
    """Mean and covariance of each cluster's (arranged) records by one pass over the chunks:
    for families whose statistics do not hold them."""
    msg = _split_input(state, info, np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    futs = [
        client.submit(_moments_task, str(store.path), c, a, b, msg_f, pure=False)
        for c, a, b in iter_chunks(info)
    ]
    parts = client.gather(futs)
    n = np.maximum(sum(p[0] for p in parts), 1.0)
    mean = sum(p[1] for p in parts) / n[:, None]
    xx = sum(p[2] for p in parts) / n[:, None, None]
    return mean, xx - mean[:, :, None] * mean[:, None, :]


@dataclass
class SplitInput:
    """What every chunk task of the summaries pass receives."""

    buffer: str
    out_buffer: str
    remap: IntArray
    k_written: int
    offsets: IntArray
    n_parent: int
    family: ProductFamily
    mean: FloatArray  # (K, D)
    axis: FloatArray  # (K, D) unit principal axis
    cuts: FloatArray  # (K, max m_k - 1), +inf padded
    base: IntArray  # (K,) first sub-cluster of each cluster
    n_sub: int


def _split_input(
    state: PassState, info: StoreInfo, mean: FloatArray, axis: FloatArray, cuts: FloatArray
) -> SplitInput:
    K = state.n_clusters
    m = 1 + np.sum(np.isfinite(cuts), axis=1) if cuts.size else np.ones(K, dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64) if K else np.zeros(0)
    return SplitInput(
        buffer=state.buffer,
        out_buffer=f"z{(state.pass_no + 1) % 2}",
        remap=state.remap,
        k_written=state.k_written,
        offsets=state.offsets,
        n_parent=K,
        family=info.family,
        mean=mean,
        axis=axis,
        cuts=cuts,
        base=np.asarray(base, dtype=np.int64),
        n_sub=int(np.sum(m)) if K else 0,
    )


def _split_chunk_task(store: str, c: int, a: int, b: int, msg: SplitInput) -> tuple[int, Any]:
    """Sub-cluster of every training row of a chunk (quantile slab of the projection on its
    cluster's principal axis), written to ``out_buffer``; returns the sub-clusters' statistics."""
    X = np.ascontiguousarray(zarr.open_array(f"{store}/X", mode="r")[a:b])
    raw = np.asarray(zarr.open_array(f"{store}/{msg.buffer}", mode="r")[a:b])
    z = decode_labels(raw, msg.remap, msg.k_written, int(msg.offsets[c]))
    m = z >= 0
    sub = np.full(z.shape[0], -1, dtype=np.int64)
    zk = z[m]
    t = np.einsum("nd,nd->n", X[m] - msg.mean[zk], msg.axis[zk])
    j = (msg.cuts[zk] < t[:, None]).sum(axis=1) if msg.cuts.shape[1] else np.zeros(zk.shape[0])
    sub[m] = msg.base[zk] + j.astype(np.int64)
    stats = msg.family.stats_of(X, sub, msg.n_sub)
    zarr.open_array(f"{store}/{msg.out_buffer}", mode="r+")[a:b] = sub
    return c, stats


@dataclass
class Summaries:
    """The summaries pass: the state whose clusters are the sub-clusters, and the stage-1
    cluster each came from."""

    state: PassState
    parent: IntArray
    record: dict[str, Any]


def split_summaries(
    client: Any,
    store: Store,
    info: StoreInfo,
    state: PassState,
    M: int,
    progress: bool = False,
) -> Summaries:
    """One distributed pass after stage 1: cluster k becomes m_k = max(1, round(M n_k / N))
    sub-clusters, slabs between the quantiles j / m_k (j = 1..m_k - 1) of the projection of its
    records on its principal axis under a normal approximation (mean, covariance from the
    statistics, or from one moments pass for non-Gaussian families). Every chunk computes the
    cut points alike, so nothing is communicated but the sub-clusters' statistics. Empty
    sub-clusters are dropped. Labels go to the other buffer; the returned state decodes them."""
    from scipy.special import ndtri

    t0 = time.perf_counter()
    from kernels.families import product as kp

    K = state.n_clusters
    counts = summary_counts(state.nk, int(M))
    if np.all(info.family.spec[:, kp.CODE] == kp.GAUSSIAN_NW):
        mean, cov = gaussian_moments(state.stats, info.family)
    else:
        mean, cov = data_moments(client, store, info, state)
    D = mean.shape[1]
    axis = np.zeros((K, D))
    width = max(int(counts.max()) - 1, 0) if K else 0
    cuts = np.full((K, width), np.inf)
    for k in range(K):
        w, v = np.linalg.eigh((cov[k] + cov[k].T) / 2.0)
        axis[k] = v[:, -1]
        mk = int(counts[k])
        if mk > 1:
            q = ndtri(np.arange(1, mk) / mk)
            cuts[k, : mk - 1] = math.sqrt(max(float(w[-1]), 0.0)) * q
    msg = _split_input(state, info, mean, axis, cuts)
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    futs = [
        client.submit(_split_chunk_task, str(store.path), c, a, b, msg_f, pure=False)
        for c, a, b in iter_chunks(info)
    ]
    parts = sorted(client.gather(futs), key=lambda r: r[0])
    sub_stats = np.sum([p[1] for p in parts], axis=0).reshape(msg.n_sub, -1)
    keep = sub_stats[:, 0] > 0.5
    new_id = np.full(msg.n_sub, -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    parent_all = np.repeat(np.arange(K, dtype=np.int64), counts)
    seconds = time.perf_counter() - t0
    record = {
        "pass": state.pass_no + 1,
        "summaries": int(keep.sum()),
        "requested": int(M),
        "n_clusters": int(keep.sum()),
        "seconds": seconds,
    }
    new = PassState(
        pass_no=state.pass_no + 1,
        stats=np.ascontiguousarray(sub_stats[keep]),
        alpha=state.alpha,
        remap=new_id,
        k_written=msg.n_sub,
        offsets=np.zeros(info.n_chunks, dtype=np.int64),
        history=list(state.history),
        converged=state.converged,
        init_record=state.init_record,
    )
    if progress:
        print(
            f"summaries: {record['summaries']} sub-clusters of {K} clusters, {seconds:.1f} s",
            file=sys.stderr,
        )
    return Summaries(new, parent_all[keep], record)


# -- stage 2 hook ----------------------------------------------------------------------------

Stage2 = Callable[[FloatArray, ProductFamily], IntArray]


def identity_stage2(stats: FloatArray, family: ProductFamily) -> IntArray:
    """The default stage 2: every stage-1 cluster is a final cluster.

    A stage 2 (BHC over the cluster summaries) takes the stage-1 statistics (K, S) and the
    family and returns, for each stage-1 cluster, its final cluster 0..K2-1.
    """
    return np.arange(stats.shape[0], dtype=np.int64)


def merge_by(stats: FloatArray, mapping: IntArray) -> FloatArray:
    """Statistics of the final clusters: rows of ``stats`` added by ``mapping``."""
    K2 = int(mapping.max()) + 1 if mapping.size else 0
    out = np.zeros((K2, stats.shape[1]))
    np.add.at(out, mapping, stats)
    return out


# -- write-out ---------------------------------------------------------------------------------


@dataclass
class WriteInput:
    buffer: str
    remap: IntArray
    k_written: int
    offsets: IntArray
    mapping: IntArray
    stats: FloatArray  # final clusters
    alpha: float
    family: ProductFamily
    plot_rate: float
    labels: bool = False


@register
@dataclass
class WriteResult:
    c: int
    heldout_sum: float
    heldout_n: int
    train_sum: float
    train_n: int
    new_cluster: int
    plot_X: FloatArray
    plot_labels: IntArray
    pairs: IntArray | None = None  # (3, P): true label code, final label, count


def write_chunk_task(
    store: str, labels: str, c: int, a: int, b: int, msg: WriteInput
) -> WriteResult:
    """Final label and log predictive density (eq. 3.4) of every row of a chunk, written to
    ``labels``; held-out rows get the MAP label of eq. 3.5 (-1: a new cluster)."""
    fam = msg.family
    X = np.ascontiguousarray(zarr.open_array(f"{store}/X", mode="r")[a:b])
    hold = np.asarray(zarr.open_array(f"{store}/holdout", mode="r")[a:b])
    raw = np.asarray(zarr.open_array(f"{store}/{msg.buffer}", mode="r")[a:b])
    z1 = decode_labels(raw, msg.remap, msg.k_written, int(msg.offsets[c]))
    final = np.where(z1 >= 0, msg.mapping[np.maximum(z1, 0)], -1)
    nk = np.ascontiguousarray(msg.stats[:, 0])
    pred, logdens = kmapdp.predict(
        X,
        msg.stats,
        fam.cache_of(msg.stats),
        nk,
        fam.spec,
        fam.prior,
        fam.empty_cache(),
        msg.alpha,
    )
    label = np.where(hold, pred, final)
    return emit_chunk(store, labels, c, a, X, hold, label, logdens, msg.plot_rate, msg.labels)


def emit_chunk(
    store: str,
    labels: str,
    c: int,
    a: int,
    X: FloatArray,
    hold: BoolArray,
    label: IntArray,
    logdens: FloatArray,
    plot_rate: float,
    has_y: bool,
) -> WriteResult:
    """Write chunk c's final labels (N,), eq. 3.4 log densities (N,) and held-out flags (N,)
    at rows a.. of the ``labels`` group; its write-out summary (sums, picture sample and the
    contingency triples against the true labels ``y`` when ``has_y``)."""
    b = a + X.shape[0]
    zarr.open_array(f"{labels}/label", mode="r+")[a:b] = label
    zarr.open_array(f"{labels}/log_density", mode="r+")[a:b] = logdens
    zarr.open_array(f"{labels}/holdout", mode="r+")[a:b] = hold
    pick = row_uniform(np.arange(a, b), PLOT_SALT) < plot_rate
    pairs = None
    if has_y:
        y = np.asarray(zarr.open_array(f"{store}/y", mode="r")[a:b], dtype=np.int64)
        both, counts = np.unique(np.vstack([y, label]), axis=1, return_counts=True)
        pairs = np.vstack([both, counts.astype(np.int64)])
    return WriteResult(
        c,
        float(logdens[hold].sum()),
        int(hold.sum()),
        float(logdens[~hold].sum()),
        int((~hold).sum()),
        int((label[hold] < 0).sum()),
        X[pick],
        label[pick],
        pairs,
    )


def label_scores(pairs: IntArray) -> dict[str, float]:
    """NMI (arithmetic normalisation, as ``sklearn.metrics.normalized_mutual_info_score``) and
    ARI (``adjusted_rand_score``) from the contingency table of (true code, label, count)
    triples (3, P): additive over chunks, so no labels travel to the driver."""
    import scipy.sparse as sp
    from sklearn.metrics import mutual_info_score

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
        mi = float(mutual_info_score(None, None, contingency=C))
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


def write_out(
    client: Any,
    store: Store,
    info: StoreInfo,
    state: PassState,
    mapping: IntArray,
    labels_path: str | os.PathLike[str],
    progress: bool = False,
) -> WriteSummary:
    """One task per chunk writes ``labels_path`` (zarr group: label, log_density, holdout)."""
    from distributed import as_completed

    t0 = time.perf_counter()
    labels_path = str(labels_path)
    identity = bool(np.array_equal(mapping, np.arange(state.n_clusters)))
    if state.scored is not None and state.scored_into == labels_path and identity:
        # the last pass moved nothing and wrote every chunk already (``run_pass``)
        if progress:
            print(
                f"write-out: done by pass {state.pass_no}, which moved no record",
                file=sys.stderr,
            )
        return summarize_written(list(state.scored), info, time.perf_counter() - t0, state.pass_no)
    create_labels(labels_path, info, overwrite=True)
    final_stats = merge_by(state.stats, mapping)
    msg = WriteInput(
        buffer=state.buffer,
        remap=state.remap,
        k_written=state.k_written,
        offsets=state.offsets,
        mapping=mapping,
        stats=final_stats,
        alpha=state.alpha,
        family=info.family,
        plot_rate=plot_rate(info),
        labels=info.label_column is not None,
    )
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    futs = [
        client.submit(write_chunk_task, str(store.path), labels_path, c, a, b, msg_f, pure=False)
        for c, a, b in iter_chunks(info)
    ]
    bar = _bar(progress, info.n_rows, "write-out")
    results: list[WriteResult] = []
    for fut in as_completed(futs):
        r = fut.result()
        results.append(r)
        if bar is not None:
            bar.update(info.chunk_bounds(r.c)[1] - info.chunk_bounds(r.c)[0])
    if bar is not None:
        bar.close()
    return summarize_written(results, info, time.perf_counter() - t0)


def summarize_written(
    results: list[WriteResult], info: StoreInfo, seconds: float, by_pass: int | None = None
) -> WriteSummary:
    """The ``WriteSummary`` of the chunks' write-out results (any order)."""
    results = sorted(results, key=lambda r: r.c)
    n_hold = sum(r.heldout_n for r in results)
    n_train = sum(r.train_n for r in results)
    scores = None
    if info.label_column is not None:
        scores = label_scores(np.hstack([r.pairs for r in results if r.pairs is not None]))
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
    )


def plot_rate(info: StoreInfo) -> float:
    """Share of rows (by a hash of the row index) kept for the report's projection."""
    return min(1.0, PLOT_POINTS / max(info.n_rows, 1))


def create_labels(labels_path: str, info: StoreInfo, overwrite: bool) -> None:
    """The write-out's zarr group: label (-1), log_density (NaN) and holdout, chunked as the
    store; an existing group is kept unless ``overwrite``."""
    if not overwrite and all(
        (Path(labels_path) / name / "zarr.json").exists()
        for name in ("label", "log_density", "holdout")
    ):
        return
    zarr.open_group(labels_path, mode="w")
    for name, dtype, fill in (
        ("label", "int64", -1),
        ("log_density", "float64", np.nan),
        ("holdout", "bool", False),
    ):
        zarr.create_array(
            f"{labels_path}/{name}",
            shape=(info.n_rows,),
            chunks=(info.chunk_rows,),
            dtype=dtype,
            fill_value=fill,
            overwrite=True,
        )


def read_labels(client: Any, store: Store, info: StoreInfo, state: PassState) -> IntArray:
    """Current label of every row (-1 for held-out rows), in memory: for the estimator API."""
    raw = np.asarray(store.array(state.buffer)[:])
    out = np.empty(info.n_rows, dtype=np.int64)
    for c, a, b in iter_chunks(info):
        off = int(state.offsets[c]) if state.offsets.size else 0
        out[a:b] = decode_labels(raw[a:b], state.remap, state.k_written, off)
    return out


# -- the Dask client ---------------------------------------------------------------------------


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = ":8787",
    quiet: bool = False,
) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` when given, else to a new ``LocalCluster`` of
    ``n_workers`` single-threaded workers (default: one per core). Prints the dashboard."""
    import logging

    from distributed import Client, LocalCluster

    # the scheduler's and nannies' INFO lines would bury the progress bars
    logging.getLogger("distributed").setLevel(logging.WARNING)
    if scheduler:
        client = Client(scheduler)
        cluster = None
    else:
        n = int(n_workers or os.cpu_count() or 1)
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=dashboard_address,
            memory_limit=0,
            # worker processes import the pipeline and load its kernels while starting
            preload=["pipeline.worker_setup"] if processes else None,
        )
        client = Client(cluster)
    try:
        if not quiet:
            link = client.dashboard_link if dashboard_address or scheduler else None
            print(f"Dask dashboard: {link or 'disabled'}", file=sys.stderr)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# -- the in-memory API ---------------------------------------------------------------------------


@dataclass
class DistributedResult:
    """A stage-1 run on Dask, in the shape of ``pipeline.mapdp_core.MapdpResult`` plus what ingest
    learned."""

    labels: IntArray
    stats: FloatArray
    nk: FloatArray
    alpha: float
    objective: float
    history: list[float]
    n_iter: int
    converged: bool
    seconds: float
    passes: list[dict[str, Any]]
    info: StoreInfo
    restart_objectives: list[float] = field(default_factory=list)


def fit_distributed(
    X: Any,
    family: Any = "auto",
    alpha: float | str = "learn",
    *,
    engine: str = "mapdp",
    init: str = "auto",
    n_seeds: int | None = None,
    alpha_prior: tuple[float, float] = (2.0, 1.0),
    max_passes: int = 100,
    tol: float = 1e-5,
    min_change: float = 1e-3,
    init_sample: int = INIT_SAMPLE,
    n_restarts: int = 1,
    random_state: Any = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    prior_sample: int = PRIOR_SAMPLE,
    client: Any = None,
    store_path: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> DistributedResult:
    """Stage 1 of the pipeline on records that may not fit in one process.

    Parameters
    ----------
    X : dask array / DataFrame, numpy array, pandas DataFrame, or a path (``pipeline.store``)
    family : as ``MAPDP(family=...)``
    alpha : float or "learn"
    engine : "mapdp" or "kmeans"
    init, n_seeds, alpha_prior, max_passes, tol, min_change, init_sample : see ``FitParams``
    n_restarts : int
        Runs from different seeds over the same store; the lowest objective wins.
    random_state : int, SeedSequence, Generator or None
    chunk_rows : int
        Rows per chunk, one task each. The labels depend on the chunking, not on the workers.
    client : distributed.Client, optional
        Default: a LocalCluster of one single-threaded worker process per core.
    store_path : path, optional
        Where to write the store; default a temporary directory, removed afterwards.

    Returns
    -------
    DistributedResult
    """
    t0 = time.perf_counter()
    params = FitParams(
        engine=engine,
        alpha=alpha,
        alpha_prior=tuple(alpha_prior),  # type: ignore[arg-type]
        init=init,
        n_seeds=n_seeds,
        max_passes=int(max_passes),
        tol=float(tol),
        min_change=float(min_change),
        init_sample=int(init_sample),
        seed=seed_entropy(random_state),
    ).checked()
    if int(n_restarts) < 1:
        raise ValueError(f"n_restarts must be >= 1, got {n_restarts}")
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(dask_client(dashboard_address=None, quiet=True))
        if store_path is None:
            store_path = stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmm-")) + "/s"
        store = Store(store_path)
        info = ingest(
            X,
            store,
            client=client,
            family=family,
            chunk_rows=chunk_rows,
            prior_sample=prior_sample,
        )
        best: tuple[PassState, IntArray] | None = None
        objectives = []
        for r in range(int(n_restarts)):
            store.remove("checkpoint_state")
            st = run_passes(client, store, info, replace(params, restart=r), progress=progress)
            objectives.append(st.objective)
            if best is None or st.objective < best[0].objective:
                best = (st, read_labels(client, store, info, st))
        assert best is not None
        state, labels = best
    return DistributedResult(
        labels=labels,
        stats=state.stats,
        nk=state.nk,
        alpha=state.alpha,
        objective=state.objective,
        history=[h["objective"] for h in state.history],
        n_iter=state.pass_no,
        converged=state.converged,
        seconds=time.perf_counter() - t0,
        passes=state.history,
        info=info,
        restart_objectives=objectives,
    )


def fit_estimator(est: Any, X: Any, client: Any = None) -> Any:
    """``MAPDP.fit`` for a dask collection: the distributed stage 1 with the estimator's
    parameters, setting the same fitted attributes."""
    from sklearn.exceptions import ConvergenceWarning

    # the estimator's default "sequential" start is the in-memory one; on Dask, stage 1 starts
    # from in-memory MAP-DP on a sample ("sample"), which then only needs a few passes
    res = fit_distributed(
        X,
        family=est.family,
        alpha=est.alpha,
        engine="mapdp",
        init="sample" if est.init == "sequential" else est.init,
        alpha_prior=tuple(est.alpha_prior),
        max_passes=est.max_iter,
        tol=est.tol,
        # the distributed fit starts from one sample fit; restarts there are explicit only
        n_restarts=1 if est.n_restarts == "auto" else int(est.n_restarts),
        random_state=est.random_state,
        client=client,
    )
    if not res.converged:
        warnings.warn(
            f"MAP-DP did not converge in max_iter={est.max_iter} passes; increase max_iter or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
    info = res.info
    est.schema_ = info.schema
    est.family_ = info.family
    est.n_features_in_ = info.n_cols
    if info.schema.from_frame:
        est.feature_names_in_ = np.asarray(info.schema.columns, dtype=object)
    elif hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    est.labels_ = res.labels
    est.cluster_stats_ = res.stats
    est.cluster_sizes_ = res.nk.astype(np.int64)
    est.n_clusters_ = int(res.stats.shape[0])
    est.n_iter_ = res.n_iter
    est.objective_ = res.objective
    est.objective_history_ = res.history
    est.restart_objectives_ = res.restart_objectives
    est.alpha_ = res.alpha
    est._cache = info.family.cache_of(res.stats)
    est._empty_cache = info.family.empty_cache()
    return est


def temp_sibling(path: Path) -> Path:
    """The name a run writes ``path`` under until it is complete."""
    return path.parent / f".{path.name}.partial"


# -- a whole run, step by step (the Prefect flow ``flows.cluster`` calls these as tasks) -------


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
    summaries: int = 0
    stage2: str = "none"
    mcmc: int = 0


def _input_fingerprint(source: Any) -> Any:
    """What identifies the input for resuming: path, sizes and modification times of the files;
    None for an in-memory object (such a run never resumes)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    p = Path(source).resolve()
    if not p.exists():
        return str(p)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return [str(p)] + [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def fingerprint(source: Any, cfg: RunConfig) -> str | None:
    """A run's identity: the same command on the same input resumes, anything else restarts."""
    fp = _input_fingerprint(source)
    if fp is None:
        return None
    import json

    params = replace(cfg.params, max_passes=0, tol=0.0, min_change=0.0)
    return json.dumps(
        {
            "input": fp,
            "chunk_rows": cfg.chunk_rows,
            "holdout": cfg.holdout,
            "family": repr(cfg.family),
            "prior_sample": cfg.prior_sample,
            "params": repr(params),
            "label_column": cfg.label_column,
        },
        sort_keys=True,
    )


def prepare_output(source: Any, cfg: RunConfig) -> tuple[Path, bool]:
    """The temporary sibling the run writes into, and whether it resumes an earlier attempt of
    the same command (same input files and parameters). A different earlier attempt is
    removed; an existing ``out`` is refused unless ``overwrite``."""
    import shutil

    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise ValueError(f"--out {out}: already exists (pass --overwrite to replace it)")
    partial = temp_sibling(out)
    fp = fingerprint(source, cfg)
    marker = partial / "fingerprint.json"
    if partial.exists():
        if fp is not None and marker.exists() and marker.read_text() == fp:
            return partial, True
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    if fp is not None:
        marker.write_text(fp)
    return partial, False


def discard_output(partial: Path) -> None:
    """Remove a partial output (after bad input: nothing to resume)."""
    import shutil

    shutil.rmtree(partial, ignore_errors=True)


def step_ingest(
    client: Any, source: Any, cfg: RunConfig, partial: Path, progress: bool = False
) -> StoreInfo:
    """Ingest into ``partial/store.zarr``, or reuse a completed ingest of a resumed run."""
    store = Store(partial / "store.zarr")
    if store.exists("info"):
        return store.info

    def tell(what: str, done: int, total: int) -> None:
        if progress and done == total:
            print(f"ingest: {total} {what} tasks done", file=sys.stderr)

    return ingest(
        source,
        store,
        client=client,
        family=cfg.family,
        chunk_rows=cfg.chunk_rows,
        holdout=cfg.holdout,
        prior_sample=cfg.prior_sample,
        progress=tell,
        label_column=cfg.label_column,
    )


def step_start(client: Any, partial: Path, info: StoreInfo, params: FitParams) -> PassState:
    """The checkpointed state of a resumed run, or the state before pass 1."""
    store = Store(partial / "store.zarr")
    state = load_checkpoint(store, params)
    if state is None:
        state = initial_state(client, store, info, params)
    return state


def finish(
    source: Any,
    cfg: RunConfig,
    partial: Path,
    info: StoreInfo,
    state: PassState,
    mapping: IntArray,
    written: WriteSummary,
    timing: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``clusters.parquet``, ``run.json`` and the report, then rename ``partial`` to ``out``."""
    import shutil

    from pipeline import report as rep

    final = merge_by(state.stats, mapping)
    clusters = rep.cluster_table(final, state.alpha, info.family, info.schema)
    clusters.to_parquet(partial / "clusters.parquet", index=False)
    total = sum(timing.values())
    pass_seconds = sum(h.get("seconds", 0.0) for h in state.history)
    n_passes = len(state.history)
    extra = dict(extra or {})
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
    run = {
        "input": info.source,
        "out": str(Path(cfg.out)),
        "n_rows": info.n_rows,
        "n_cols": info.n_cols,
        "n_train": info.n_train,
        "columns": info.schema.columns,
        "kinds": info.schema.kinds,
        "family": repr(info.family),
        "parameters": {
            "chunk_rows": cfg.chunk_rows,
            "n_chunks": info.n_chunks,
            "holdout": cfg.holdout,
            "engine": cfg.params.engine,
            "alpha": cfg.params.alpha,
            "alpha_prior": cfg.params.alpha_prior,
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
        },
        "notes": info.notes,
        "versions": versions(),
        "init": state.init_record,
        "passes": state.history,
        "timing": {**timing, "total": total},
        "metrics": metrics,
        **extra,
    }
    pictures: list[str] = []
    if cfg.report:
        pictures = rep.figures(
            partial,
            state.history,
            final[:, 0],
            written.plot_X,
            written.plot_labels,
            info.moments.mean,
            info.moments.cov,
        )
        rep.write_report(partial, run, clusters, pictures)
    rep.write_json(partial / "run.json", run)
    with contextlib.suppress(FileNotFoundError):
        (partial / "fingerprint.json").unlink()
    out = Path(cfg.out)
    if out.exists():
        if not cfg.overwrite:
            raise ValueError(f"--out {out}: already exists (pass --overwrite to replace it)")
        shutil.rmtree(out)
    os.replace(partial, out)
    return run


def versions() -> dict[str, str]:
    """Versions of what a run depends on, for ``run.json``."""
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for dist in (
        "dpmm-pipeline",
        "numpy",
        "numba",
        "pandas",
        "dask",
        "distributed",
        "zarr",
        "prefect",
        "scikit-learn",
    ):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out
