"""The MAP-iHMM engine (Raykov et al. 2016, Section 6.2): many sequences, distributed over
sequences.

Sequences are the groups of a grouped dataset store, in time order within a chunk; held-out
flags are per group. A chunk task sweeps its training sequences (``kernels.ihmm.sweep``, eq. 6.7)
against a copy of the global state and returns additive deltas (emission statistics, transition
and start counts, new states numbered K, K + 1, ...); the driver adds them in chunk order, drops
emptied states, takes the kappa step (eq. 6.6), merges states while the objective falls, and
relabels lazily as the mixture engines do. E is monotone only when one chunk holds the data;
Viterbi re-segmentation and splits are the in-memory ``MAPiHMM``'s.

The write-out labels every sequence by Viterbi under the final model and gives every row its
forward-filtering term log p(x_t | x_1..x_{t-1}). Tempered emissions (option ``temper``) follow
``MAPiHMM``: the weight is chosen at the sample start and carried by the state; log densities
stay untempered.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kernels import bayes_kmeans as kbk
from kernels import ihmm as kihmm
from pipeline.core import config
from pipeline.core.persist import register
from pipeline.data.labels import WriteResult, emit_chunk
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext, stop_reason
from pipeline.engines.mixture_state import IntArray, current_labels, plot_rate
from pipeline.families import FloatArray, ProductFamily
from pipeline.models.ihmm import (
    PRIOR_SCALE,
    HmmState,
    check_temper,
    decode,
    empty_state,
    kappa_step,
    log_emissions,
    log_likelihood,
    starts_of,
    sweep_state,
)
from pipeline.models.ihmm_map import fit_map_ihmm, greedy_merges


@register
@dataclass
class IhmmPassState:
    """The driver's state after ``pass_no`` passes: the K states (emission statistics, counts,
    weights) and the decoding of the labels the last pass wrote."""

    pass_no: int
    stats: FloatArray
    trans: FloatArray
    start: FloatArray
    kappa: FloatArray
    ku: float
    alpha: float
    gamma: float
    remap: IntArray
    k_written: int
    offsets: IntArray
    history: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False
    # a sample start's states (statistics, transitions, starts): pass 1 assigns every record
    # against them, then the sample's own counts are taken out again
    warm: HmmState | None = None
    init_record: dict[str, Any] | None = None
    # the emission weight w of every pass and of the write-out, and the rho it was measured
    # from (None, not NaN, when unmeasured: a checkpoint read back then compares equal)
    temper: float = 1.0
    rho: float | None = None

    @property
    def n_clusters(self) -> int:
        return int(self.stats.shape[0])

    @property
    def objective(self) -> float:
        return float(self.history[-1]["objective"]) if self.history else math.inf

    @property
    def hmm(self) -> HmmState:
        return HmmState(self.stats, self.trans, self.start, self.kappa, self.ku)

    @classmethod
    def of(cls, st: HmmState, pass_no: int, alpha: float, gamma: float, **kw: Any) -> IhmmPassState:
        """The pass state of the states ``st``; ``kw``: the other fields (``remap``,
        ``k_written`` and ``offsets`` default to those of labels no pass wrote)."""
        kw.setdefault("remap", np.zeros(0, dtype=np.int64))
        kw.setdefault("k_written", 0)
        kw.setdefault("offsets", np.zeros(0, dtype=np.int64))
        return cls(pass_no, st.stats, st.trans, st.start, st.kappa, st.ku, alpha, gamma, **kw)


@dataclass
class IhmmInput:
    """What every chunk task of a pass (or of the write-out) receives: the driver's state."""

    p: int
    state: IhmmPassState
    family: ProductFamily
    plot_rate: float = 0.0
    has_y: bool = False
    # pass 1 of a tempered sample start takes Viterbi paths instead (``viterbi_chunk``)
    viterbi: bool = False


@dataclass
class IhmmChunkResult:
    """A chunk's part of a pass: deltas of the K states, the states it opened, counts."""

    c: int
    delta: FloatArray  # (K, S)
    new_stats: FloatArray  # (M, S)
    trans_delta: FloatArray  # (K + M, K + M)
    start_delta: FloatArray  # (K + M,)
    n_changed: int
    n_train: int
    seconds: float


def sequences_of(group: np.ndarray) -> tuple[IntArray, IntArray]:
    """Rows grouped by sequence (stably): (order (n,), starts (n_seq + 1,))."""
    order = np.argsort(group, kind="stable").astype(np.int64)
    g = group[order]
    cuts = np.flatnonzero(np.diff(g)) + 1
    return order, np.concatenate([[0], cuts, [g.shape[0]]]).astype(np.int64)


