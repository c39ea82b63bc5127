"""What the two mixture engines (MAP-DP, Bayes K-means) share: cluster labels with lazy
relabelling, the driver's reduce with reconciliation and merges, the starts, the write-out.

Start (``initial_state``, ``FitParams.start``): by default the in-memory MAP-DP of
``pipeline.mapdp_core.run_mapdp`` - sweeps plus split and merge moves, learned concentration - is
fitted to a hash sample of ``init_sample`` training rows (a subset of the prior's sample that ingest
already drew), so pass 1 starts from about the right clusters and global statistics and the
distributed passes only refine them. The sample's rows keep their labels in pass 1; every other
training row is assigned in pass 1.

A chunk task sweeps its training records against a copy of the global statistics, writes the
chunk's new labels to the other label buffer itself and returns only statistic deltas and the
statistics of the clusters it opened.

The driver (``reduce_pass``) adds the deltas in chunk order, merges every new cluster into
another one, new or existing, while a merge lowers the objective (eq. 3.3, from the families' log
marginals; Bayes K-means tests every pair, as its Section 5 merge step), then runs merge moves
over all clusters (``kernels.mapdp.greedy_merge``: the pair whose merge lowers the objective most,
until none does), drops empty clusters and records how the labels written in this pass map to
the new cluster numbers (``PassState.remap``): labels are relabelled lazily, by the next task that
reads them. The objective comes from the statistics alone.

Determinism: the visiting order of chunk c in pass p is drawn from the SeedSequence child
(restart, p, c) of ``random_state``; a task reads one buffer and writes the other; deltas are
added in chunk order. So the labels do not depend on the number of workers, and a task that is
run again (a worker died, a retry) gives the same result.
"""

from __future__ import annotations

import math
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from kernels import bayes_kmeans as kbk
from kernels import mapdp as kmapdp
from kernels.rng import shuffle
from pipeline.concentration import log_gamma_prior, map_concentration
from pipeline.config import MAX_SEEDS, FitParams
from pipeline.dist.writeout import WriteResult, emit_chunk
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext, stop_reason
from pipeline.families import FloatArray, ProductFamily
from pipeline.mapdp_core import run_mapdp, seed_state
from pipeline.store import StoreInfo, holdout_mask_of, iter_chunks, row_uniform

IntArray = NDArray[np.int64]
INIT_SALT = 0x5EED_0004


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
    # ``scored_into``: their write-out results, by chunk
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


def current_labels(chunk: Chunk, state: Any, buffer: str | None = None) -> IntArray:
    """The chunk's labels as the current cluster numbers: ``buffer`` (default: the one the
    previous pass wrote) decoded by ``state``'s ``remap``, ``k_written`` and ``offsets``."""
    import os

    import zarr

    name = buffer or f"z{(chunk.p - 1) % 2}"
    raw = np.asarray(zarr.open_array(os.path.join(chunk.state, name), mode="r")[chunk.a : chunk.b])
    off = int(state.offsets[chunk.c]) if state.offsets.size else 0
    return decode_labels(raw, state.remap, state.k_written, off)


# -- the chunk task ----------------------------------------------------------------------------


@dataclass
class PassInput:
    """What every chunk task of one pass receives (scattered once per pass)."""

    p: int
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


@dataclass
class Sweep:
    """A chunk's sweep as an engine's ``sweep`` returns it: labels (n,) with the clusters the
    chunk opened numbered K, K + 1, ..., their count M, moves, and a fused write-out."""

    z: IntArray
    n_new: int
    n_changed: int
    written: WriteResult | None = None


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


