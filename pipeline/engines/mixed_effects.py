"""The mixed-effects engine: Raykov et al. 2016, Section 7 (``pipeline.models.mixed_effects``) over
the subjects of a grouped dataset store.

Subjects are the store's groups, so a subject never straddles two chunks (in a store without
groups every row is a subject). ``RunContext.options`` names the response and covariates (default:
the last column, the others) and ``intercept`` (default True); held-out subjects are only scored.

A pass sweeps each chunk against a copy of the global model (``kernels.mixed_effects.sweep``),
reading its subjects' moments from the store's group Gram matrices (or from the rows when the
store has none), writes each row's cluster slot ``z`` (mapped to clusters by
``MixedState.slot_maps``) and returns additive ``SweepStats``; the driver adds them in chunk order
and takes the modes (``pipeline.models.mixed_effects.update``). The random effects' modes (eq. 7.2)
are computed only at the write-out (``subject_results``).

The start (``init_state``) reads the chunks twice, for the pooled least-squares moments and a hash
sample of subjects, and fits the sample in the driver
(``pipeline.models.mixed_effects_start.start``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kernels import mixed_effects as kme
from kernels.moments import group_gram
from pipeline.core.persist import register
from pipeline.data.store import iter_chunks, packed_index, read_group_moments
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext
from pipeline.models.mixed_effects import (
    GaussianFit,
    MixedModel,
    MixedPrior,
    Subjects,
    SweepStats,
    final_effects,
    icm_record,
    predictive_components,
    should_stop,
    start_labels,
    sweep_subjects,
    update,
)
from pipeline.models.mixed_effects_start import DEFAULT_TAU_PRIOR, SHRINK, start

FloatArray = np.ndarray
IntArray = np.ndarray


@dataclass(frozen=True)
class Columns:
    """Where the response and the covariates are among the store's columns."""

    response: int
    covariates: tuple[int, ...]
    intercept: bool
    # cross-validation: the fold whose subjects are held out (``RunContext.options["fold"]``)
    heldout_fold: int | None = None

    @property
    def p(self) -> int:
        return len(self.covariates) + int(self.intercept)

    @classmethod
    def of(cls, ctx: RunContext) -> Columns:
        names = ctx.info.names
        opts = ctx.options
        resp = opts.get("response", names[-1])
        covs = opts.get("covariates", [c for c in names if c != resp])
        for c in [resp, *covs]:
            if c not in names:
                raise ValueError(f"column {c!r} is not in the dataset store (columns {names})")
        if resp in covs:
            raise ValueError(f"column {resp!r} is both the response and a covariate")
        fold = opts.get("fold")
        return cls(
            names.index(resp),
            tuple(names.index(c) for c in covs),
            bool(opts.get("intercept", True)),
            None if fold is None else int(fold),
        )


@dataclass
class ChunkSubjects:
    """A chunk's subjects: their moments, each row's subject and each subject's first row."""

    sub: Subjects
    row_subject: IntArray
    first_row: IntArray


def read_subjects(
    chunk: Chunk,
    cols: Columns,
    grouped: bool,
    heldout_fold: int | None = None,
    moments: bool = False,
) -> ChunkSubjects:
    """The chunk's subjects, held out the store's held-out rows and fold ``heldout_fold``'s;
    ``moments``: from the store's per-group moments rather than from the rows."""
    if moments:
        return _subjects_of_moments(chunk, cols, heldout_fold)
    X = chunk.X
    hold = chunk.holdout
    if heldout_fold is not None:
        hold = hold | (chunk.read("fold") == heldout_fold)
    if grouped:
        codes = np.asarray(chunk.read("group"), dtype=np.int64)
    else:
        codes = np.arange(chunk.a, chunk.b, dtype=np.int64)
    uniq, first, inv = np.unique(codes, return_index=True, return_inverse=True)
    # subjects in their order in the chunk (stored order), not by code
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    inv = rank[inv.reshape(-1)]
    uniq, first = uniq[order], first[order]
    parts = [np.ones(X.shape[0])] if cols.intercept else []
    design = np.ascontiguousarray(np.column_stack(parts + [X[:, j] for j in cols.covariates]))
    y = np.ascontiguousarray(X[:, cols.response])
    XtX, Xty, yty, n_obs = kme.subject_moments(design, y, inv.astype(np.int64), uniq.size)
    sub = Subjects(XtX, Xty, yty, n_obs, ~hold[first], uniq.astype(np.int64))
    return ChunkSubjects(sub, inv.astype(np.int64), first.astype(np.int64))