def chunk_sequences(chunk: Chunk) -> tuple[IntArray, IntArray]:
    """The chunk's rows grouped by sequence (``sequences_of``)."""
    return sequences_of(np.asarray(chunk.read("group"), dtype=np.int64))


def _train_sequences(
    order: IntArray, starts: IntArray, hold: np.ndarray
) -> tuple[IntArray, IntArray]:
    """Rows (in sequence order) and offsets of the training sequences only."""
    # held-out flags are drawn per sequence: its first row's is the sequence's
    train = hold[order[starts[:-1]]] == 0
    lengths = np.diff(starts)[train]
    rows = order[np.repeat(train, np.diff(starts))]
    return rows.astype(np.int64), starts_of(lengths, int(lengths.sum()))


def objective_of(st: HmmState, family: ProductFamily, state: IhmmPassState) -> float:
    """E of ``st`` under the run's N0, M0 and emission weight (0 with no state)."""
    return st.objective(family, state.alpha, state.gamma, state.temper) if st.n_states else 0.0


class IhmmEngine(Engine):
    name: ClassVar[str] = "ihmm"
    # as the in-memory estimators' (``pipeline.core.config.IHMM_PRIOR_SCALE`` says why)
    prior_scale: ClassVar[float | None] = PRIOR_SCALE
    record_arrays: ClassVar[tuple[RecordArray, ...]] = (RecordArray("z", "int64", -1),)

    def init_state(self, ctx: RunContext, client: Any) -> IhmmPassState:
        params = ctx.params
        if not ctx.info.grouped:
            raise ValueError(
                "the ihmm engine needs a dataset store ingested with a group column (the "
                "sequence id)"
            )
        if params.learn_alpha:
            raise ValueError("the ihmm engine takes a fixed alpha (N0), not 'learn'")
        if params.start not in ("sequential", "sample"):
            raise ValueError(f"the ihmm engine starts 'sequential', got init={params.init!r}")
        alpha = float(params.alpha)  # type: ignore[arg-type]
        gamma = float(ctx.options.get("gamma", config.GAMMA))
        temper = check_temper(ctx.options.get("temper", config.IHMM_TEMPER))
        if params.start == "sample":
            return sample_start(ctx, alpha, gamma, temper)
        # nothing to measure rho on before pass 1: the sequential start stays untempered
        w = 1.0 if temper == "auto" else float(temper)
        return IhmmPassState.of(empty_state(ctx.info.family), 0, alpha, gamma, temper=w)

    def _input(self, state: Any, ctx: RunContext, p: int) -> IhmmInput:
        info = ctx.info
        viterbi = p == 1 and state.warm is not None and state.temper < 1.0
        return IhmmInput(
            p, state, info.family, plot_rate(info), info.label_column is not None, viterbi
        )

    def pass_input(self, state: Any, ctx: RunContext, p: int, scores_into: str | None) -> Any:
        return self._input(state, ctx, p)

    def chunk_step(self, chunk: Chunk, msg: IhmmInput) -> IhmmChunkResult:
        t0 = time.perf_counter()
        fam, state = msg.family, msg.state
        n = chunk.b - chunk.a
        z_all = np.full(n, -1, dtype=np.int64) if msg.p == 1 else current_labels(chunk, state)
        order, starts = chunk_sequences(chunk)
        rows, tstarts = _train_sequences(order, starts, chunk.holdout)
        Xs = np.ascontiguousarray(chunk.X[rows])
        z_old = z_all[rows]
        K = state.n_clusters
        if msg.viterbi:
            z_new, n_new, n_changed = viterbi_chunk(Xs, tstarts, state, fam)
        else:
            z_new, n_new, n_changed = sweep_chunk(Xs, tstarts, z_old.copy(), state, fam)
        every = np.arange(Xs.shape[0], dtype=np.int64)
        delta, new_stats = kbk.label_deltas(
            Xs, every, z_old, z_new, K, n_new, fam.spec, fam.n_stats
        )
        t_new, s_new, _ = kihmm.count_transitions(z_new, tstarts, K + n_new)
        t_old, s_old, _ = kihmm.count_transitions(z_old, tstarts, K + n_new)
        out = np.full(n, -1, dtype=np.int64)
        out[rows] = z_new
        chunk.write("z", out)
        seconds = time.perf_counter() - t0
        return IhmmChunkResult(
            chunk.c,
            delta,
            new_stats,
            t_new - t_old,
            s_new - s_old,
            n_changed,
            rows.shape[0],
            seconds,
        )

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[IhmmPassState, dict[str, Any]]:
        fam = ctx.info.family
        results = sorted(results, key=lambda r: r.c)
        K = state.n_clusters
        M = sum(r.new_stats.shape[0] for r in results)
        T = K + M
        base = state.hmm
        if state.warm is not None:
            # the sample start's own counts leave once its states have drawn the records
            w = state.warm
            base = HmmState(
                base.stats - w.stats,
                base.trans - w.trans,
                base.start - w.start,
                base.kappa,
                base.ku,
            )
        stats = np.vstack(
            [base.stats + sum((r.delta for r in results), np.zeros_like(state.stats))]
            + [r.new_stats for r in results]
        )
        trans = np.zeros((T, T))
        trans[:K, :K] = base.trans
        start = np.zeros(T)
        start[:K] = base.start
        offsets = np.zeros(ctx.info.n_chunks, dtype=np.int64)
        m = 0
        for r in results:
            offsets[r.c] = m
            mc = r.new_stats.shape[0]
            idx = np.concatenate([np.arange(K), K + m + np.arange(mc)]).astype(np.int64)
            trans[np.ix_(idx, idx)] += r.trans_delta
            start[idx] += r.start_delta
            m += mc
        # states opened in the chunks take shares of kappa_{K+1}, as a sweep's new state does
        b = kihmm.b_new_of(state.gamma)
        kappa = np.concatenate([state.kappa, np.zeros(M)])
        ku = state.ku
        for j in range(M):
            kappa[K + j] = b * ku
            ku *= 1.0 - b
        keep = stats[:, 0] > 0.5
        ku += float(kappa[~keep].sum())
        new_id = np.full(T, -1, dtype=np.int64)
        new_id[keep] = np.arange(int(keep.sum()))
        st = HmmState(stats, trans, start, kappa, float(ku)).take(keep)
        e = objective_of(st, fam, state)
        cand = kappa_step(st, state.alpha, state.gamma, "expectation", np.zeros(1, np.uint64))
        e_cand = objective_of(cand, fam, state)
        if e_cand <= e:
            st, e = cand, e_cand
        st, e, target = greedy_merges(st, fam, state.alpha, state.gamma, e, state.temper)
        remap = np.where(new_id >= 0, target[np.maximum(new_id, 0)], -1).astype(np.int64)
        n_changed = sum(r.n_changed for r in results)
        n_train = sum(r.n_train for r in results)
        merges = int(keep.sum()) - st.n_states
        record: dict[str, Any] = {
            "pass": state.pass_no + 1,
            "objective": e,
            "n_clusters": st.n_states,
            "n_new": int(M),
            "merges": merges,
            "n_changed": int(n_changed),
            "changed_fraction": n_changed / max(n_train, 1),
            "task_seconds": float(sum(r.seconds for r in results)),
        }
        reason = stop_reason(state.objective, e, n_changed + merges, n_train, ctx.params)
        record["stop"] = reason
        new = IhmmPassState.of(
            st,
            state.pass_no + 1,
            state.alpha,
            state.gamma,
            remap=remap,
            k_written=K,
            offsets=offsets,
            history=[*state.history, record],
            converged=reason is not None,
            init_record=state.init_record,
            temper=state.temper,
            rho=state.rho,
        )
        return new, record

    def write_input(self, state: Any, mapping: np.ndarray, ctx: RunContext) -> IhmmInput:
        # stage 2 (merging clusters into a hierarchy) does not apply to states: identity only
        return self._input(state, ctx, state.pass_no + 1)

    def score_chunk(self, chunk: Chunk, labels: str, msg: IhmmInput) -> WriteResult:
        """Final state of every row and its forward-filtering term log p(x_t | x_<t), written
        to ``labels``: every sequence is decoded by Viterbi under the final MAP model (-1: the
        unrepresented state); the sweep's own labels stay in the record array ``z``."""
        fam, state = msg.family, msg.state
        X, hold = chunk.X, chunk.holdout
        order, starts = chunk_sequences(chunk)
        Xs = np.ascontiguousarray(X[order])
        st = state.hmm
        # Viterbi under the tempered emissions, as ``MAPiHMM.predict``; the forward terms under
        # the untempered ones (a density), as ``MAPiHMM.score_samples``
        log_b = log_emissions(Xs, st, fam)
        log_pi, log_a = st.log_params(state.alpha)
        steps = kihmm.forward_steps(log_b, starts, log_pi, log_a)
        if state.temper != 1.0:
            log_b = log_emissions(Xs, st, fam, state.temper)
        path, _ = kihmm.viterbi(log_b, starts, log_pi, log_a)
        logdens = np.empty(X.shape[0])
        logdens[order] = steps
        pred = np.empty(X.shape[0], dtype=np.int64)
        pred[order] = np.where(path == st.n_states, -1, path)
        return emit_chunk(
            chunk.data, labels, chunk.c, chunk.a, X, hold, pred, logdens, msg.plot_rate, msg.has_y
        )

    def warm_up(self) -> None:
        """Load the sweep, the deltas and the write-out's kernels on toy records."""
        from pipeline.engines.warmup import toy_family

        X, family = toy_family()
        starts = starts_of(None, X.shape[0])
        z = np.full(X.shape[0], -1, dtype=np.int64)
        rng = np.zeros(1, np.uint64)
        st, _ = sweep_state(
            X, starts, z, empty_state(family), family, 1.0, config.GAMMA, False, rng
        )
        kihmm.count_transitions(z, starts, st.n_states)
        log_likelihood(X, starts, st, family, 1.0)
        decode(X, starts, st, family, 1.0)


