"""The MAP-DP engine: Raykov et al. 2016, Algorithm 1 swept chunk by chunk
(``kernels.mapdp.sweep``).

A chunk task that moves no record also scores and writes its final labels and densities, so a
pass that moved nothing leaves the write-out nothing to do (``PassState.scored``).

Missing cells are latent variables set by ICM, as ``pipeline.models.mapdp.fit_missing`` does in
memory: each chunk keeps its filled cells in a double-buffered per-record ``fill``, so the
statistics are those of the completed records and deltas stay exact. Per pass and chunk: the sweep
on the completed records, then each record with holes moved to its MAP cluster on its observed
cells (``dpm_predict``), then its holes set to their conditional mode (``ProductFamily.impute``).
The write-out scores every record on its observed cells only.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from kernels import bayes_kmeans as kbk
from kernels import mapdp as kmapdp
from pipeline.engines.base import Chunk, RecordArray, RunContext
from pipeline.engines.mixture import ChunkResult, IntArray, MixtureEngine, PassInput, Sweep
from pipeline.engines.mixture_start import prior_filled
from pipeline.engines.mixture_state import predict
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats
from pipeline.models.mapdp import choose_scale, dpm_predict

if TYPE_CHECKING:
    from pipeline.core.config import FitParams
    from pipeline.data.store import StoreInfo


class MapdpEngine(MixtureEngine):
    name: ClassVar[str] = "mapdp"
    fused_write_out: ClassVar[bool] = True
    takes_missing: ClassVar[bool] = True

    def run_info(self, info: StoreInfo, params: FitParams) -> StoreInfo:
        """``Engine.run_info``; given no prior scale, the one ``MAPDP`` chooses in memory for
        as many training records (``Schema.choose_scale`` on the store's prior sample, whose
        rows include the same structure sample), recorded in the run's schema."""
        if params.prior_scale is None and not info.prior_fixed and info.sample_rows is not None:
            schema = copy.deepcopy(info.schema)
            schema.choose_scale(info.sample, info.sample_rows, choose_scale, info.n_train)
            info = replace(info, schema=schema)
        return super().run_info(info, params)

    def sweep(
        self, chunk: Chunk | None, msg: PassInput, X: Any, hold: Any, order: IntArray, z: IntArray
    ) -> Sweep:
        fam = msg.family
        spec, prior, empty_c = fam.spec, fam.prior, fam.empty_cache()
        K = msg.stats.shape[0]
        cap = K + 8
        stats = np.zeros((cap, fam.n_stats))
        stats[:K] = msg.stats
        cache = np.zeros((cap, fam.n_cache))
        cache[:K] = fam.cache_of(msg.stats)
        nk = np.zeros(cap)
        nk[:K] = msg.stats[:, 0]
        logdens = np.full(X.shape[0], np.nan) if msg.scores_into else np.empty(0)
        stats, cache, nk, n_slots, n_changed = kmapdp.sweep(
            X, order, z, stats, cache, nk, K, spec, prior, empty_c, msg.alpha, logdens
        )
        written = None
        if msg.scores_into and n_changed == 0:
            # nothing moved: score the held-out rows against msg.stats too and write out
            label = z.copy()
            if hold.any():
                pred, ld = predict(X[hold], msg.stats, msg.alpha, fam)
                label[hold] = pred
                logdens[hold] = ld
            assert chunk is not None  # the warm-up asks for no scores
            written = chunk.emit(msg.scores_into, X, hold, label, logdens, msg.plot_rate, msg.has_y)
        # number the slots opened here K, K + 1, ... in slot order
        slot_map = np.arange(max(n_slots, K), dtype=np.int64)
        new_slots = [s for s in range(K, n_slots) if nk[s] > 0]
        for j, s in enumerate(new_slots):
            slot_map[s] = K + j
        z[:] = np.where(z >= K, slot_map[np.maximum(z, 0)], z)
        return Sweep(z, len(new_slots), int(n_changed), written)

    def record_arrays_of(self, ctx: RunContext) -> tuple[RecordArray, ...]:
        """The labels, and with missing cells in the training rows their filled values
        (``fill``: (n, D), NaN where the record has a value; module docstring)."""
        if not ctx.info.train_missing:
            return self.record_arrays
        return (*self.record_arrays, RecordArray("fill", "float64", np.nan, ctx.info.family.n_cols))

    def pass_input(self, state: Any, ctx: RunContext, p: int, scores_into: str | None) -> PassInput:
        msg = super().pass_input(state, ctx, p, scores_into)
        if ctx.info.train_missing:
            msg.fills = True
            msg.init_fill = getattr(state, "init_fill", None)
        return msg

    def chunk_step(self, chunk: Chunk, msg: PassInput) -> ChunkResult:
        if not msg.fills:
            return super().chunk_step(chunk, msg)
        return self._chunk_step_missing(chunk, msg)

    def _chunk_step_missing(self, chunk: Chunk, msg: PassInput) -> ChunkResult:
        """A pass over a chunk whose records may have missing cells (module docstring); reads
        the buffers z and fill of pass p - 1 and writes those of pass p, as the other steps."""
        t0 = time.perf_counter()
        fam = msg.family
        X, hold = chunk.X, chunk.holdout
        K = msg.stats.shape[0]
        z, order = self.pass_start(chunk, msg)
        miss = np.isnan(X) & ~hold[:, None]
        part = np.flatnonzero(miss.any(axis=1))
        Xf = completed_records(chunk, msg, X, miss, part)
        z_old = z.copy()
        # records with holes are scored on their observed cells by the write-out tasks
        swept = self.sweep(chunk, replace(msg, scores_into=None), Xf, hold, order, z)
        M = swept.n_new
        z_new = swept.z
        if part.size:
            local = _local_stats(fam, msg.stats, Xf, order, z_old, z_new, K, M)
            live = np.flatnonzero(local[:, 0] > 0.5)
            lab = dpm_predict(np.ascontiguousarray(X[part]), local[live], msg.alpha, fam)[0]
            z_new[part] = np.where(lab >= 0, live[np.maximum(lab, 0)], z_new[part])
            local = _local_stats(fam, msg.stats, Xf, order, z_old, z_new, K, M)
            Xn = Xf.copy()
            Xn[part] = fam.impute(np.ascontiguousarray(X[part]), local, z_new[part])
        else:
            Xn = Xf
        train = ~hold
        moved = train & (z_new != z_old)
        changed = moved | (train & np.any(Xn != Xf, axis=1))
        ch = np.flatnonzero(changed)
        old = fam.stats_of(np.ascontiguousarray(Xf[ch]), z_old[ch], K)
        new = fam.stats_of(np.ascontiguousarray(Xn[ch]), z_new[ch], K + M)
        z_new[hold] = -1
        chunk.write("z", z_new)
        chunk.write("fill", np.where(miss, Xn, np.nan))
        return ChunkResult(
            chunk.c,
            Stats(new[:K] - old, fam),
            Stats(np.ascontiguousarray(new[K:]), fam),
            int(moved.sum()),
            int(order.shape[0]),
            time.perf_counter() - t0,
        )


