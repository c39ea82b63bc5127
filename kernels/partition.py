"""Operations on partitions of statistics rows shared by the clustering kernels: relabelling
(``canonical_labels``), the DP mixture's merge gap (``merge_gap``) and greedy merging
(``greedy_merge``; MAP-DP, Bayes K-means, the distributed passes' reconciliation).

The merge gap, the observation model's part plus the allocation model's,

    gap(a, b) = [log p(X_a u X_b) - log p(X_a) - log p(X_b)]
              + [log Gamma(n_a + n_b) - log Gamma(n_a) - log Gamma(n_b) - log alpha]

is the increase of log p(X, z | alpha) (Raykov et al. 2016, eq. 3.3 with eq. 2.3; Xu et al.
2009, eq. 5's summand) when clusters a and b merge.
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import crp
from kernels.arrays import borrowed, copy_vector
from kernels.obs import gaussian_nw, product


@njit(cache=True, nogil=True)
def canonical_labels(z, out):
    """out (N,) int64, may be z: the blocks z (N,) (ids >= 0, else ValueError) numbered 0, 1,
    ... by first appearance; returns their number."""
    m = 0
    for i in range(z.shape[0]):
        if z[i] < 0:
            raise ValueError("labels must be >= 0")
        if z[i] > m:
            m = z[i]
    remap = np.full(m + 1, -1, dtype=np.int64)
    nxt = 0
    for i in range(z.shape[0]):
        if remap[z[i]] < 0:
            remap[z[i]] = nxt
            nxt += 1
        out[i] = remap[z[i]]
    return nxt


@njit(cache=True, nogil=True)
def merge_gap_cached(sa, sb, lma, lmb, scratch, spec, prior, log_alpha):
    """(``merge_gap``, log p(X_a u X_b)) of the rows sa, sb (S,) given lma = log p(X_a) and
    lmb = log p(X_b); scratch (S,)."""
    obs, lm_ab = product.log_marginal_gap(sa, sb, lma, lmb, scratch, spec, prior)
    return obs + crp.merge_gap(sa[0], sb[0], log_alpha), lm_ab


@njit(cache=True, nogil=True)
def merge_gap(sa, sb, spec, prior, log_alpha):
    """The merge gap (module docstring) of the statistics rows sa, sb (S,)."""
    scratch = np.empty(sa.shape[0])
    lma = product.log_marginal(sa, spec, prior)
    lmb = product.log_marginal(sb, spec, prior)
    return merge_gap_cached(sa, sb, lma, lmb, scratch, spec, prior, log_alpha)[0]


# greedy_merge's O(K^2) log marginals for a Normal-Wishart-only family: scratch and the prior's
# log gammas once (``gaussian_nw.log_marginal_with``), each cluster's factor kept
# (``_keep_factor``), and a pair whose gap a bound (``gaussian_nw.merged_logdet_lower``) proves
# negative gets -inf without its merged log marginal: the same merges.
@njit(cache=True, nogil=True)
def _marginal_scratch(row, K, spec, prior, paths):
    """(Normal-Wishart only, T (d, d), m (d,), log Gamma_d(a0 / 2), ``fac``: L (K, d, d),
    m_k (K, d), (c_k, log|T_k|, log|S_k + n_k H|) (K, 3), scratch (d,), (d, d)) for K rows.
    paths: ``product.nw_paths``' (None: a spec of any family, none of the fast path compiled)."""
    nw = False
    d = 0
    lmv0 = 0.0
    if paths is not None:
        nw = spec.shape[0] == 1 and spec[0, product.CODE] == product.GAUSSIAN_NW
        if nw:
            d = gaussian_nw.dim_of_stats(row)
            lmv0 = gaussian_nw.log_marginal_prior_term(prior, d)
    kf = K if nw else 0
    fac = (
        np.empty((kf, d, d)),
        np.empty((kf, d)),
        np.empty((kf, 3)),
        np.empty(d),
        np.empty((d, d)),
    )
    return nw, np.empty((d, d)), np.empty(d), lmv0, fac


@njit(cache=True, nogil=True)
def _log_marginal(s, spec, prior, nw, T, m, lmv0, paths):
    """``product.log_marginal`` of the row s (``_marginal_scratch``'s fast path when nw)."""
    if paths is not None and nw:
        # product.log_marginal's sum over its one group starts at 0.0
        return 0.0 + gaussian_nw.log_marginal_with(s, prior, T, m, lmv0)
    return product.log_marginal(s, spec, prior)


_CK = 0
_LOGDET = 1
_SCATTER = 2


@njit(cache=True, nogil=True)
def _keep_factor(k, s, prior, T, m, fac):
    """Row k of ``fac`` from the T and m that ``_log_marginal`` of s (n > 0) just left."""
    Ls, ms, scal, y, W = fac
    d = m.shape[0]
    ld = 0.0
    for i in range(d):
        ms[k, i] = m[i]
        ld += 2.0 * math.log(T[i, i])
        for j in range(d):
            Ls[k, i, j] = T[i, j]
    scal[k, _CK] = prior[d] + s[0]
    scal[k, _LOGDET] = ld
    scal[k, _SCATTER] = gaussian_nw.scatter_logdet(s, prior, W, y)