def _subjects_of_moments(chunk: Chunk, cols: Columns, heldout_fold: int | None) -> ChunkSubjects:
    """``read_subjects`` from the store's per-group Gram matrices of W = [1, X]: X_i^T X_i,
    X_i^T y_i, y_i^T y_i and n_i are its blocks, equal bit for bit to the rows' moments."""
    gm = read_group_moments(chunk.data, chunk.c)
    hold = gm.holdout
    if heldout_fold is not None:
        hold = hold | (gm.fold == heldout_fold)
    idx = np.asarray(
        ([0] if cols.intercept else []) + [1 + j for j in cols.covariates], dtype=np.int64
    )
    r = 1 + cols.response
    at = packed_index(gm.gram.shape[1])
    g = gm.gram
    # indexing after a slice may not give C order, which the kernels are compiled for
    XtX = np.ascontiguousarray(g[:, at[idx[:, None], idx[None, :]]])
    Xty = np.ascontiguousarray(g[:, at[idx, r]])
    yty = np.ascontiguousarray(g[:, at[r, r]])
    n_obs = np.ascontiguousarray(g[:, 0])
    sizes = gm.n_rows
    if int(sizes.sum()) != chunk.b - chunk.a:
        raise ValueError(
            f"{chunk.data}: chunk {chunk.c}'s group moments cover {int(sizes.sum())} rows, its "
            f"rows are {chunk.b - chunk.a}; ingest the data again"
        )
    first = np.zeros(sizes.shape[0], dtype=np.int64)
    np.cumsum(sizes[:-1], out=first[1:])
    row_subject = np.repeat(np.arange(sizes.shape[0], dtype=np.int64), sizes)
    sub = Subjects(XtX, Xty, yty, n_obs, ~hold, gm.code)
    return ChunkSubjects(sub, row_subject, first)


@register
@dataclass
class MixedState:
    pass_no: int
    model: MixedModel
    prior: MixedPrior
    gaussian: GaussianFit
    start_codes: np.ndarray
    start_labels: np.ndarray
    # the cluster (in ``model``) of each slot number the last pass wrote to ``z``, chunk c's
    # in slot_maps[slot_bounds[c]:slot_bounds[c + 1]]
    slot_maps: np.ndarray
    slot_bounds: np.ndarray
    learn_alpha: bool
    history: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False
    # the prior's shrink and its evidence (``mixed_effects_start.choose_shrink``), for run.json
    shrink: dict[str, Any] = field(default_factory=dict)

    @property
    def objective(self) -> float:
        return float(self.history[-1]["objective"]) if self.history else math.inf

    @property
    def n_clusters(self) -> int:
        return self.model.n_clusters


@dataclass
class MixedInput:
    p: int
    model: MixedModel
    prior: MixedPrior
    columns: Columns
    grouped: bool
    slot_maps: np.ndarray
    slot_bounds: np.ndarray
    start_codes: np.ndarray | None = None
    start_labels: np.ndarray | None = None
    plot_rate: float = 0.0
    has_y: bool = False
    # read the subjects from the store's group moments (``StoreInfo.group_moments``)
    moments: bool = False


def _input(state: Any, ctx: RunContext, p: int, **kw: Any) -> MixedInput:
    """Pass p's input from the state ``MixedState``; ``kw``: its optional fields."""
    return MixedInput(
        p,
        state.model,
        state.prior,
        Columns.of(ctx),
        ctx.info.grouped,
        state.slot_maps,
        state.slot_bounds,
        moments=_moments(ctx),
        **kw,
    )


@dataclass
class MixedResult:
    c: int
    stats: SweepStats
    n_changed: int
    n_train: int
    seconds: float


def current_clusters(cs: ChunkSubjects, chunk: Chunk, msg: MixedInput) -> IntArray:
    """Each subject's cluster as the previous pass left it (-1: none; pass 1: the start's)."""
    if msg.start_codes is not None and msg.start_labels is not None:
        return start_labels(cs.sub, msg.start_codes, msg.start_labels)
    slots = np.asarray(chunk.previous("z"), dtype=np.int64)[cs.first_row]
    smap = msg.slot_maps[msg.slot_bounds[chunk.c] : msg.slot_bounds[chunk.c + 1]]
    z = np.full(slots.shape[0], -1, dtype=np.int64)
    ok = (slots >= 0) & cs.sub.train
    z[ok] = smap[slots[ok]]
    return z


