"""Bayes K-means (Xu et al. 2009, Section 5): the one implementation, over leaf summaries
(``bayes_kmeans``) and as the per-chunk assignment step of the distributed passes (``assign``,
with the chunk bookkeeping ``label_deltas``).

Bayes K-means is K-means with the DPM's marginal likelihood as the criterion: every record (or
leaf) goes to the cluster, or a new one, that maximises the joint log p(X, z) of the DPM. For one
record i this minimises

    - log p(x_i | X_{k,-i}) - log N_{k,-i}      (an existing cluster k)
    - log p(x_i) - log N0                       (a new cluster)

which is the MAP-DP cost (Raykov et al. 2016, eqs. 3.1-3.2; the prior terms are
``kernels.alloc.crp``'s ``log_join`` and ``log_new``); for a leaf summarising several records it
joins the cluster with the largest positive merge gap (``kernels.partition.merge_gap``), else opens
a new one. What makes it *K-means-like* is that the existing clusters' statistics are frozen during
an assignment step of ``assign`` (a Lloyd step): they are recomputed from the new assignment
afterwards, by the caller adding the deltas (``label_deltas``), and clusters are then merged
greedily while the marginal likelihood grows (``kernels.partition.greedy_merge``). Records that open
new clusters in a chunk update those clusters incrementally, so the records of a cluster missing
from the frozen set gather in one new cluster.

Clusters are rows of ``stats`` (K, S), ``cache`` (K, C) and ``nk`` (K,) as in ``kernels.mapdp``.
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import crp
from kernels.arrays import aligned_matrix, copy_rows, copy_vector, prefetch
from kernels.mapdp import _AHEAD, _free_slot, _pruned_costs, load_block
from kernels.obs import gaussian_nw, product
from kernels.partition import canonical_labels, greedy_merge, merge_gap_cached


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk):
    cap = stats.shape[0]
    new_cap = max(2 * cap, 4)
    s2 = np.zeros((new_cap, stats.shape[1]))
    c2 = np.zeros((new_cap, cache.shape[1]))
    n2 = np.zeros(new_cap)
    copy_rows(s2, stats)
    copy_rows(c2, cache)
    copy_vector(n2, nk)
    return s2, c2, n2


_BLOCK = 64


@njit(cache=True, nogil=True)
def _loo(x, k0, stats, cache, spec, prior, loo, loo_ok, scratch_s, scratch_c, d, r):
    """log p(x | X_k0 without x) of a frozen cluster from its cached terms
    (``gaussian_nw.loo_constants``) and r = |L_k0^{-1} (x - m_k0)|^2, the record's quadratic
    form under k0's packed column (``kernels.mapdp._loo_cost``); the downdated copy where
    rounding leaves the closed form no positive determinant ratio."""
    if not loo_ok[k0]:
        gaussian_nw.loo_constants(cache[k0], d, loo[k0])
        loo_ok[k0] = True
    one_minus = 1.0 - loo[k0, 2] * r
    if one_minus > 0.0:
        return loo[k0, 0] + loo[k0, 1] * math.log(one_minus)
    return _downdated(x, stats[k0], cache[k0], spec, prior, scratch_s, scratch_c)


@njit(cache=True, nogil=True)
def _downdated(x, s, c, spec, prior, scratch_s, scratch_c):
    """log p(x | X_k without x) of a member x, from a copy of the row (s, c) that x leaves."""
    copy_vector(scratch_s, s)
    copy_vector(scratch_c, c)
    product.update(x, scratch_s, scratch_c, spec, prior, -1.0)
    return product.log_predictive(x, scratch_s, scratch_c, spec, prior)


@njit(cache=True, nogil=True, inline="always")
def _frozen_cost(x, k, k0, stats, cache, nk, lognk, spec, prior, scratch_s, scratch_c):
    """x's cost (module docstring) of frozen cluster k, its own k0 without it; inf for an empty
    cluster and for k0 when x is alone in it."""
    if k == k0:
        if nk[k] <= 1.0:
            return np.inf
        lp = _downdated(x, stats[k], cache[k], spec, prior, scratch_s, scratch_c)
        return -lp - crp.log_join(nk[k] - 1.0)
    if lognk[k] == -np.inf:
        return np.inf
    return -product.log_predictive(x, stats[k], cache[k], spec, prior) - lognk[k]


@njit(cache=True, nogil=True, inline="always")
def _packed_costs(
    t, X, order, XT, P, Q, bacc, qv, x, k0, stats, cache, nk, lognk, spec, prior, loo, loo_ok,
    scratch_s, scratch_c, log_new, e0, ub, costs,
):  # fmt: skip
    """``assign``'s costs of the t-th record x (cluster k0) under the packed frozen clusters P
    (``kernels.mapdp._pruned_costs``), the quadratic forms of its block of records computed
    (XT, Q, bacc) at the block's first record."""
    K = P.shape[1] - 1
    nb = XT.shape[1]
    d = x.shape[0]
    u = t % nb
    if u == 0:
        b1 = min(t + nb, order.shape[0])
        load_block(XT, X, order, t, b1)
        gaussian_nw.block_quad_forms(XT, 0, b1 - t, P, K + 1, d, bacc, Q)
    for h in range(K + 1):
        qv[h] = Q[h, u]
    cost0 = np.inf
    if k0 >= 0 and nk[k0] > 1.0:
        lp = _loo(x, k0, stats, cache, spec, prior, loo, loo_ok, scratch_s, scratch_c, d, qv[k0])
        cost0 = -lp - crp.log_join(nk[k0] - 1.0)
    _pruned_costs(k0, lognk, K, log_new, P, e0, qv, ub, costs, cost0, x)