def reduce_pass(
    state: PassState,
    results: list[ChunkResult],
    family: ProductFamily,
    params: FitParams,
    n_train: int,
    scored_into: str | None = None,
    all_pairs: bool = False,
) -> tuple[PassState, dict[str, Any]]:
    """The driver's half of a pass (module docstring): new state and the pass's record.

    ``scored_into``: the labels group the chunk tasks wrote their scores into, if asked to;
    ``all_pairs``: reconcile every pair of clusters, not only the new ones (Bayes K-means).
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
    if all_pairs or params.merge_all:
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


def initial_state(client: Any, ctx: RunContext) -> PassState:
    """The state before pass 1 (``FitParams.start``)."""
    info, params = ctx.info, ctx.params
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
    cand = rng.permutation(info.n_rows).astype(np.int64)
    cand = cand[~holdout_mask_of(cand, info.holdout)]
    seed_rows = np.sort(cand[:n_seeds])
    Xs = np.asarray(ctx.data.array("X").get_orthogonal_selection((seed_rows, slice(None))))
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


def _train_stats_task(data: str, a: int, b: int, fam: ProductFamily) -> FloatArray:
    chunk = Chunk(data, "", 0, a, b, 0)
    X, hold = chunk.X, chunk.holdout
    return fam.stats_of(np.ascontiguousarray(X[~hold]))[0]


@dataclass
class WriteInput:
    """What every write-out task receives: the labels' decoding, the final clusters."""

    remap: IntArray
    k_written: int
    offsets: IntArray
    mapping: IntArray
    stats: FloatArray  # final clusters
    alpha: float
    family: ProductFamily
    plot_rate: float
    labels: bool = False


def merge_by(stats: FloatArray, mapping: IntArray) -> FloatArray:
    """Statistics of the final clusters: rows of ``stats`` added by ``mapping``."""
    K2 = int(mapping.max()) + 1 if mapping.size else 0
    out = np.zeros((K2, stats.shape[1]))
    np.add.at(out, mapping, stats)
    return out


# -- the engine ----------------------------------------------------------------------------------