def completed_records(
    chunk: Chunk, msg: PassInput, X: FloatArray, miss: NDArray[np.bool_], part: IntArray
) -> FloatArray:
    """The chunk's records X (n, D) with the training rows' missing cells (``miss``, rows
    ``part``) as the previous pass filled them; in pass 1 from ``prior_filled``."""
    if not part.size:
        return X
    if msg.p != 1:
        return np.where(miss, chunk.previous("fill"), X)
    Xf = X.copy()
    Xf[part] = prior_filled(np.ascontiguousarray(X[part]), msg.family)
    if msg.init_fill is not None:
        sel = (msg.init_rows >= chunk.a) & (msg.init_rows < chunk.b)
        at = msg.init_rows[sel] - chunk.a
        given = msg.init_fill[sel]
        Xf[at] = np.where(np.isnan(given), Xf[at], given)
    return np.where(miss, Xf, X)


def _local_stats(
    fam: ProductFamily,
    stats: FloatArray,
    Xf: FloatArray,
    order: IntArray,
    z_old: IntArray,
    z_new: IntArray,
    K: int,
    M: int,
) -> FloatArray:
    """The global statistics (K, S) with this chunk's relabelling z_old -> z_new of the
    completed records Xf, and the M clusters it opened: (K + M, S)."""
    delta, new = kbk.label_deltas(Xf, order, z_old, z_new, K, M, fam.spec, fam.n_stats)
    return np.ascontiguousarray(np.vstack([stats + delta, new]))


ENGINE = MapdpEngine()