@njit(cache=True, nogil=True)
def _merge_gap(a, b, sa, sb, lma, lmb, scratch, spec, prior, log_alpha, nw, T, m, lmv0, fac, paths):
    """``merge_gap_cached`` of rows a and b; with nw (-inf, 0.0) where a bound from a's or b's
    factor proves the gap negative by 1e-8 of the terms."""
    # paths None: numba drops the rest untyped (a None argument), no Normal-Wishart code compiled
    if paths is None or not nw:
        return merge_gap_cached(sa, sb, lma, lmb, scratch, spec, prior, log_alpha)
    alloc = crp.merge_gap(sa[0], sb[0], log_alpha)
    if sa[0] > 0.0 and sb[0] > 0.0:
        Ls, ms, scal, y, _ = fac
        n_ab = sa[0] + sb[0]
        half_a = 0.5 * (prior[m.shape[0] + 1] + n_ab)
        top, scale = gaussian_nw.merged_log_marginal_bound(n_ab, m.shape[0], prior, lmv0)
        top += alloc - lma - lmb
        scale += abs(alloc) + abs(lma) + abs(lmb) + 1.0
        for side in range(2):
            u, v, sv = (a, b, sb) if side == 0 else (b, a, sa)
            low = gaussian_nw.merged_logdet_lower(
                sv, scal[v, _SCATTER], Ls[u], ms[u], scal[u, _CK], scal[u, _LOGDET], y
            )
            t = half_a * low
            if top - t < -1e-8 * (scale + abs(t)):
                return -np.inf, 0.0
    for t in range(scratch.shape[0]):
        scratch[t] = sa[t] + sb[t]
    lm_ab = _log_marginal(scratch, spec, prior, nw, T, m, lmv0, paths)
    return (lm_ab - lma - lmb) + alloc, lm_ab


@njit(cache=True, nogil=True)
def _merges(
    work, alive, parent, lm, gap, lm_pair, scratch, spec, prior, log_alpha, nw, T, m, lmv0, fac,
    paths,
):  # fmt: skip
    """``greedy_merge``'s merges on its arrays, borrowed (``kernels.arrays.borrowed``: half a
    bounded gap's time was reference counting); returns their number."""
    work, alive, parent, lm, gap, lm_pair, scratch, spec, prior, T, m = (
        borrowed(work), borrowed(alive), borrowed(parent), borrowed(lm), borrowed(gap),
        borrowed(lm_pair), borrowed(scratch), borrowed(spec), borrowed(prior), borrowed(T),
        borrowed(m),
    )  # fmt: skip
    fac = (
        borrowed(fac[0]), borrowed(fac[1]), borrowed(fac[2]), borrowed(fac[3]), borrowed(fac[4]),
    )  # fmt: skip
    K = work.shape[0]
    for k in range(K):
        lm[k] = _log_marginal(work[k], spec, prior, nw, T, m, lmv0, paths)
        if paths is not None and nw and work[k, 0] > 0.0:
            _keep_factor(k, work[k], prior, T, m, fac)
    for a in range(K):
        for b in range(a + 1, K):
            gap[a, b], lm_pair[a, b] = _merge_gap(
                a, b, work[a], work[b], lm[a], lm[b], scratch, spec, prior, log_alpha, nw, T, m,
                lmv0, fac, paths,
            )  # fmt: skip
    n_merges = 0
    while True:
        best = 0.0
        ba = np.int64(-1)  # not a literal: _keep_factor would compile once more for it
        bb = -1
        for a in range(K):
            if not alive[a]:
                continue
            for b in range(a + 1, K):
                if alive[b] and gap[a, b] > best:
                    best = gap[a, b]
                    ba = a
                    bb = b
        if ba < 0:
            break
        for t in range(work.shape[1]):
            work[ba, t] += work[bb, t]
        alive[bb] = False
        parent[bb] = ba
        n_merges += 1
        lm[ba] = lm_pair[ba, bb]
        if paths is not None and nw:
            # the merged cluster's factor (lm_pair's value again)
            _log_marginal(work[ba], spec, prior, nw, T, m, lmv0, paths)
            _keep_factor(ba, work[ba], prior, T, m, fac)
        for c in range(K):
            if alive[c] and c != ba:
                a = min(ba, c)
                b = max(ba, c)
                gap[a, b], lm_pair[a, b] = _merge_gap(
                    a, b, work[a], work[b], lm[a], lm[b], scratch, spec, prior, log_alpha, nw, T,
                    m, lmv0, fac, paths,
                )  # fmt: skip
    return n_merges


@njit(cache=True, nogil=True)
def greedy_merge(stats, nk, spec, prior, log_alpha):
    """Merge the rows of stats (K, S) of the largest positive ``merge_gap`` (ties: the first
    (a, b), a < b) until none is positive; O(K^2) gaps, then O(K) a merge. nk (K,) unused.

    Returns
    -------
    target : ndarray of shape (K,), int64
        Each row's cluster, numbered 0..K'-1 in the order of the surviving rows.
    stats : ndarray of shape (K', S)
    n_merges : int
    """
    K = stats.shape[0]
    parent = np.arange(K)
    alive = np.ones(K, dtype=np.bool_)
    work = stats.copy()
    scratch = np.empty(stats.shape[1])
    # None for a spec of any family: the callees then compile without the fast path
    paths = product.nw_paths(spec)
    nw, T, m, lmv0, fac = _marginal_scratch(scratch, K, spec, prior, paths)
    lm = np.empty(K)
    gap = np.full((K, K), -np.inf)
    lm_pair = np.zeros((K, K))
    n_merges = _merges(
        work, alive, parent, lm, gap, lm_pair, scratch, spec, prior, log_alpha, nw, T, m, lmv0,
        fac, paths,
    )  # fmt: skip
    for k in range(K):
        r = k
        while parent[r] != r:
            r = parent[r]
        parent[k] = r
    remap = np.full(K, -1, dtype=np.int64)
    K2 = 0
    for k in range(K):
        if alive[k]:
            remap[k] = K2
            K2 += 1
    target = np.empty(K, dtype=np.int64)
    out = np.empty((K2, stats.shape[1]))
    for k in range(K):
        target[k] = remap[parent[k]]
        if alive[k]:
            copy_vector(out[remap[k]], work[k])
    return target, out, n_merges
