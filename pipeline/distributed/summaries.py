"""Summaries (``dpmm run --summaries M``): one distributed pass after stage 1 splits cluster k
into m_k = max(1, round(M n_k / N)) slabs between normal quantiles of the projection on its
principal axis (from its statistics), writes the sub-cluster labels and returns their
statistics; stage 2 (``pipeline.ops.stage2``) maps them to final clusters, and the write-out applies
the mapping. For the mixture engines, whose per-record state is a cluster label."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.core.tasks import map_chunks, on_scattered
from pipeline.data.chunk_io import read_rows, write_rows
from pipeline.data.store import iter_chunks
from pipeline.engines.base import Chunk, RunContext
from pipeline.engines.mixture_state import IntArray, PassState, current_labels
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats


def summary_counts(nk: FloatArray, M: int) -> IntArray:
    """Sub-clusters of each stage-1 cluster: m_k = max(1, round(M n_k / N))."""
    n = float(nk.sum())
    return np.maximum(1, np.rint(M * nk / max(n, 1.0))).astype(np.int64)


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
    # the MAP-DP engine's buffer of the filled missing cells the last pass wrote (None: no
    # training row has one), so that the sub-clusters' statistics are of the completed records
    fill_buffer: str | None = None


def _split_input(
    state: PassState, ctx: RunContext, mean: FloatArray, axis: FloatArray, cuts: FloatArray
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
        family=ctx.info.family,
        mean=mean,
        axis=axis,
        cuts=cuts,
        base=np.asarray(base, dtype=np.int64),
        n_sub=int(np.sum(m)) if K else 0,
        fill_buffer=f"fill{state.pass_no % 2}" if ctx.info.train_missing else None,
    )


def _split_chunk_task(data: str, state: str, c: int, a: int, b: int, msg: SplitInput) -> Stats:
    """Each training row's sub-cluster, written to ``out_buffer``; their statistics."""
    chunk = Chunk(data, state, c, a, b, 0)
    X = chunk.X
    if msg.fill_buffer is not None:
        filled = read_rows(f"{state}/{msg.fill_buffer}", a, b)
        X = np.where(np.isnan(X), np.asarray(filled), X)
    z = current_labels(chunk, msg, msg.buffer)
    m = z >= 0
    sub = np.full(z.shape[0], -1, dtype=np.int64)
    zk = z[m]
    t = np.einsum("nd,nd->n", X[m] - msg.mean[zk], msg.axis[zk])
    j = (msg.cuts[zk] < t[:, None]).sum(axis=1) if msg.cuts.shape[1] else np.zeros(zk.shape[0])
    sub[m] = msg.base[zk] + j.astype(np.int64)
    stats = Stats.of(msg.family, X, sub, msg.n_sub)
    write_rows(f"{state}/{msg.out_buffer}", a, b, sub)
    return stats


@dataclass
class Summaries:
    """The summaries pass's state, and the stage-1 cluster each sub-cluster came from."""

    state: PassState
    parent: IntArray
    record: dict[str, Any]


def split_summaries(client: Any, ctx: RunContext, state: PassState, M: int) -> Summaries:
    """One distributed pass after stage 1: cluster k becomes m_k = max(1, round(M n_k / N))
    sub-clusters, slabs between the normal quantiles of its projection on its principal axis
    (from its statistics, so every chunk cuts alike and only statistics travel). Empty ones are
    dropped; labels go to the other buffer, which the returned state decodes."""
    from scipy.special import ndtri

    t0 = time.perf_counter()
    info = ctx.info
    K = state.n_clusters
    counts = summary_counts(state.nk, int(M))
    mean, cov = Stats(state.stats, info.family).moments(info.family)
    # what the statistics leave undetermined is no direction to split along
    cov = np.nan_to_num(cov, nan=0.0)
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
    msg = _split_input(state, ctx, mean, axis, cuts)
    parts = on_scattered(
        client,
        [msg],
        lambda msg_f: map_chunks(
            client,
            _split_chunk_task,
            list(iter_chunks(info)),
            (str(ctx.data.path), str(ctx.state.path)),
            (msg_f,),
        ),
        what="summaries",
    )
    sub_stats = sum(parts[1:], parts[0]).array
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
    if ctx.progress:
        print(
            f"summaries: {record['summaries']} sub-clusters of {K} clusters, {seconds:.1f} s",
            file=sys.stderr,
        )
    return Summaries(new, parent_all[keep], record)


def identity_stage2(stats: FloatArray, family: ProductFamily) -> IntArray:
    """The default stage 2: every stage-1 cluster (stats (K, S)) is its own final cluster."""
    return np.arange(stats.shape[0], dtype=np.int64)