class MixedEffectsEngine(Engine):
    name: ClassVar[str] = "mixed_effects"
    record_arrays: ClassVar[tuple[RecordArray, ...]] = (RecordArray("z", "int64", -1),)

    def init_state(self, ctx: RunContext, client: Any) -> MixedState:
        cols = Columns.of(ctx)
        info = ctx.info
        data = str(ctx.data.path)
        chunks = list(iter_chunks(info))
        how = (info.grouped, _moments(ctx))

        def map_chunks(fn: Any, *args: Any) -> list[Any]:
            if client is None:
                return [_on_chunk(data, c, a, b, cols, how, fn, *args) for c, a, b in chunks]
            futs = [
                client.submit(_on_chunk, data, c, a, b, cols, how, fn, *args, pure=False)
                for c, a, b in chunks
            ]
            return list(client.gather(futs))

        n_train = info.n_groups if info.grouped else info.n_rows
        opts = ctx.options
        st, _ = start(
            map_chunks,
            n_train,
            ctx.params.alpha,
            opts.get("shrink", SHRINK),
            tuple(opts.get("tau_prior", (DEFAULT_TAU_PRIOR[0], None))),  # type: ignore[arg-type]
            ctx.params.alpha_prior,
            opts.get("prior"),
            "one-cluster" if ctx.params.init == "one-cluster" else "auto",
            int(ctx.params.seed),
            int(ctx.params.init_sample),
            int(ctx.params.max_passes),
            float(ctx.params.tol),
            float(ctx.params.min_change),
        )
        st.model.history = []
        return MixedState(
            0,
            st.model,
            st.prior,
            st.gaussian,
            st.codes,
            st.labels,
            np.zeros(0, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
            ctx.params.learn_alpha,
            shrink=st.shrink,
        )

    def pass_input(
        self, state: Any, ctx: RunContext, p: int, scores_into: str | None
    ) -> MixedInput:
        first = state.pass_no == 0
        return _input(
            state,
            ctx,
            p,
            start_codes=state.start_codes if first else None,
            start_labels=state.start_labels if first else None,
        )

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[MixedState, dict[str, Any]]:
        results = sorted(results, key=lambda r: r.c)
        K = state.model.n_clusters
        p = state.prior.p
        n, s, ss, lnw = np.zeros(K), np.zeros((K, p)), np.zeros((K, p, p)), np.zeros(K)
        lnw[:] = state.model.log_nw
        extra_n, extra_s, extra_ss, extra_l, offsets = [], [], [], [], []
        total = K
        for r in results:
            st = r.stats
            n += st.n[:K]
            s += st.s[:K]
            ss += st.ss[:K]
            offsets.append(total)
            extra_n.append(st.n[K:])
            extra_s.append(st.s[K:])
            extra_ss.append(st.ss[K:])
            extra_l.append(st.log_nw[K:])
            total += st.n.shape[0] - K
        stats = SweepStats(
            np.concatenate([n, *extra_n]),
            np.concatenate([s, *extra_s]).reshape(-1, p),
            np.concatenate([ss, *extra_ss]).reshape(-1, p, p),
            np.concatenate([lnw, *extra_l]),
            float(sum(r.stats.rss for r in results)),
            float(sum(r.stats.n_obs for r in results)),
            float(sum(r.stats.nll for r in results)),
        )
        new, mapping, e, merges = update(stats, state.model, state.prior, state.learn_alpha)
        slot_maps = []
        for r, off in zip(results, offsets, strict=True):
            m = np.empty(r.stats.n.shape[0], dtype=np.int64)
            m[:K] = mapping[:K]
            m[K:] = mapping[off : off + r.stats.n.shape[0] - K]
            slot_maps.append(m)
        bounds = np.cumsum([0] + [m.shape[0] for m in slot_maps]).astype(np.int64)
        changed = sum(r.n_changed for r in results)
        n_train = sum(r.n_train for r in results)
        moved = changed + int(merges > 0) * n_train
        stop = should_stop(
            state.objective, e, moved, n_train, ctx.params.tol, ctx.params.min_change
        )
        record = icm_record(state.pass_no + 1, e, new, changed, merges, stop)
        new.history = []
        out = MixedState(
            state.pass_no + 1,
            new,
            state.prior,
            state.gaussian,
            state.start_codes,
            state.start_labels,
            np.concatenate(slot_maps).astype(np.int64),
            bounds,
            state.learn_alpha,
            [*state.history, record],
            stop is not None,
            state.shrink,
        )
        return out, record

    def write_input(self, state: Any, mapping: np.ndarray, ctx: RunContext) -> MixedInput:
        return _input(state, ctx, state.pass_no + 1, has_y=ctx.info.label_column is not None)

    def chunk_step(self, chunk: Chunk, msg: MixedInput) -> MixedResult:
        t0 = time.perf_counter()
        cs = _read(chunk, msg)
        sub = cs.sub
        z = current_clusters(cs, chunk, msg)
        z, _, changed, stats = sweep_subjects(
            sub.XtX, sub.Xty, sub.yty, sub.n_obs, sub.train, z, msg.model, msg.prior
        )
        chunk.write("z", z[cs.row_subject])
        return MixedResult(chunk.c, stats, changed, int(sub.train.sum()), time.perf_counter() - t0)

    def subject_results(
        self, chunk: Chunk, msg: MixedInput, cs: ChunkSubjects | None = None
    ) -> dict[str, np.ndarray]:
        """The final per-subject results of a chunk: codes, training flag, cluster (held out:
        the MAP cluster, -1 for a new one), eq. 7.2 modes, log predictive density and number of
        observations (``cs``: the chunk's subjects, if read already)."""
        if cs is None:
            cs = _read(chunk, msg)
        sub = cs.sub
        z = current_clusters(cs, chunk, msg)
        mu, R, ld, log_w = predictive_components(msg.model, msg.prior)
        comp, logd = kme.mixture_log_predictive(
            sub.XtX, sub.Xty, sub.yty, sub.n_obs, msg.model.tau, mu, R, ld, log_w
        )
        joint = comp + log_w
        pred = np.argmax(joint, axis=1)
        pred = np.where(pred == joint.shape[1] - 1, -1, pred)
        hold = ~sub.train
        z[hold] = pred[hold]
        beta = final_effects(
            sub.XtX, sub.Xty, sub.yty, sub.n_obs, np.ones_like(sub.train), z, msg.model
        )
        return {
            "code": sub.codes,
            "train": sub.train,
            "label": z,
            "beta": beta,
            "log_density": logd,
            "n_obs": sub.n_obs,
            "first_row": cs.first_row + chunk.a,
        }

    def score_chunk(self, chunk: Chunk, labels: str, msg: MixedInput) -> Any:
        """Each row's subject's final cluster and the log predictive density of the subject's
        responses divided among its rows (so that sums over rows are sums over subjects)."""
        cs = _read(chunk, msg)
        res = self.subject_results(chunk, msg, cs)
        per_row = res["log_density"] / res["n_obs"]
        X = chunk.X
        hold = chunk.holdout
        return chunk.emit(
            labels,
            X,
            hold,
            res["label"][cs.row_subject],
            per_row[cs.row_subject],
            msg.plot_rate,
            msg.has_y,
        )

    def warm_up(self) -> None:
        rng = np.random.default_rng(0)
        X = np.column_stack([np.ones(6), rng.normal(size=6)])
        # the ingest of a grouped store computes its groups' moments (``pipeline.data.store``)
        group_gram(X, np.arange(0, 7, 2, dtype=np.int64))
        XtX, Xty, yty, n_obs = kme.subject_moments(X, rng.normal(size=6), np.arange(6) % 2, 2)
        kme.ols_moments(XtX, Xty, yty, n_obs, np.ones(2, dtype=bool))


def _moments(ctx: RunContext) -> bool:
    """Whether the subjects are read from the group moments a grouped store keeps."""
    return ctx.info.grouped and ctx.info.group_moments


def _read(chunk: Chunk, msg: MixedInput) -> ChunkSubjects:
    return read_subjects(
        chunk, msg.columns, msg.grouped, msg.columns.heldout_fold, moments=msg.moments
    )


def _on_chunk(
    data: str, c: int, a: int, b: int, cols: Columns, how: tuple[bool, bool], fn: Any, *args: Any
) -> Any:
    """``fn(subjects of chunk c, *args)``; ``how``: grouped, from group moments."""
    chunk = Chunk(data, "", c, a, b, 0)
    return fn(read_subjects(chunk, cols, how[0], cols.heldout_fold, moments=how[1]).sub, *args)


ENGINE = MixedEffectsEngine()