@njit(cache=True, nogil=True, inline="always")
def _best_opened(x, ns, nc, nn, M, K, best, best_cost, spec, prior):
    """The least of (best, best_cost) and x's costs of the M clusters opened in this ``assign``
    (numbered from K)."""
    for j in range(M):
        cost = -product.log_predictive(x, ns[j], nc[j], spec, prior) - crp.log_join(nn[j])
        if cost < best_cost:
            best_cost = cost
            best = K + j
    return best, best_cost


@njit(cache=True, nogil=True)
def assign(X, order, z, stats, cache, nk, K, spec, prior, empty_c, log_alpha):
    """One Bayes K-means assignment step over the records in ``order``.

    Each record i goes to argmin of the costs in the module docstring over the K frozen clusters
    (its own cluster k0 = z[i] without it, the leave-one-out predictive), the clusters opened
    earlier in this call, and a new cluster. Ties keep the lowest index; a record alone in its
    cluster that would open a new one stays.

    Parameters
    ----------
    X : ndarray of shape (N, D)
    order : ndarray of shape (M,), int64
        Records to visit, in visiting order.
    z : ndarray of shape (N,), int64
        Cluster of each record, 0..K-1 or -1 for none; updated in place, new clusters are
        numbered K, K + 1, ... in the order they were opened.
    stats, cache, nk : ndarrays of K rows
        The frozen clusters (never modified).
    K : int
    spec, prior, empty_c, log_alpha : as ``kernels.mapdp.gibbs_sweep``.

    Returns
    -------
    new_stats : ndarray of shape (M_new, S)
        Statistics of the clusters opened here.
    n_changed : int
        Records whose cluster changed.
    """
    S = stats.shape[1]
    C = cache.shape[1]
    empty_s = np.zeros(S)
    scratch_s = np.empty(S)
    scratch_c = np.empty(C)
    lognk = np.empty(K)
    for k in range(K):
        lognk[k] = crp.log_join(nk[k]) if nk[k] > 0.0 else -np.inf
    ns = np.zeros((4, S))
    nc = np.zeros((4, C))
    nn = np.zeros(4)
    M = 0
    n_changed = 0
    d = X.shape[1]
    # Normal-Wishart records without recording cells: the frozen clusters packed with the empty
    # one in column K, a block of records' quadratic forms at once, a logarithm only where a
    # cost can be the least, and the leave-one-out predictive of k0 in closed form
    # (``kernels.mapdp._scan``'s hot path; the clusters never change here, so every block is
    # computed once)
    hot = spec.shape[0] == 1 and spec[0, 0] == product.GAUSSIAN_NW
    hot = hot and not gaussian_nw.has_cells(prior, d)
    nb = _BLOCK if hot else 0
    P = np.empty((d * (d + 1) // 2 + d + 3, K + 1 if hot else 0))
    if hot:
        gaussian_nw.pack_columns(P, cache, K, empty_c, d)
    e0 = d * (d + 1) // 2 + d
    XT, Q, bacc = aligned_matrix(d, nb), aligned_matrix(K + 1, nb), aligned_matrix(1, nb)[0]
    qv = np.empty(K + 1)
    costs = np.empty(K + 1)
    ub = np.empty(K + 1)
    loo = np.empty((K, 4))
    loo_ok = np.zeros(K, dtype=np.bool_)
    log_new = crp.log_new(log_alpha)
    N = order.shape[0]
    for t in range(N):
        if t + _AHEAD < N:
            # the rows and labels of a block ahead, visited in random order
            prefetch(X, order[t + _AHEAD])
            prefetch(z, order[t + _AHEAD])
        i = order[t]
        x = X[i]
        k0 = z[i]
        best = -1
        best_cost = np.inf
        if hot:
            _packed_costs(
                t, X, order, XT, P, Q, bacc, qv, x, k0, stats, cache, nk, lognk, spec, prior, loo,
                loo_ok, scratch_s, scratch_c, log_new, e0, ub, costs,
            )  # fmt: skip
            for k in range(K):
                if costs[k] < best_cost:
                    best_cost = costs[k]
                    best = k
        for k in range(0 if not hot else K, K):
            cost = _frozen_cost(
                x, k, k0, stats, cache, nk, lognk, spec, prior, scratch_s, scratch_c
            )
            if cost < best_cost:
                best_cost = cost
                best = k
        best, best_cost = _best_opened(x, ns, nc, nn, M, K, best, best_cost, spec, prior)
        if hot:
            cost_new = costs[K]
        else:
            cost_new = -product.log_predictive(x, empty_s, empty_c, spec, prior) - log_new
        if cost_new < best_cost or best < 0:
            if k0 >= 0 and nk[k0] <= 1.0:
                # alone in its cluster, which would be opened anew: stay
                best = k0
            else:
                if M == ns.shape[0]:
                    ns, nc, nn = _grow(ns, nc, nn)
                copy_vector(nc[M], empty_c)
                best = K + M
                M += 1
        if best >= K:
            product.update(x, ns[best - K], nc[best - K], spec, prior, 1.0)
            nn[best - K] += 1.0
        if best != k0:
            z[i] = best
            n_changed += 1
    return ns[:M].copy(), n_changed


@njit(cache=True, nogil=True)
def label_deltas(X, order, z_old, z_new, K, M, spec, S):
    """What a chunk's relabelling does to the cluster statistics.

    For the records in ``order`` whose label changed from z_old (0..K-1 or -1) to z_new (0..K-1,
    or K..K+M-1 for clusters opened in the chunk), returns ``delta`` (K, S), to be added to the K
    existing clusters' statistics, and ``new_stats`` (M, S), the statistics of the new clusters.
    Computed from the records, so rounding does not accumulate along a sweep. The records are
    read in row order, not in the sweep's random order: 4x faster on 100,000 x 10 records
    where every one moved (a first pass), as the rows stream from memory.
    """
    delta = np.zeros((K, S))
    new_stats = np.zeros((M, S))
    visit = np.zeros(X.shape[0], dtype=np.bool_)
    for t in range(order.shape[0]):
        visit[order[t]] = True
    for i in range(X.shape[0]):
        if not visit[i]:
            continue
        a = z_old[i]
        b = z_new[i]
        if a == b:
            continue
        x = X[i]
        if a >= 0:
            product.add_stats(x, delta[a], spec, -1.0)
        if b >= K:
            product.add_stats(x, new_stats[b - K], spec, 1.0)
        elif b >= 0:
            product.add_stats(x, delta[b], spec, 1.0)
    return delta, new_stats


@njit(cache=True, nogil=True)
def _best_cluster(i, c0, stats, lm_i, cl, cl_lm, cnt, K, spec, prior, log_alpha, scratch):
    """Best cluster for leaf i (not in any cluster's statistics now): -1 means a new one.

    Joining c rather than opening a new cluster changes log p(X, z) by the merge gap of c and i,
    so the best cluster has the largest positive gap. ``c0`` (the leaf's previous cluster, if
    still non-empty) is evaluated first and kept on ties, and at a gap of exactly 0.
    """
    best = -1
    best_gap = 0.0
    for q in range(K + 1):
        c = c0 if q == 0 else q - 1
        if c < 0 or cnt[c] == 0 or (q > 0 and c == c0):
            continue
        g, _ = merge_gap_cached(cl[c], stats[i], cl_lm[c], lm_i, scratch, spec, prior, log_alpha)
        if g > best_gap or (q == 0 and g >= best_gap):
            best_gap = g
            best = c
    return best


@njit(cache=True, nogil=True)
def bayes_kmeans(stats, spec, prior, log_alpha, order, k_init, max_sweeps=0):
    """Bayes K-means (Xu et al. 2009, Section 5) over leaf summaries.

    The first ``k_init`` leaves of ``order`` open one cluster each; every further leaf i (in
    ``order``) joins the cluster c, or a new cluster, that gives the highest marginal likelihood
    of the resulting configuration (eq. 5's summand): the cluster with the largest positive merge
    gap with i (``kernels.partition.merge_gap``), else a new one. Optionally (``max_sweeps`` > 0;
    the paper describes the single pass) leaves are then reassigned by the same rule, K-means
    style, until none moves. Finally clusters are merged greedily while a merge increases the
    marginal likelihood (``kernels.partition.greedy_merge``). Cost O(M K) log marginals per pass,
    O(K^2) for the merges.

    Parameters
    ----------
    stats : ndarray of shape (M, S)
        Leaf statistics rows, ``stats[:, 0] > 0``.
    spec, prior : product family description (``kernels.obs.product``).
    log_alpha : float
    order : ndarray of shape (M,), int64
        A permutation of the leaves (random in the paper).
    k_init : int
        Clusters opened from the first leaves of ``order`` (sqrt(M) in the paper).
    max_sweeps : int
        Reassignment sweeps after the first pass (stops early when no leaf moves).

    Returns
    -------
    z : ndarray of shape (M,), int64
        Cluster of each leaf, 0..K-1 in order of first appearance over the leaves.
    cluster_stats : ndarray of shape (K, S)
    """
    M, S = stats.shape
    cap = max(8, 2 * k_init)
    cl = np.zeros((cap, S))
    cl_lm = np.zeros(cap)
    cnt = np.zeros(cap, dtype=np.int64)
    z = np.full(M, -1, dtype=np.int64)
    leaf_lm = product.log_marginals(stats, spec, prior)
    K = 0
    scratch = np.empty(S)
    for sweep in range(max_sweeps + 1):
        if sweep > 0:
            # rebuild the sums from the assignment, so that removals leave no rounding behind
            cl[:K] = 0.0
            for i in range(M):
                for t in range(S):
                    cl[z[i], t] += stats[i, t]
            for c in range(K):
                if cnt[c] > 0:
                    cl_lm[c] = product.log_marginal(cl[c], spec, prior)
        moved = 0
        for t in range(M):
            i = order[t]
            c0 = z[i]
            if c0 >= 0:
                cnt[c0] -= 1
                if cnt[c0] == 0:
                    cl[c0] = 0.0
                    cl_lm[c0] = 0.0
                else:
                    for q in range(S):
                        cl[c0, q] -= stats[i, q]
                    cl_lm[c0] = product.log_marginal(cl[c0], spec, prior)
            if sweep == 0 and t < k_init:
                best = -1
            else:
                best = _best_cluster(
                    i, c0, stats, leaf_lm[i], cl, cl_lm, cnt, K, spec, prior, log_alpha, scratch
                )
            if best < 0:
                if c0 >= 0 and cnt[c0] == 0:
                    best = c0
                else:
                    best = _free_slot(cnt, K)
                    if best < 0:
                        if K == cl.shape[0]:
                            cl = np.concatenate((cl, np.zeros_like(cl)))
                            cl_lm = np.concatenate((cl_lm, np.zeros_like(cl_lm)))
                            cnt = np.concatenate((cnt, np.zeros_like(cnt)))
                        best = K
                        K += 1
            for q in range(S):
                cl[best, q] += stats[i, q]
            cnt[best] += 1
            cl_lm[best] = product.log_marginal(cl[best], spec, prior)
            if best != c0:
                moved += 1
            z[i] = best
        if sweep > 0 and moved == 0:
            break
    return _merged(z, cl, cnt, K, spec, prior, log_alpha)


@njit(cache=True, nogil=True, inline="always")
def _merged(z, cl, cnt, K, spec, prior, log_alpha):
    """``bayes_kmeans``'s end: its K slots without the empty ones, merged greedily, numbered in
    order of first appearance over the leaves (z relabelled in place); returns (z, their
    statistics)."""
    M = z.shape[0]
    S = cl.shape[1]
    slot = np.full(K, -1, dtype=np.int64)
    K2 = 0
    for c in range(K):
        if cnt[c] > 0:
            slot[c] = K2
            K2 += 1
    live = np.zeros((K2, S))
    for c in range(K):
        if slot[c] >= 0:
            copy_vector(live[slot[c]], cl[c])
    target, merged, _ = greedy_merge(live, live[:, 0].copy(), spec, prior, log_alpha)
    for i in range(M):
        z[i] = target[slot[z[i]]]
    # number the clusters in order of first appearance over the leaves
    first = np.full(merged.shape[0], -1, dtype=np.int64)
    for i in range(M):
        if first[z[i]] < 0:
            first[z[i]] = i
    n_out = canonical_labels(z, z)
    out_stats = np.empty((n_out, S))
    for c in range(merged.shape[0]):
        copy_vector(out_stats[z[first[c]]], merged[c])
    return z, out_stats
