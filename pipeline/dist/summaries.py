"""Summaries (``dpmm run --summaries M``): one distributed pass after stage 1 splits cluster k
into m_k = max(1, round(M n_k / N)) slabs between normal quantiles of the projection on its
principal axis (from its statistics), writes the sub-cluster labels and returns their
statistics; stage 2 (``pipeline.stage2``) maps them to final clusters, and the write-out applies
the mapping. For the mixture engines, whose per-record state is a cluster label."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from pipeline.engines.base import Chunk, RunContext
from pipeline.engines.mixture_state import IntArray, PassState, current_labels
from pipeline.families import FloatArray, ProductFamily
from pipeline.store import iter_chunks

def summary_counts(nk: FloatArray, M: int) -> IntArray:
    """Sub-clusters of each stage-1 cluster: m_k = max(1, round(M n_k / N))."""
    n = float(nk.sum())
    return np.maximum(1, np.rint(M * nk / max(n, 1.0))).astype(np.int64)


def gaussian_moments(stats: FloatArray, family: ProductFamily) -> tuple[FloatArray, FloatArray]:
    """Mean (K, D) and covariance (K, D, D) of each cluster's records from its statistics, when
    every group of the family is a full-covariance Gaussian (block-diagonal across groups)."""
    from kernels.obs import product as kp

    K, D = stats.shape[0], family.n_cols
    mean = np.zeros((K, D))
    cov = np.zeros((K, D, D))
    n = np.maximum(stats[:, 0], 1.0)
    for r in family.spec:
        c0, nc, s0 = int(r[kp.COL0]), int(r[kp.NCOL]), int(r[kp.STAT0])
        m = stats[:, s0 + 1 : s0 + 1 + nc] / n[:, None]
        xx = stats[:, s0 + 1 + nc : s0 + 1 + nc + nc * nc].reshape(K, nc, nc) / n[:, None, None]
        mean[:, c0 : c0 + nc] = m
        cov[:, c0 : c0 + nc, c0 : c0 + nc] = xx - m[:, :, None] * m[:, None, :]
    return mean, cov


def _moments_task(data: str, state: str, c: int, a: int, b: int, msg: SplitInput) -> Any:
    chunk = Chunk(data, state, c, a, b, 0)
    X = chunk.X
    z = current_labels(chunk, msg, msg.buffer)
    m = z >= 0
    K, D = msg.n_parent, X.shape[1]
    n = np.bincount(z[m], minlength=K).astype(np.float64)
    s1 = np.zeros((K, D))
    np.add.at(s1, z[m], X[m])
    s2 = np.zeros((K, D, D))
    order = np.argsort(z[m], kind="stable")
    Xm, zm = X[m][order], z[m][order]
    bounds = np.searchsorted(zm, np.arange(K + 1))
    for k in range(K):
        Xk = Xm[bounds[k] : bounds[k + 1]]
        s2[k] = Xk.T @ Xk
    return n, s1, s2


def data_moments(client: Any, ctx: RunContext, state: PassState) -> tuple[FloatArray, FloatArray]:
    """Mean and covariance of each cluster's (arranged) records by one pass over the chunks:
    for families whose statistics do not hold them."""
    msg = _split_input(state, ctx, np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    data, st = str(ctx.data.path), str(ctx.state.path)
    futs = [
        client.submit(_moments_task, data, st, c, a, b, msg_f, pure=False)
        for c, a, b in iter_chunks(ctx.info)
    ]
    parts = client.gather(futs)
    n = np.maximum(sum(p[0] for p in parts), 1.0)
    mean = sum(p[1] for p in parts) / n[:, None]
    xx = sum(p[2] for p in parts) / n[:, None, None]
    return mean, xx - mean[:, :, None] * mean[:, None, :]


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
    )




def _split_chunk_task(data: str, state: str, c: int, a: int, b: int, msg: SplitInput) -> Any:
    """Sub-cluster of every training row of a chunk (quantile slab of the projection on its
    cluster's principal axis), written to ``out_buffer``; returns the sub-clusters' statistics."""
    chunk = Chunk(data, state, c, a, b, 0)
    X = chunk.X
    z = current_labels(chunk, msg, msg.buffer)
    m = z >= 0
    sub = np.full(z.shape[0], -1, dtype=np.int64)
    zk = z[m]
    t = np.einsum("nd,nd->n", X[m] - msg.mean[zk], msg.axis[zk])
    j = (msg.cuts[zk] < t[:, None]).sum(axis=1) if msg.cuts.shape[1] else np.zeros(zk.shape[0])
    sub[m] = msg.base[zk] + j.astype(np.int64)
    stats = msg.family.stats_of(X, sub, msg.n_sub)
    zarr.open_array(f"{state}/{msg.out_buffer}", mode="r+")[a:b] = sub
    return c, stats


@dataclass
class Summaries:
    """The summaries pass: the state whose clusters are the sub-clusters, and the stage-1
    cluster each came from."""

    state: PassState
    parent: IntArray
    record: dict[str, Any]


def split_summaries(client: Any, ctx: RunContext, state: PassState, M: int) -> Summaries:
    """One distributed pass after stage 1: cluster k becomes m_k = max(1, round(M n_k / N))
    sub-clusters, slabs between the quantiles j / m_k (j = 1..m_k - 1) of the projection of its
    records on its principal axis under a normal approximation (mean, covariance from the
    statistics, or from one moments pass for non-Gaussian families). Every chunk computes the
    cut points alike, so nothing is communicated but the sub-clusters' statistics. Empty
    sub-clusters are dropped. Labels go to the other buffer; the returned state decodes them."""
    from scipy.special import ndtri

    t0 = time.perf_counter()
    from kernels.obs import product as kp

    info = ctx.info
    K = state.n_clusters
    counts = summary_counts(state.nk, int(M))
    if np.all(info.family.spec[:, kp.CODE] == kp.GAUSSIAN_NW):
        mean, cov = gaussian_moments(state.stats, info.family)
    else:
        mean, cov = data_moments(client, ctx, state)
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
    msg_f = client.scatter(msg, broadcast=True, hash=False)
    futs = [
        client.submit(
            _split_chunk_task, str(ctx.data.path), str(ctx.state.path), c, a, b, msg_f,
            pure=False,
        )
        for c, a, b in iter_chunks(info)
    ]
    parts = sorted(client.gather(futs), key=lambda r: r[0])
    sub_stats = np.sum([p[1] for p in parts], axis=0).reshape(msg.n_sub, -1)
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


# -- stage 2 hook ----------------------------------------------------------------------------

Stage2 = Callable[[FloatArray, ProductFamily], IntArray]


def identity_stage2(stats: FloatArray, family: ProductFamily) -> IntArray:
    """The default stage 2: every stage-1 cluster is a final cluster.

    A stage 2 (BHC over the cluster summaries) takes the stage-1 statistics (K, S) and the
    family and returns, for each stage-1 cluster, its final cluster 0..K2-1.
    """
    return np.arange(stats.shape[0], dtype=np.int64)
