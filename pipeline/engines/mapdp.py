"""The MAP-DP engine: seed 000 Algorithm 1 swept chunk by chunk (``kernels.mapdp.sweep``).

A chunk task that moves no record has scored every training record against the statistics it
was given while sweeping (eq. 3.4, the same terms the argmin used); it scores its held-out rows
against the same statistics and writes the chunk's final labels and densities into the run's
write-out group itself. When a whole pass moved nothing and left the model bit for bit as it was,
the write-out has nothing left to do (``PassState.scored``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from kernels import mapdp as kmapdp
from pipeline.data.labels import emit_chunk
from pipeline.engines.base import Chunk
from pipeline.engines.mixture import IntArray, MixtureEngine, PassInput, Sweep
from pipeline.engines.mixture_state import predict


class MapdpEngine(MixtureEngine):
    name: ClassVar[str] = "mapdp"
    fused_write_out: ClassVar[bool] = True

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
            # nothing moved: every training row was scored against msg.stats; score the
            # held-out rows against them too and write the chunk out
            label = z.copy()
            if hold.any():
                pred, ld = predict(X[hold], msg.stats, msg.alpha, fam)
                label[hold] = pred
                logdens[hold] = ld
            assert chunk is not None  # the warm-up asks for no scores
            written = emit_chunk(
                chunk.data,
                msg.scores_into,
                chunk.c,
                chunk.a,
                X,
                hold,
                label,
                logdens,
                msg.plot_rate,
                msg.has_y,
            )
        # number the slots opened here K, K + 1, ... in slot order
        slot_map = np.arange(max(n_slots, K), dtype=np.int64)
        new_slots = [s for s in range(K, n_slots) if nk[s] > 0]
        for j, s in enumerate(new_slots):
            slot_map[s] = K + j
        z[:] = np.where(z >= K, slot_map[np.maximum(z, 0)], z)
        return Sweep(z, len(new_slots), int(n_changed), written)


ENGINE = MapdpEngine()
