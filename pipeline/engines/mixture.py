"""What the two mixture engines (MAP-DP, Bayes K-means) share: cluster labels with lazy
relabelling, the driver's reduce with reconciliation and merges, the starts, the write-out.

A chunk task sweeps its training records against a copy of the global statistics, writes its new
labels to the other label buffer and returns statistic deltas. ``reduce_pass`` adds them in chunk
order, drops emptied clusters, merges pairs while the objective (eq. 3.3) falls
(``kernels.partition.greedy_merge``) and records the relabelling for the next reader
(``PassState.remap``). Chunk c of pass p visits its records in an order drawn from the
SeedSequence child (restart, p, c), so the labels depend neither on the workers nor on retries.
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from kernels import bayes_kmeans as kbk
from kernels import mapdp as kmapdp
from kernels import partition as kpartition
from kernels.obs import gaussian_nw
from kernels.rng import shuffle
from pipeline.core.config import FitParams
from pipeline.core.seeds import seed_state
from pipeline.data.labels import WriteResult
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext, stop_reason
from pipeline.engines.mixture_start import MIXTURE_REDUCE_STEP, initial_state, warm_reduce
from pipeline.engines.mixture_state import (
    IntArray,
    PassState,
    chunk_seed,
    current_labels,
    plot_rate,
    predict,
    write_fields,
)
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats
from pipeline.models.concentration import log_gamma_prior, map_concentration
from pipeline.models.mapdp import run_mapdp


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
    # write-out fused into the pass: the labels group, the picture's rate, true labels or not
    scores_into: str | None = None
    plot_rate: float = 0.0
    has_y: bool = False
    # missing cells kept filled: whether any training row has one, and the sample's fills
    fills: bool = False
    init_fill: FloatArray | None = None


@dataclass
class ChunkResult:
    """A chunk's part of a pass: its statistics' change, its new clusters', its counts."""

    c: int
    delta: Stats
    new_stats: Stats
    n_changed: int
    n_train: int
    seconds: float
    written: WriteResult | None = None


@dataclass
class Sweep:
    """A chunk's sweep as an engine's ``sweep`` returns it: labels (n,) with the clusters the
    chunk opened numbered K, K + 1, ..., their count M, moves, and a fused write-out."""

    z: IntArray
    n_new: int
    n_changed: int
    written: WriteResult | None = None


def pass_labels(chunk: Chunk, msg: PassInput, hold: NDArray[np.bool_]) -> IntArray:
    """The chunk's labels (n,) at the start of pass ``msg.p``: pass 1's start (-1 for none), later
    those the previous pass wrote."""
    if msg.p != 1:
        return current_labels(chunk, msg)
    z = np.full(chunk.b - chunk.a, -1, dtype=np.int64)
    if msg.init_label >= 0:
        z[~hold] = msg.init_label
    sel = (msg.init_rows >= chunk.a) & (msg.init_rows < chunk.b)
    z[msg.init_rows[sel] - chunk.a] = msg.init_labels[sel]
    return z


def objective(stats: FloatArray, alpha: float, family: ProductFamily, params: FitParams) -> float:
    """-log p(X, z | N0) (eq. 3.3) from the statistics, minus log p(N0) when learned."""
    nk = np.ascontiguousarray(stats[:, 0])
    e = float(kmapdp.objective(stats, nk, stats.shape[0], family.spec, family.prior, alpha))
    if params.learn_alpha:
        e -= log_gamma_prior(alpha, *params.alpha_prior)
    return e


