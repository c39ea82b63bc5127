"""The Bayes K-means engine (Xu et al. 2009, Section 5): each record to the cluster that raises the
DPM's log joint most (``kernels.bayes_kmeans.assign``); after every pass, greedy merges over all
pairs of clusters (Section 5's merge step)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from kernels import bayes_kmeans as kbk
from pipeline.engines.base import Chunk
from pipeline.engines.mixture import IntArray, MixtureEngine, PassInput, Sweep


class KmeansEngine(MixtureEngine):
    name: ClassVar[str] = "kmeans"

    def sweep(
        self, chunk: Chunk | None, msg: PassInput, X: Any, hold: Any, order: IntArray, z: IntArray
    ) -> Sweep:
        fam = msg.family
        K = msg.stats.shape[0]
        new_stats, n_changed = kbk.assign(
            X,
            order,
            z,
            msg.stats,
            fam.cache_of(msg.stats),
            np.ascontiguousarray(msg.stats[:, 0]),
            K,
            fam.spec,
            fam.prior,
            fam.empty_cache(),
            math.log(msg.alpha),
        )
        return Sweep(z, int(new_stats.shape[0]), int(n_changed))


ENGINE = KmeansEngine()
