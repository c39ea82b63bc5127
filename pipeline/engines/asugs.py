"""The ASUGS engine: one streaming pass of ASUGS-PM (Tsiligkaridis and Forsythe 2015, Algorithm 1
with Section 6's pruning and merging) over the chunks of a dataset store, in chunk order, for data
seen once.

A *sequential* engine (``Engine.sequential``): chunk tasks run one after the other, each given the
stream's state as the previous one left it (``carry``), so the pass is exactly
``pipeline.ASUGS.partial_fit`` over the training rows in order. A task writes the id of the class
each record joined; the write-out resolves ids through later merges and prunes
(``kernels.asugs.row_of_ids``) and scores every row by eq. 3.4. ``alpha == "learn"`` is ASUGS's
adaptive concentration with ``lam``; a number is SUGS. ``stream_chunks`` runs the same chain
without writing labels (the ``"asugs"`` start of the MAP-DP passes).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from kernels import asugs as kasugs
from kernels import mapdp as kmapdp
from pipeline.core.config import FitParams
from pipeline.core.persist import register
from pipeline.core.seeds import seed_state
from pipeline.core.tasks import chain_chunks, on_scattered
from pipeline.data.labels import WriteResult
from pipeline.data.store import StoreInfo, iter_chunks
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext
from pipeline.engines.mixture_state import (
    IntArray,
    chunk_seed,
    init_sample_rows,
    predict,
    write_fields,
)
from pipeline.families import FloatArray, ProductFamily
from pipeline.models import asugs as masugs


def stream_params(ctx: RunContext) -> masugs.StreamParams:
    """The stream's parameters from the fit's ``alpha`` and the engine's options, defaults
    ``pipeline.estimators.asugs.ASUGS``'s."""
    opts = ctx.options
    learn = ctx.params.learn_alpha
    return masugs.check_stream_params(
        opts.get("lam", masugs.DEFAULT_LAM) if learn else None,
        None if learn else ctx.params.alpha,
        opts.get("select", "greedy"),
        opts.get("prune_merge", True),
        opts.get("pm_interval", masugs.PM_INTERVAL),
        opts.get("prune_weight", masugs.PRUNE_WEIGHT),
    )


@register
@dataclass
class AsugsState:
    """The driver's state: the stream after ``pass_no`` passes (one, when done)."""

    pass_no: int
    stream: masugs.StreamState
    sp: masugs.StreamParams
    history: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False
    init_record: dict[str, Any] | None = None

    @property
    def stats(self) -> FloatArray:
        """The classes' statistics (K, S)."""
        return self.stream.cluster_stats

    @property
    def n_clusters(self) -> int:
        return int(self.stream.K)

    @property
    def nk(self) -> FloatArray:
        return np.ascontiguousarray(self.stats[:, 0])

    @property
    def alpha(self) -> float:
        """alpha_n after the records seen (SUGS: the fixed alpha)."""
        return float(self.sp.concentration(self.stream.K, self.stream.n_seen))

    @property
    def objective(self) -> float:
        return float(self.history[-1]["objective"]) if self.history else math.inf


@dataclass
class StreamInput:
    """What a chunk task receives: the stream as the previous chunk left it."""

    p: int
    stream: masugs.StreamState
    sp: masugs.StreamParams
    family: ProductFamily


@dataclass
class StreamResult:
    """A chunk's part of the pass: the stream after its records."""

    c: int
    stream: masugs.StreamState
    n_changed: int
    n_train: int
    seconds: float


@dataclass
class StreamWriteInput:
    """What every write-out task receives: the final classes and each id's final class."""

    final_of_id: IntArray
    stats: FloatArray
    alpha: float
    family: ProductFamily
    plot_rate: float
    labels: bool


def _stream_chunk(chunk: Chunk, msg: StreamInput) -> tuple[StreamResult, IntArray]:
    t0 = time.perf_counter()
    X, hold = chunk.X, chunk.holdout
    # a copy: the kernel updates it in place, and a re-executed task must start from the same
    st, ids, _ = masugs.advance(msg.stream.copy(), X[~hold], msg.family, msg.sp)
    z = np.full(X.shape[0], -1, dtype=np.int64)
    z[~hold] = ids
    n = int(ids.shape[0])
    return StreamResult(chunk.c, st, n, n, time.perf_counter() - t0), z


def objective(stats: FloatArray, alpha: float, family: ProductFamily) -> float:
    """-log p(X, z | alpha) (Raykov et al. 2016, eq. 3.3) of the classes' statistics at alpha_n."""
    nk = np.ascontiguousarray(stats[:, 0])
    return float(kmapdp.objective(stats, nk, stats.shape[0], family.spec, family.prior, alpha))