class MixtureEngine(Engine):
    """The part of the MAP-DP and Bayes K-means engines that is the same: labels ``z`` as the
    per-record state, the starts, the reduce, the write-out. A subclass gives ``sweep``."""

    record_arrays: ClassVar[tuple[RecordArray, ...]] = (RecordArray("z", "int64", -1),)
    # reconcile every pair of clusters after a pass, not only the new ones
    all_pairs: ClassVar[bool] = False

    def init_state(self, ctx: RunContext, client: Any) -> PassState:
        return initial_state(client, ctx)

    def pass_input(self, state: Any, ctx: RunContext, p: int, scores_into: str | None) -> PassInput:
        info, params = ctx.info, ctx.params
        return PassInput(
            p=p,
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

    def chunk_step(self, chunk: Chunk, msg: PassInput) -> ChunkResult:
        """One chunk of one pass (module docstring). Idempotent: reads buffer z[(p-1) % 2],
        writes buffer z[p % 2], and its random order depends only on (seed, restart, p, c)."""
        t0 = time.perf_counter()
        fam = msg.family
        X, hold = chunk.X, chunk.holdout
        K = msg.stats.shape[0]
        if msg.p == 1:
            z = np.full(chunk.b - chunk.a, -1, dtype=np.int64)
            if msg.init_label >= 0:
                z[~hold] = msg.init_label
            sel = (msg.init_rows >= chunk.a) & (msg.init_rows < chunk.b)
            z[msg.init_rows[sel] - chunk.a] = msg.init_labels[sel]
        else:
            z = current_labels(chunk, msg)
        order = np.flatnonzero(~hold).astype(np.int64)
        shuffle(seed_state(chunk_seed(msg.seed, msg.restart, msg.p, chunk.c)), order)
        z_old = z.copy()
        swept = self.sweep(chunk, msg, X, hold, order, z)
        delta, new_stats = kbk.label_deltas(
            X, order, z_old, swept.z, K, swept.n_new, fam.spec, fam.n_stats
        )
        swept.z[hold] = -1
        chunk.write("z", swept.z)
        return ChunkResult(
            chunk.c,
            delta,
            new_stats,
            int(swept.n_changed),
            int(order.shape[0]),
            time.perf_counter() - t0,
            swept.written,
        )

    @abstractmethod
    def sweep(
        self,
        chunk: Chunk,
        msg: PassInput,
        X: FloatArray,
        hold: NDArray[np.bool_],
        order: IntArray,
        z: IntArray,
    ) -> Sweep:
        """Assign the training records ``order`` of X (n, D), labels z (n,) updated in place
        and returned with the clusters the chunk opened numbered K, K + 1, ..."""

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[PassState, dict[str, Any]]:
        return reduce_pass(
            state,
            results,
            ctx.info.family,
            ctx.params,
            ctx.info.n_train,
            scores_into,
            all_pairs=self.all_pairs,
        )

    def write_input(self, state: Any, mapping: IntArray, ctx: RunContext) -> WriteInput:
        info = ctx.info
        return WriteInput(
            remap=state.remap,
            k_written=state.k_written,
            offsets=state.offsets,
            mapping=mapping,
            stats=merge_by(state.stats, mapping),
            alpha=state.alpha,
            family=info.family,
            plot_rate=plot_rate(info),
            labels=info.label_column is not None,
        )

    def score_chunk(self, chunk: Chunk, labels: str, msg: WriteInput) -> WriteResult:
        """Final label and log predictive density (eq. 3.4) of every row of a chunk, written to
        ``labels``; held-out rows get the MAP label of eq. 3.5 (-1: a new cluster)."""
        fam = msg.family
        X, hold = chunk.X, chunk.holdout
        z1 = current_labels(chunk, msg)
        final = np.where(z1 >= 0, msg.mapping[np.maximum(z1, 0)], -1)
        pred, logdens = kmapdp.predict(
            X,
            msg.stats,
            fam.cache_of(msg.stats),
            np.ascontiguousarray(msg.stats[:, 0]),
            fam.spec,
            fam.prior,
            fam.empty_cache(),
            msg.alpha,
        )
        label = np.where(hold, pred, final)
        return emit_chunk(
            chunk.data,
            labels,
            chunk.c,
            chunk.a,
            X,
            hold,
            label,
            logdens,
            msg.plot_rate,
            msg.labels,
        )

    def written_by_pass(self, state: Any, labels: str, mapping: IntArray) -> Any:
        identity = bool(np.array_equal(mapping, np.arange(state.n_clusters)))
        if state.scored is not None and state.scored_into == labels and identity:
            return state.scored
        return None

    def warm_up(self) -> None:
        from pipeline.worker_setup import toy_family

        X, family = toy_family()
        n = X.shape[0]
        order = np.arange(n, dtype=np.int64)
        shuffle(seed_state(np.random.SeedSequence(0)), order)
        z = np.zeros(n, dtype=np.int64)
        stats = family.stats_of(X, z, 1)
        kbk.label_deltas(X, order, z, z, 1, 0, family.spec, family.n_stats)
        cache = family.cache_of(stats)
        kmapdp.predict(
            X,
            stats,
            cache,
            stats[:, 0].copy(),
            family.spec,
            family.prior,
            family.empty_cache(),
            1.0,
        )
        run_mapdp(X, family, order, 1.0, True, (2.0, 1.0), 5, 1e-6, "sequential")

    def state_types(self) -> tuple[type, ...]:
        return (PassState, WriteResult)


def plot_rate(info: StoreInfo) -> float:
    """Share of rows (by a hash of the row index) kept for the report's projection."""
    from pipeline.dist.writeout import PLOT_POINTS

    return min(1.0, PLOT_POINTS / max(info.n_rows, 1))


def read_labels(ctx: RunContext, state: PassState) -> IntArray:
    """Current label of every row (-1 for held-out rows), in memory: for the estimator API."""
    info = ctx.info
    raw = np.asarray(ctx.state.array(state.buffer)[:])
    out = np.full(raw.shape[0], -1, dtype=np.int64)
    for c, a, b in iter_chunks(info):
        off = int(state.offsets[c]) if state.offsets.size else 0
        out[a:b] = decode_labels(raw[a:b], state.remap, state.k_written, off)
    return out
