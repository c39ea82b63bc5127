"""Bayes K-means (seed 001, Section 5) as a per-chunk kernel, and the chunk bookkeeping of the
distributed passes (statistic deltas, merge costs).

Bayes K-means is K-means with the DPM's marginal likelihood as the criterion: every record goes to
the cluster, or a new one, that maximises the joint log p(X, z) of the DPM, i.e. it minimises

    - log p(x_i | X_{k,-i}) - log N_{k,-i}      (an existing cluster k)
    - log p(x_i) - log N0                       (a new cluster)

which is the MAP-DP cost (seed 000, eqs. 3.1-3.2). What makes it *K-means-like* is that the
existing clusters' statistics are frozen during an assignment step (a Lloyd step): they are
recomputed from the new assignment afterwards, by the caller adding the deltas
(``label_deltas``), and clusters are then merged greedily while the marginal likelihood grows
(``merge_costs``). Records that open new clusters in a chunk update those clusters incrementally,
so the records of a cluster missing from the frozen set gather in one new cluster.

Clusters are rows of ``stats`` (K, S), ``cache`` (K, C) and ``nk`` (K,) as in ``kernels.mapdp``.
"""

import math

import numpy as np
from numba import njit

from kernels.families import product


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk):
    cap = stats.shape[0]
    new_cap = max(2 * cap, 4)
    s2 = np.zeros((new_cap, stats.shape[1]))
    c2 = np.zeros((new_cap, cache.shape[1]))
    n2 = np.zeros(new_cap)
    s2[:cap] = stats
    c2[:cap] = cache
    n2[:cap] = nk
    return s2, c2, n2


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
    spec, prior, empty_c, log_alpha : as ``kernels.mapdp.sweep``.

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
        lognk[k] = math.log(nk[k]) if nk[k] > 0.0 else -np.inf
    ns = np.zeros((4, S))
    nc = np.zeros((4, C))
    nn = np.zeros(4)
    M = 0
    n_changed = 0
    for t in range(order.shape[0]):
        i = order[t]
        x = X[i]
        k0 = z[i]
        best = -1
        best_cost = np.inf
        for k in range(K):
            if k == k0:
                if nk[k] <= 1.0:
                    continue
                scratch_s[:] = stats[k]
                scratch_c[:] = cache[k]
                product.update(x, scratch_s, scratch_c, spec, prior, -1.0)
                cost = -product.log_predictive(x, scratch_s, scratch_c, spec, prior) - math.log(
                    nk[k] - 1.0
                )
            elif lognk[k] == -np.inf:
                continue
            else:
                cost = -product.log_predictive(x, stats[k], cache[k], spec, prior) - lognk[k]
            if cost < best_cost:
                best_cost = cost
                best = k
        for j in range(M):
            cost = -product.log_predictive(x, ns[j], nc[j], spec, prior) - math.log(nn[j])
            if cost < best_cost:
                best_cost = cost
                best = K + j
        cost_new = -product.log_predictive(x, empty_s, empty_c, spec, prior) - log_alpha
        if cost_new < best_cost or best < 0:
            if k0 >= 0 and nk[k0] <= 1.0:
                # alone in its cluster, which would be opened anew: stay
                best = k0
            else:
                if M == ns.shape[0]:
                    ns, nc, nn = _grow(ns, nc, nn)
                nc[M, :] = empty_c
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
    Computed from the records, so rounding does not accumulate along a sweep.
    """
    delta = np.zeros((K, S))
    new_stats = np.zeros((M, S))
    for t in range(order.shape[0]):
        i = order[t]
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
def log_marginals(stats, spec, prior):
    """log p(X_k) of each statistics row: ndarray of shape (K,)."""
    out = np.empty(stats.shape[0])
    for k in range(stats.shape[0]):
        out[k] = product.log_marginal(stats[k], spec, prior) if stats[k, 0] > 0.0 else 0.0
    return out


@njit(cache=True, nogil=True)
def merge_costs(stats, logm, alive, j, spec, prior, log_alpha):
    """Change of the objective -log p(X, z | N0) (seed 000, eq. 3.3) when cluster j merges into
    cluster k, for every k (inf where k == j or ``alive[k]`` is False):

        -[log p(X_j + X_k) - log p(X_j) - log p(X_k)]
        - [log Gamma(N_j + N_k) - log Gamma(N_j) - log Gamma(N_k) - log N0]

    Parameters
    ----------
    stats : ndarray of shape (K, S)
    logm : ndarray of shape (K,)
        log p(X_k) of each row (``log_marginals``).
    alive : ndarray of shape (K,), bool
    j : int
    """
    K = stats.shape[0]
    out = np.full(K, np.inf)
    s = np.empty(stats.shape[1])
    nj = stats[j, 0]
    for k in range(K):
        if k == j or not alive[k]:
            continue
        nk = stats[k, 0]
        s[:] = stats[j]
        s += stats[k]
        gain = product.log_marginal(s, spec, prior) - logm[j] - logm[k]
        crp = math.lgamma(nj + nk) - math.lgamma(nj) - math.lgamma(nk) - log_alpha
        out[k] = -gain - crp
    return out