def sample_start(
    ctx: RunContext, alpha: float, gamma: float, temper: str | float = 1.0
) -> IhmmPassState:
    """The state before pass 1 from in-memory MAP-iHMM with one restart (``fit_map_ihmm``) on
    the training sequences of the first chunks, about ``init_sample`` rows, choosing the
    emission weight w (``temper``) the passes and the write-out then use."""
    t0 = time.perf_counter()
    info, params = ctx.info, ctx.params
    parts: list[FloatArray] = []
    lengths: list[int] = []
    for c in range(info.n_chunks):
        a, b = info.chunk_bounds(c)
        X = np.asarray(ctx.data.array("X")[a:b], dtype=np.float64)
        hold = np.asarray(ctx.data.array("holdout")[a:b]).astype(bool)
        order, starts = sequences_of(np.asarray(ctx.data.array("group")[a:b], dtype=np.int64))
        rows, tstarts = _train_sequences(order, starts, hold)
        # the chunk's training sequences up to the one that brings the sample to init_sample
        n = int(np.searchsorted(tstarts[1:], params.init_sample - sum(lengths))) + 1
        parts.append(X[rows[: tstarts[min(n, tstarts.shape[0] - 1)]]])
        lengths += np.diff(tstarts)[:n].tolist()
        if sum(lengths) >= params.init_sample:
            break
    Xs = np.ascontiguousarray(np.vstack(parts))
    starts = starts_of(np.asarray(lengths, dtype=np.int64), Xs.shape[0])
    seq = np.random.SeedSequence(params.seed, spawn_key=(params.restart, 0))
    res, _objectives, w, rho = fit_map_ihmm(Xs, starts, info.family, alpha, gamma, seq, temper)
    K = res.state.n_states
    rho_or_none = None if math.isnan(rho) else rho
    return IhmmPassState.of(
        res.state,
        0,
        alpha,
        gamma,
        remap=np.arange(K, dtype=np.int64),
        k_written=K,
        offsets=np.zeros(info.n_chunks, dtype=np.int64),
        warm=res.state,
        temper=w,
        rho=rho_or_none,
        init_record={
            "method": "sample",
            "rows": int(Xs.shape[0]),
            "sequences": len(lengths),
            "n_states": K,
            "iterations": res.n_iter,
            "temper": w,
            "residual_autocorrelation": rho_or_none,
            "seconds": time.perf_counter() - t0,
        },
    )


