"""Bayes K-means (Xu et al. 2009, Section 5) over leaf summaries (``bayes_kmeans``) and as the
distributed passes' assignment step (``assign``, with ``label_deltas``).

Every record goes to the cluster, or a new one, that maximises the DPM's log p(X, z): it
minimises -log p(x_i | X_{k,-i}) - log N_{k,-i}, or -log p(x_i) - log N0 for a new cluster
(MAP-DP's cost, Raykov et al. 2016, eqs. 3.1-3.2); a leaf of several records joins the cluster
of the largest positive merge gap (``kernels.partition``). Like K-means, ``assign`` keeps the
clusters' statistics frozen (a Lloyd step; the caller adds ``label_deltas``, then merges
greedily); clusters opened in a chunk update as records join. Clusters are rows of ``stats``
(K, S), ``cache`` (K, C) and ``nk`` (K,) as in ``kernels.mapdp``.
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import crp
from kernels.arrays import aligned_matrix, copy_vector, prefetch
from kernels.mapdp import _AHEAD, _free_slot, _grow, _pruned_costs_from, load_block
from kernels.obs import gaussian_nw, product
from kernels.partition import canonical_labels, greedy_merge, merge_gap_cached

_BLOCK = 64


@njit(cache=True, nogil=True)
def _loo(x, k0, stats, cache, spec, prior, loo, loo_ok, scratch_s, scratch_c, d, r):
    """log p(x | X_k0 without x) from k0's cached terms and x's quadratic form r
    (``kernels.mapdp._loo_cost``), the downdated copy where rounding needs it."""
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
    """x's cost of frozen cluster k (k0 without x); inf when empty or x is alone in k0."""
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
    """``assign``'s costs of the t-th record x (in k0) under the packed P
    (``kernels.mapdp._pruned_costs_from``), its block's quadratic forms at the block's start."""
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
    gaussian_nw.packed_log_predictive_bounds(qv, P, K + 1, e0, ub)
    _pruned_costs_from(k0, lognk, K, log_new, P, e0, qv, ub, ub, costs, cost0, x, d, d)


@njit(cache=True, nogil=True, inline="always")
def _best_opened(x, ns, nc, nn, M, K, best, best_cost, spec, prior):
    """The least of (best, best_cost) and x's costs of the M clusters opened from K on."""
    for j in range(M):
        cost = -product.log_predictive(x, ns[j], nc[j], spec, prior) - crp.log_join(nn[j])
        if cost < best_cost:
            best_cost = cost
            best = K + j
    return best, best_cost


@njit(cache=True, nogil=True)
def assign(X, order, z, stats, cache, nk, K, spec, prior, empty_c, log_alpha):
    """One Bayes K-means assignment step over the records in ``order`` (M,): each to the least
    cost over the K frozen clusters (its own by the leave-one-out predictive), those opened in
    this call and a new one; ties to the lowest, a record alone stays.

    Parameters
    ----------
    X : ndarray of shape (N, D)
    order : ndarray of shape (M,), int64
    z : ndarray of shape (N,), int64
        Each record's cluster (-1: none), updated; new clusters K, K + 1, ... in opening order.
    stats, cache, nk : the K frozen clusters' rows
    K : int
    spec, prior, empty_c, log_alpha : as ``kernels.mapdp.gibbs_sweep``

    Returns
    -------
    new_stats : ndarray of shape (M_new, S)
    n_changed : int
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
    # Normal-Wishart without cells: ``kernels.mapdp._scan``'s packed path, every block once
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
                    # MAP-DP's slot arrays doubled (its fourth array, log sizes, not needed)
                    ns, nc, nn, _ = _grow(ns, nc, nn, nn)
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
    """A chunk's relabelling of the records in ``order`` from z_old to z_new (K.. for clusters
    opened in it) as ``delta`` (K, S), to add to the K clusters, and ``new_stats`` (M, S); from
    the records, read in row order (4x faster than the sweep's order)."""
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
    """Leaf i's cluster of the largest positive merge gap, -1 for a new one; c0 (its previous,
    if not empty) kept on ties and at a gap of 0."""
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
    """Bayes K-means (Xu et al. 2009, Section 5) over leaf summaries: the first ``k_init``
    leaves of ``order`` (a permutation (M,) int64) open a cluster each, every further leaf joins
    the cluster of its largest positive merge gap or a new one (eq. 5's summand); then up to
    ``max_sweeps`` reassignment sweeps and greedy merges. O(M K) log marginals a pass.

    Parameters
    ----------
    stats : ndarray of shape (M, S)
    spec, prior, log_alpha : the product family and log N0
    order : ndarray of shape (M,), int64
    k_init, max_sweeps : int

    Returns
    -------
    z : ndarray of shape (M,), int64
        Each leaf's cluster, numbered by first leaf.
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
    """``bayes_kmeans``' K slots without the empty ones, merged greedily and numbered by first
    leaf (z relabelled); returns (z, their statistics)."""
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
