"""The state the mixture engines (MAP-DP, Bayes K-means) share: the driver's ``PassState`` and
each record's cluster label, written by the pass that assigned it and relabelled lazily (the next
reader decodes it through ``remap``, ``k_written`` and ``offsets``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.core.persist import register
from pipeline.data.chunk_io import read_rows
from pipeline.data.labels import PLOT_POINTS, WriteResult
from pipeline.data.store import StoreInfo, iter_chunks, row_uniform
from pipeline.engines.base import Chunk, RunContext
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats
from pipeline.models.mapdp import dpm_predict

IntArray = NDArray[np.int64]


@register
@dataclass
class PassState:
    """The driver's state after ``pass_no`` passes: all a resumed run needs (``remap``,
    ``k_written``, ``offsets`` decode the last pass's labels; ``init_*`` the start's)."""

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
    # the learned alpha is eq. A.1's mode for (n_train, alpha_k clusters); -1: for none
    alpha_k: int = -1
    # when the pass changed nothing, its chunk tasks already wrote every row's final label and
    # density into ``scored_into``: their write-out results, by chunk
    scored: list[WriteResult] | None = None
    scored_into: str | None = None
    # a warm start's clusters (K, S), taken out again after pass 1 assigned the records
    warm: FloatArray | None = None
    # the "sample" start's filled missing cells (len(init_rows), D), arranged, NaN where the
    # row has a value: pass 1's completed records of the sample (``pipeline.engines.mapdp``)
    init_fill: FloatArray | None = None

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
    K = remap.shape[0]
    if K == k_written and raw.max(initial=-1) < K and np.array_equal(remap, np.arange(K)):
        # a pass that opened, merged and dropped nothing: the labels are the current ones
        return raw.astype(np.int64, copy=True)
    out = np.full(raw.shape[0], -1, dtype=np.int64)
    m = raw >= 0
    lab = raw[m]
    idx = np.where(lab < k_written, lab, lab + offset)
    out[m] = remap[idx]
    return out


def current_labels(chunk: Chunk, state: Any, buffer: str | None = None) -> IntArray:
    """The chunk's labels as the current cluster numbers: ``buffer`` (default: the one the
    previous pass wrote) decoded by ``state``'s ``remap``, ``k_written`` and ``offsets``."""
    name = buffer or f"z{(chunk.p - 1) % 2}"
    raw = read_rows(os.path.join(chunk.state, name), chunk.a, chunk.b)
    off = int(state.offsets[chunk.c]) if state.offsets.size else 0
    return decode_labels(raw, state.remap, state.k_written, off)


def chunk_seed(seed: int, restart: int, p: int, c: int) -> np.random.SeedSequence:
    """The SeedSequence child (restart, pass, chunk) of the run's entropy."""
    return np.random.SeedSequence(seed, spawn_key=(restart, p, c))


def read_labels(ctx: RunContext, state: PassState) -> IntArray:
    """Current label of every row (-1 for held-out rows), in memory: for the estimator API."""
    info = ctx.info
    raw = np.asarray(ctx.state.array(state.buffer)[:])
    out = np.full(raw.shape[0], -1, dtype=np.int64)
    for c, a, b in iter_chunks(info):
        off = int(state.offsets[c]) if state.offsets.size else 0
        out[a:b] = decode_labels(raw[a:b], state.remap, state.k_written, off)
    return out


def predict(
    X: FloatArray, stats: FloatArray, alpha: float, family: ProductFamily
) -> tuple[IntArray, FloatArray]:
    """Eq. 3.5's MAP cluster (-1: a new one) and eq. 3.4's log density of each record of X
    (n, D) under ``stats`` (K, S) and ``alpha`` (``dpm_predict``)."""
    return dpm_predict(X, stats, alpha, family)


def plot_rate(info: StoreInfo) -> float:
    """Share of rows (by a hash of the row index) kept for the report's projection."""
    return min(1.0, PLOT_POINTS / max(info.n_rows, 1))


def write_fields(state: Any, mapping: IntArray, info: StoreInfo) -> dict[str, Any]:
    """The write-out input fields every mixture engine shares: the final clusters' statistics,
    ``alpha``, the family, ``plot_rate`` and whether the store has true ``labels``."""
    return {
        "stats": Stats(state.stats, info.family).merged(mapping).array,
        "alpha": state.alpha,
        "family": info.family,
        "plot_rate": plot_rate(info),
        "labels": info.label_column is not None,
    }


INIT_SALT = 0x5EED_0004


def init_sample_rows(info: StoreInfo, n: int) -> IntArray:
    """Positions in ``info.sample`` of the "sample" start: the ``n`` prior-sample rows with the
    smallest hash ``row_uniform(row, INIT_SALT)``, in row order (all of them when fewer)."""
    rows = np.asarray(info.sample_rows, dtype=np.int64)
    if rows.shape[0] <= n:
        return np.arange(rows.shape[0], dtype=np.int64)
    pick = np.argsort(row_uniform(rows, INIT_SALT), kind="stable")[:n]
    return np.sort(pick).astype(np.int64)