def sweep_chunk(
    X: FloatArray, starts: IntArray, z: IntArray, state: IhmmPassState, family: ProductFamily
) -> tuple[IntArray, int, int]:
    """One MAP sweep of a chunk's sequences against a copy of the K global states: labels with
    the states the chunk opened numbered K, K + 1, ..., their number, records moved."""
    K = state.n_clusters
    rng = np.zeros(1, np.uint64)
    st, n_changed = sweep_state(
        X, starts, z, state.hmm, family, state.alpha, state.gamma, False, rng, state.temper, K
    )
    return z, st.n_states - K, n_changed


def viterbi_chunk(
    X: FloatArray, starts: IntArray, state: IhmmPassState, family: ProductFamily
) -> tuple[IntArray, int, int]:
    """Pass 1 of a tempered sample start: every training sequence of the chunk labelled by its
    Viterbi path under the sample's states, as ``MAPiHMM.predict``; records on the
    unrepresented state open one new state, numbered K. Same returns as ``sweep_chunk``.

    A sweep from no labels would put every record in one sticky state under tempered emissions;
    the in-memory run escapes that by its Viterbi moves, which the passes do not have.
    """
    K = state.n_clusters
    if X.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), 0, 0
    path, _ = decode(X, starts, state.hmm, family, state.alpha, state.temper)
    path = np.ascontiguousarray(path, dtype=np.int64)
    return path, int((path == K).any()), int(path.shape[0])


ENGINE = IhmmEngine()