class AsugsEngine(Engine):
    name: ClassVar[str] = "asugs"
    # as ``pipeline.estimators.asugs.ASUGS``'s
    prior_scale: ClassVar[float | None] = masugs.PRIOR_SCALE
    sequential: ClassVar[bool] = True
    record_arrays: ClassVar[tuple[RecordArray, ...]] = (RecordArray("z", "int64", -1),)

    def run_info(self, info: StoreInfo, params: FitParams) -> StoreInfo:
        """The run's prior as ``pipeline.ASUGS`` chooses it (``choose_prior`` on the store's prior
        sample) when neither the run nor ingest gives one."""
        base = super().run_info(info, params)
        if info.prior_fixed or params.prior_scale is not None:
            return base
        learn = params.learn_alpha
        sp = masugs.check_stream_params(
            masugs.DEFAULT_LAM if learn else None,
            None if learn else params.alpha,
            "greedy",
            True,
            masugs.PM_INTERVAL,
            masugs.PRUNE_WEIGHT,
        )
        fam = base.family
        rng = seed_state(chunk_seed(params.seed, params.restart, 0, 0))
        Xs = fam.arrange(np.asarray(info.sample)[: masugs.EB_RECORDS])
        chosen, _scale, _strength = masugs.choose_prior(fam, masugs.PRIOR_SCALE, Xs, sp, rng)
        return replace(base, family=chosen)

    def init_state(self, ctx: RunContext, client: Any) -> AsugsState:
        params = ctx.params
        rng = seed_state(chunk_seed(params.seed, params.restart, 0, 0))
        return AsugsState(0, masugs.StreamState.empty(ctx.info.family, rng), stream_params(ctx))

    def pass_input(
        self, state: Any, ctx: RunContext, p: int, scores_into: str | None
    ) -> StreamInput:
        """The stream as it stands (the loop runs one pass: the state is converged after it)."""
        return StreamInput(p, state.stream, state.sp, ctx.info.family)

    def chunk_step(self, chunk: Chunk, msg: StreamInput) -> StreamResult:
        """The chunk's training records streamed in row order; their class ids written."""
        res, z = _stream_chunk(chunk, msg)
        chunk.write("z", z)
        return res

    def carry(self, msg: StreamInput, result: StreamResult) -> StreamInput:
        return replace(msg, stream=result.stream)

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[AsugsState, dict[str, Any]]:
        results = sorted(results, key=lambda r: r.c)
        stream = results[-1].stream if results else state.stream
        new = AsugsState(
            state.pass_no + 1, stream, state.sp, list(state.history), True, state.init_record
        )
        fam = ctx.info.family
        e = objective(new.stats, new.alpha, fam) if new.n_clusters else 0.0
        record: dict[str, Any] = {
            "pass": new.pass_no,
            "objective": e,
            "n_clusters": new.n_clusters,
            "n_seen": int(stream.n_seen),
            "n_changed": int(sum(r.n_changed for r in results)),
            "pruned": int(stream.n_pruned - state.stream.n_pruned),
            "merges": int(stream.n_merged - state.stream.n_merged),
            "pruned_records": round(float(stream.pruned[0])),
            "alpha": new.alpha,
            "lam": state.sp.lam if state.sp.lam > 0 else None,
            "task_seconds": float(sum(r.seconds for r in results)),
            "stop": "one pass",
        }
        new.history.append(record)
        return new, record

    def write_input(self, state: Any, mapping: IntArray, ctx: RunContext) -> StreamWriteInput:
        rows = state.stream.rows_of_ids()
        final = np.where(rows >= 0, mapping[np.maximum(rows, 0)], -1).astype(np.int64)
        return StreamWriteInput(final_of_id=final, **write_fields(state, mapping, ctx.info))

    def score_chunk(self, chunk: Chunk, labels: str, msg: StreamWriteInput) -> WriteResult:
        """Final class of every training row (-1: its class was pruned) and the eq. 3.4 log
        density of every row; held-out rows get the eq. 3.5 MAP class."""
        X, hold = chunk.X, chunk.holdout
        ids = chunk.previous("z")
        final = np.where(ids >= 0, msg.final_of_id[np.maximum(ids, 0)], -1)
        pred, logdens = predict(X, msg.stats, msg.alpha, msg.family)
        label = np.where(hold, pred, final)
        return chunk.emit(labels, X, hold, label, logdens, msg.plot_rate, msg.labels)

    def warm_up(self) -> None:
        """Load the stream's kernels on toy records."""
        from pipeline.engines.warmup import toy_family

        X, family = toy_family()
        sp = masugs.check_stream_params(
            masugs.DEFAULT_LAM, None, "greedy", True, 4, masugs.PRUNE_WEIGHT
        )
        st, _, _ = masugs.advance(
            masugs.StreamState.empty(family, np.zeros(1, dtype=np.uint64)), X, family, sp
        )
        kasugs.row_of_ids(st.alias, st.ids, st.K)


ENGINE = AsugsEngine()


def _stream_task(data: str, c: int, a: int, b: int, msg: StreamInput) -> StreamResult:
    return _stream_chunk(Chunk(data, "", c, a, b, msg.p), msg)[0]


def _carry_task(msg: StreamInput, result: StreamResult) -> StreamInput:
    return ENGINE.carry(msg, result)


def stream_chunks(
    client: Any, data: str, info: StoreInfo, sp: masugs.StreamParams, rng: Any
) -> tuple[masugs.StreamState, float]:
    """One ASUGS pass over every chunk's training rows in order, on the workers (in this process
    when ``client`` is None), writing no labels; the final stream and its tasks' seconds."""
    msg: Any = StreamInput(1, masugs.StreamState.empty(info.family, rng), sp, info.family)
    if client is None:
        # in this process (the serial reference of the engine tests)
        seconds = 0.0
        for c, a, b in iter_chunks(info):
            res = _stream_task(data, c, a, b, msg)
            seconds += res.seconds
            msg = ENGINE.carry(msg, res)
        return msg.stream, seconds
    chunks = list(iter_chunks(info))
    outs: list[StreamResult] = on_scattered(
        client,
        [msg],
        lambda msg_f: chain_chunks(client, _stream_task, _carry_task, chunks, (data,), msg_f),
        what="ASUGS stream",
    )
    return outs[-1].stream, sum(out.seconds for out in outs)


def stream_sample(info: StoreInfo, n: int, sp: masugs.StreamParams, rng: Any) -> masugs.StreamState:
    """One ASUGS pass over the "sample" start's ``n`` training rows, in this process."""

    fam = info.family
    pos = init_sample_rows(info, int(n))
    Xs = fam.arrange(np.asarray(info.sample)[pos])
    st, _, _ = masugs.advance(masugs.StreamState.empty(fam, rng), Xs, fam, sp)
    return st