def merged_records(sizes: FloatArray, target: IntArray) -> int:
    """Records relabelled by merges ``target`` of clusters ``sizes``: all but the largest part."""
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
) -> tuple[PassState, dict[str, Any]]:
    """The driver's half of a pass: new state and record; ``scored_into``: see ``run_pass``."""
    results = sorted(results, key=lambda r: r.c)
    K = state.n_clusters
    # statistics of another family, column group or prior refuse to add (``Stats``)
    total = Stats(state.stats, family)
    for r in results:
        total = total + r.delta
    if state.warm is not None:
        # a warm start's own statistics leave once its clusters have drawn the records
        total = total - Stats(state.warm, family)
    offsets = np.zeros(len(results), dtype=np.int64)
    m = 0
    for r in results:
        offsets[r.c] = m
        m += len(r.new_stats)
    everything = Stats.concat([total, *(r.new_stats for r in results)]).array
    alpha = state.alpha
    n_changed = sum(r.n_changed for r in results)
    # emptied clusters are dropped; then merges over every pair of clusters, new or old (which
    # reconciles the chunks' new clusters), best first (``kernels.partition.greedy_merge``)
    keep = everything[:, 0] > 0.5
    new_id = np.full(everything.shape[0], -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    kept = np.ascontiguousarray(everything[keep])
    target, stats, merges = kpartition.greedy_merge(
        kept, np.ascontiguousarray(kept[:, 0]), family.spec, family.prior, math.log(alpha)
    )
    stats = np.ascontiguousarray(stats)
    remap = np.where(new_id >= 0, target[np.maximum(new_id, 0)], -1).astype(np.int64)
    # records relabelled by a merge of clusters older than the pass (the others moved already)
    old = keep[:K]
    relabelled = merged_records(kept[: int(old.sum())][:, 0], target[: int(old.sum())])
    if params.learn_alpha and state.alpha_k != stats.shape[0]:
        # eq. A.1 depends only on N and K: unchanged, alpha is kept exactly, so that a pass that
        # moved nothing leaves the model bit for bit as it was
        alpha = map_concentration(n_train, stats.shape[0], *params.alpha_prior, start=alpha)
    e = objective(stats, alpha, family, params)
    changed = int(n_changed) + relabelled
    record: dict[str, Any] = {
        "pass": state.pass_no + 1,
        "objective": e,
        "n_clusters": int(stats.shape[0]),
        "n_new": int(m),
        "merges": int(merges),
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


class MixtureEngine(Engine):
    """The part of the MAP-DP and Bayes K-means engines that is the same: labels ``z`` as the
    per-record state, the starts, the reduce, the write-out. A subclass gives ``sweep``."""

    record_arrays: ClassVar[tuple[RecordArray, ...]] = (RecordArray("z", "int64", -1),)
    summaries: ClassVar[bool] = True

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

    @staticmethod
    def pass_start(chunk: Chunk, msg: PassInput) -> tuple[IntArray, IntArray]:
        """The chunk's labels of pass p - 1 (z (n,), -1 for held-out rows) and the random
        order (training rows) of pass p, which depends only on (seed, restart, p, c)."""
        hold = chunk.holdout
        z = pass_labels(chunk, msg, hold)
        order = np.flatnonzero(~hold).astype(np.int64)
        shuffle(seed_state(chunk_seed(msg.seed, msg.restart, msg.p, chunk.c)), order)
        return z, order

    def chunk_step(self, chunk: Chunk, msg: PassInput) -> ChunkResult:
        """One chunk of one pass (module docstring). Idempotent: reads buffer z[(p-1) % 2],
        writes buffer z[p % 2], and its random order depends only on (seed, restart, p, c)."""
        t0 = time.perf_counter()
        fam = msg.family
        X, hold = chunk.X, chunk.holdout
        K = msg.stats.shape[0]
        z, order = self.pass_start(chunk, msg)
        z_old = z.copy()
        swept = self.sweep(chunk, msg, X, hold, order, z)
        delta, new_stats = kbk.label_deltas(
            X, order, z_old, swept.z, K, swept.n_new, fam.spec, fam.n_stats
        )
        swept.z[hold] = -1
        chunk.write("z", swept.z)
        return ChunkResult(
            chunk.c,
            Stats(delta, fam),
            Stats(new_stats, fam),
            int(swept.n_changed),
            int(order.shape[0]),
            time.perf_counter() - t0,
            swept.written,
        )

    @abstractmethod
    def sweep(
        self,
        chunk: Chunk | None,
        msg: PassInput,
        X: FloatArray,
        hold: NDArray[np.bool_],
        order: IntArray,
        z: IntArray,
    ) -> Sweep:
        """Assign the training records ``order`` of X (n, D); labels z (n,) updated in place and
        returned with the clusters opened, numbered K, K + 1, ... (``chunk`` None: warm-up)."""

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[PassState, dict[str, Any]]:
        return reduce_pass(
            state, results, ctx.info.family, ctx.params, ctx.info.n_train, scores_into
        )

    def write_input(self, state: Any, mapping: IntArray, ctx: RunContext) -> WriteInput:
        return WriteInput(
            remap=state.remap,
            k_written=state.k_written,
            offsets=state.offsets,
            mapping=mapping,
            **write_fields(state, mapping, ctx.info),
        )

    def score_chunk(self, chunk: Chunk, labels: str, msg: WriteInput) -> WriteResult:
        """Final label and log predictive density (eq. 3.4) of every row of a chunk, written to
        ``labels``; held-out rows get the MAP label of eq. 3.5 (-1: a new cluster)."""
        fam = msg.family
        X, hold = chunk.X, chunk.holdout
        z1 = current_labels(chunk, msg)
        final = np.where(z1 >= 0, msg.mapping[np.maximum(z1, 0)], -1)
        pred, logdens = predict(X, msg.stats, msg.alpha, fam)
        label = np.where(hold, pred, final)
        return chunk.emit(labels, X, hold, label, logdens, msg.plot_rate, msg.labels)

    def written_by_pass(self, state: Any, labels: str, mapping: IntArray) -> Any:
        identity = bool(np.array_equal(mapping, np.arange(state.n_clusters)))
        if state.scored is not None and state.scored_into == labels and identity:
            return state.scored
        return None

    def warm_steps(self) -> list[tuple[str, Callable[[], None]]]:
        """Three groups of kernels, on toy records (the kernels compile per argument type, not
        per family): the engine's sweep with its label deltas; the driver's reduce (the merge
        test, the objective, the concentration's MAP; shared by the engines); the sample
        start's in-memory MAP-DP with the write-out's eq. 3.4 (shared too)."""
        return [
            (f"{self.name}-sweep", self._warm_sweep),
            ("mixture-packed", _warm_packed),
            (MIXTURE_REDUCE_STEP, warm_reduce),
            ("mixture-start", _warm_start),
        ]

    def warm_up(self) -> None:
        for _, step in self.warm_steps():
            step()

    def _warm_sweep(self) -> None:
        from pipeline.engines.warmup import toy_family

        X, family = toy_family()
        n = X.shape[0]
        order = np.arange(n, dtype=np.int64)
        shuffle(seed_state(np.random.SeedSequence(0)), order)
        z = np.zeros(n, dtype=np.int64)
        stats = family.stats_of(X, z, 1)
        msg = PassInput(
            2, stats, 1.0, np.zeros(1, dtype=np.int64), 1, z[:1], family, 0, 0, z[:0], z[:0], -1
        )
        swept = self.sweep(None, msg, X, np.zeros(n, dtype=np.bool_), order, z.copy())
        kbk.label_deltas(X, order, z, swept.z, 1, swept.n_new, family.spec, family.n_stats)


# the MAP-DP engine's sweep step (``f"{name}-sweep"``): the sample start's in-memory MAP-DP
# calls the same kernel (``kernels.mapdp.sweep``), so it runs under that step's lock
MAPDP_SWEEP_STEP = "mapdp-sweep"


def _warm_packed() -> None:
    """The packed predictives of the MAP-DP sweep and ``predict``: a warm-up step of their own."""
    from pipeline.engines.warmup import toy_family

    X, family = toy_family()
    stats = family.stats_of(X, np.zeros(X.shape[0], dtype=np.int64), 1)
    P = kmapdp.pack_slots(family.cache_of(stats), 1, family.empty_cache(), X.shape[1])
    scratch = np.empty((3, 2))
    gaussian_nw.packed_log_predictives(X[0], P, 2, scratch[0], scratch[1], scratch[2])


def _warm_start() -> None:
    from pipeline.engines.warmup import compile_once, toy_family

    X, family = toy_family()
    order = np.arange(X.shape[0], dtype=np.int64)
    predict(X, family.stats_of(X, np.zeros(X.shape[0], dtype=np.int64), 1), 1.0, family)
    # the reduce's merge test and objective, which the in-memory MAP-DP calls too: a step of
    # their own, which the other process takes while this one compiles the sweep
    compile_once(MIXTURE_REDUCE_STEP, warm_reduce)
    # a process compiling the sweep step is waited for, not joined: the largest compile of all
    compile_once(
        MAPDP_SWEEP_STEP,
        lambda: run_mapdp(X, family, order, 1.0, True, (2.0, 1.0), 5, 1e-6, "sequential"),
    )
