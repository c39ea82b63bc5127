"""MAP-DP (seed 000, Algorithm 1), the collapsed Gibbs sampler it derives from (seed 000 eq. 2.7,
Neal's Algorithm 3, seed 003 Algorithm 3) and out-of-sample prediction (eqs. 3.4-3.5).

Clusters live in *slots*: rows of ``stats`` (K_cap, S), ``cache`` (K_cap, C) and ``nk`` (K_cap,).
A slot with ``nk == 0`` is free. ``z[i] == -1`` means record i is in no cluster yet, so the same
sweep serves Algorithm 1's one-cluster start, a sequential first pass, and a Dask chunk whose
records arrive in a copy of the global statistics.
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import crp
from kernels.arrays import copy_rows, copy_vector
from kernels.obs import gaussian_nw, product
from kernels.rng import sample_log_weights


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk, lognk):
    cap = stats.shape[0]
    new_cap = max(2 * cap, 8)
    s2 = np.zeros((new_cap, stats.shape[1]))
    c2 = np.zeros((new_cap, cache.shape[1]))
    n2 = np.zeros(new_cap)
    l2 = np.full(new_cap, -np.inf)
    copy_rows(s2, stats)
    copy_rows(c2, cache)
    copy_vector(n2, nk)
    copy_vector(l2, lognk)
    return s2, c2, n2, l2


@njit(cache=True, nogil=True)
def pack_slots(P, cache, nk, n_slots, k0, knew, grew, empty_c, d):
    """The packed predictives (``gaussian_nw.pack_column``) of the slots 0..n_slots-1 of
    ``cache`` and of the empty cache (column n_slots), for records of d columns.

    P with fewer columns than ``cache`` has rows, plus one (a new scan's (0, 0)): all of them in
    a new P. Otherwise P after a record's move from slot k0 (-1: none) to slot knew: those
    columns and, if the move opened a new slot (``grew``), the empty cache's. Callers pass
    k0, knew and grew as variables, never as constants: a constant argument is a type of its
    own to numba, and would compile this once more.
    """
    if P.shape[1] < cache.shape[0] + 1:
        P = np.empty((d * (d + 1) // 2 + d + 3, cache.shape[0] + 1))
        for k in range(n_slots):
            gaussian_nw.pack_column(P, k, cache[k], d)
        gaussian_nw.pack_column(P, n_slots, empty_c, d)
        return P
    if k0 >= 0 and nk[k0] > 0.0:
        gaussian_nw.pack_column(P, k0, cache[k0], d)
    gaussian_nw.pack_column(P, knew, cache[knew], d)
    if grew:
        gaussian_nw.pack_column(P, n_slots, empty_c, d)
    return P


@njit(cache=True, nogil=True, inline="always")
def _costs(
    x,
    k0,
    stats,
    cache,
    lognk,
    n_slots,
    spec,
    prior,
    empty_s,
    empty_c,
    log_alpha,
    scratch_s,
    scratch_c,
    costs,
    lp,
    P,
    acc,
    qv,
):
    """Fill costs[k] = q_{i,k} - log N_{k,-i} (eqs. 3.1-3.2, argument of Algorithm 1's argmin).

    The prior's terms are the CRP's (``kernels.alloc.crp``): log N_{k,-i} its ``log_join`` and
    log N0 its ``log_new``; the cached ``lognk`` rows hold ``log_join(nk)``.

    costs[k] for slots k < n_slots (inf for a free slot, or for k0 when x is its only member),
    costs[n_slots] for a new cluster, with N_{K+1,-i} = N0 = exp(log_alpha). The record's own
    cluster k0 is scored without x by the leave-one-out predictive, so nothing is downdated
    unless the record moves. lp[k] receives log p(x | X_k) for the other non-empty slots and
    lp[n_slots] the prior predictive log p(x): the terms of eq. 3.4.

    One full-covariance group (P not empty): the predictives come from P, the packed copy of
    the slots' caches with the empty cache in column n_slots
    (``gaussian_nw.packed_log_predictives``), as ``predict`` computes them; lp[k0] then holds
    p(x | X_k0) with x among X_k0.
    """
    log_new = crp.log_new(log_alpha)
    hot = P.shape[0] > 0
    if hot:
        gaussian_nw.packed_log_predictives(x, P, n_slots + 1, acc, qv, lp)
        for k in range(n_slots):
            if k != k0:
                costs[k] = -lp[k] - lognk[k] if lognk[k] != -np.inf else np.inf
    for k in range(n_slots):
        if k == k0:
            n_minus = math.exp(lognk[k]) - 1.0
            if n_minus > 0.5:
                costs[k] = -product.log_predictive_loo(
                    x, stats[k], cache[k], spec, prior, scratch_s, scratch_c
                ) - crp.log_join(n_minus)
            else:
                costs[k] = np.inf
        elif lognk[k] == -np.inf:
            costs[k] = np.inf
        elif not hot:
            lpk = product.log_predictive(x, stats[k], cache[k], spec, prior)
            lp[k] = lpk
            costs[k] = -lpk - lognk[k]
    if not hot:
        lp[n_slots] = product.log_predictive(x, empty_s, empty_c, spec, prior)
    costs[n_slots] = -lp[n_slots] - log_new


@njit(cache=True, nogil=True)
def log_norm_of(nk, alpha):
    """log(N0 + N), the normaliser of eq. 3.4's weights, with N the sum of the sizes nk."""
    n_train = 0.0
    for k in range(nk.shape[0]):
        n_train += nk[k]
    return math.log(alpha + n_train)


@njit(cache=True, nogil=True)
def _log_mixture(lp, lognk, K, log_norm, log_alpha, terms):
    """Eqs. 3.4-3.5 from the terms lp[k] = log p(x | X_k) (k < K) and lp[K] = log p(x):
    returns (the index of the largest term, K for a new cluster; the log mixture density
    log sum_k N_k / (N0 + N) p(x | X_k) + N0 / (N0 + N) p(x)). Free slots (lognk -inf) count
    for nothing."""
    for k in range(K):
        terms[k] = (lognk[k] - log_norm) + lp[k] if lognk[k] != -np.inf else -np.inf
    terms[K] = (log_alpha - log_norm) + lp[K]
    best = 0
    for k in range(1, K + 1):
        if terms[k] > terms[best]:
            best = k
    m = terms[best]
    acc = 0.0
    for k in range(K + 1):
        # exp(-40) is below half an ulp of the sum (>= 1): such terms cannot change it
        # (written so that a NaN still propagates)
        e = terms[k] - m
        if not e <= -40.0:
            acc += math.exp(e)
    return best, m + math.log(acc)


@njit(cache=True, nogil=True, inline="always")
def _move(x, i, k0, knew, z, stats, cache, nk, lognk, n_slots, spec, prior, empty_c):
    """Commit record i's move from slot k0 (-1: none) to slot knew (n_slots: a new cluster)."""
    if k0 >= 0:
        product.update(x, stats[k0], cache[k0], spec, prior, -1.0)
        nk[k0] -= 1.0
        lognk[k0] = crp.log_join(nk[k0]) if nk[k0] > 0.0 else -np.inf
    if knew == n_slots:
        # reuse the lowest free slot; grow only when none is free
        free = -1
        for k in range(n_slots):
            if nk[k] == 0.0:
                free = k
                break
        if free < 0:
            if n_slots == stats.shape[0]:
                stats, cache, nk, lognk = _grow(stats, cache, nk, lognk)
            free = n_slots
            n_slots += 1
        stats[free, :] = 0.0
        copy_vector(cache[free], empty_c)
        knew = free
    product.update(x, stats[knew], cache[knew], spec, prior, 1.0)
    nk[knew] += 1.0
    lognk[knew] = crp.log_join(nk[knew])
    z[i] = knew
    return stats, cache, nk, lognk, n_slots


@njit(cache=True, nogil=True, inline="always")
def _scan(
    X,
    order,
    z,
    stats,
    cache,
    nk,
    n_slots,
    spec,
    prior,
    empty_c,
    log_alpha,
    gibbs,
    state,
    logdens,
    log_norm,
):
    """The loop shared by ``sweep`` (argmin) and ``gibbs_sweep`` (a draw).

    With logdens of shape (N,), each record visited before the first move also gets its log
    mixture density (eq. 3.4) under the statistics of that moment, which until then are the
    ones the scan started from (log_norm: their ``log_norm_of``); logdens.shape[0] == 0 turns
    this off.
    """
    S = stats.shape[1]
    empty_s = np.zeros(S)
    scratch_s = np.empty(S)
    scratch_c = np.empty(cache.shape[1])
    lognk = np.full(stats.shape[0], -np.inf)
    for k in range(n_slots):
        if nk[k] > 0.0:
            lognk[k] = crp.log_join(nk[k])
    costs = np.empty(stats.shape[0] + order.shape[0] + 1)
    lp = np.empty(costs.shape[0])
    terms = np.empty(costs.shape[0])
    acc = np.empty(costs.shape[0])
    qv = np.empty(costs.shape[0])
    # one full-covariance group: the slots' predictives packed (``_costs``), kept in step with
    # every move
    hot = spec.shape[0] == 1 and spec[0, 0] == product.GAUSSIAN_NW
    P = np.empty((0, 0))
    none = np.int64(-1)
    if hot:
        P = pack_slots(P, cache, nk, n_slots, none, none, none > 0, empty_c, X.shape[1])
    scoring = logdens.shape[0] > 0
    n_changed = 0
    for t in range(order.shape[0]):
        i = order[t]
        x = X[i]
        k0 = z[i]
        _costs(
            x,
            k0,
            stats,
            cache,
            lognk,
            n_slots,
            spec,
            prior,
            empty_s,
            empty_c,
            log_alpha,
            scratch_s,
            scratch_c,
            costs,
            lp,
            P,
            acc,
            qv,
        )
        if gibbs:
            for k in range(n_slots + 1):
                costs[k] = -costs[k]
            best = sample_log_weights(state, costs, n_slots + 1)
        else:
            best = 0
            for k in range(1, n_slots + 1):
                if costs[k] < costs[best]:
                    best = k
        alone = k0 >= 0 and nk[k0] == 1.0
        if best == k0 or (best == n_slots and alone):
            if scoring and n_changed == 0:
                # x stays in k0: eq. 3.4 wants p(x | X_k0) with x among X_k0 (packed: in lp)
                if not hot:
                    lp[k0] = product.log_predictive(x, stats[k0], cache[k0], spec, prior)
                logdens[i] = _log_mixture(lp, lognk, n_slots, log_norm, log_alpha, terms)[1]
            continue
        before = n_slots
        stats, cache, nk, lognk, n_slots = _move(
            x, i, k0, best, z, stats, cache, nk, lognk, n_slots, spec, prior, empty_c
        )
        n_changed += 1
        if hot:
            P = pack_slots(P, cache, nk, n_slots, k0, z[i], n_slots > before, empty_c, X.shape[1])
    return stats, cache, nk, n_slots, n_changed


@njit(cache=True, nogil=True)
def sweep(X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, alpha, logdens):
    """One MAP-DP iteration over the records in ``order`` (seed 000, Algorithm 1, inner loop).

    Each record is taken out of its cluster and assigned to
    argmin_k [q_{i,k} - log N_{k,-i}] over the existing clusters and a new one (eqs. 3.1-3.2);
    statistics and caches are updated incrementally, so a sweep costs O(N K d^2) for the
    Normal-Wishart family. Ties keep the lowest slot; a record alone in its cluster that would
    open a new one stays where it is.

    It also scores the records it leaves in place: while no record has moved, each visited
    record i gets logdens[i] = log of its mixture predictive density, eq. 3.4, under the
    statistics the sweep started from, computed exactly as ``predict`` computes it for those
    statistics (same terms, same order). If the sweep returns n_changed == 0, logdens holds the
    eq. 3.4 density of every visited record under statistics the sweep left unchanged, so a
    confirming pass doubles as the write-out. One kernel for both uses: numba compiles each
    entry point with its whole call tree, so a second entry would compile ``_scan`` again.

    Parameters
    ----------
    X : ndarray of shape (N, D), float64
    order : ndarray of shape (M,), int64
        Indices of the records to visit, in visiting order.
    z : ndarray of shape (N,), int64
        Slot of each record, -1 if in none; updated in place.
    stats : ndarray of shape (K_cap, S)
    cache : ndarray of shape (K_cap, C)
    nk : ndarray of shape (K_cap,)
        Cluster sizes; 0 marks a free slot.
    n_slots : int
        Slots in use are 0 .. n_slots - 1.
    spec, prior : product family description (``kernels.obs.product``).
    empty_c : ndarray of shape (C,)
        Cache of the empty statistics (the prior predictive).
    alpha : float
        N0, the DP concentration; 0 never opens a new cluster (log N0 = -inf).
    logdens : ndarray of shape (N,) or (0,), float64
        Filled in place for the records visited before the first move; others untouched.
        Shape (0,): no scores.

    Returns
    -------
    stats, cache, nk : ndarrays
        Possibly reallocated when more slots were needed.
    n_slots : int
    n_changed : int
        Number of records whose cluster changed.
    """
    state = np.zeros(1, dtype=np.uint64)
    log_norm = log_norm_of(nk[:n_slots], alpha) if logdens.shape[0] > 0 else 0.0
    return _scan(
        X,
        order,
        z,
        stats,
        cache,
        nk,
        n_slots,
        spec,
        prior,
        empty_c,
        math.log(alpha),
        False,
        state,
        logdens,
        log_norm,
    )


@njit(cache=True, nogil=True)
def gibbs_sweep(X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, log_alpha, state):
    """One collapsed Gibbs scan (seed 000 eq. 2.7; Neal's Algorithm 3; seed 003 Algorithm 3):
    z_i is drawn with p(z_i = k | x_i, z_-i) proportional to N_{k,-i} p(x_i | X_{k,-i}), or
    N0 p(x_i) for a new cluster. Same arguments and returns as ``sweep``, with ``log_alpha``
    (log N0) for alpha and ``state`` (uint64 array of shape (1,), the RNG state, advanced in
    place) for logdens.
    """
    no_scores = np.empty(0)
    return _scan(
        X,
        order,
        z,
        stats,
        cache,
        nk,
        n_slots,
        spec,
        prior,
        empty_c,
        log_alpha,
        True,
        state,
        no_scores,
        0.0,
    )


@njit(cache=True, nogil=True)
def objective(stats, nk, n_slots, spec, prior, alpha):
    """E = -log p(X, z | N0), eq. 3.3, from the statistics alone: -sum_k log p(X_k)
    - log p(z_1..z_N) (eq. 2.3, ``kernels.alloc.crp.log_eppf``). Algorithm 1's E_new is this up
    to the constant log Gamma(N + N0) - log Gamma(N0), kept here so that learned concentrations
    compare."""
    out = 0.0
    for k in range(n_slots):
        if nk[k] > 0.0:
            out -= product.log_marginal(stats[k], spec, prior)
    return out - crp.log_eppf(nk, n_slots, alpha)


@njit(cache=True, nogil=True)
def compact(z, stats, cache, nk, n_slots):
    """Drop empty slots: clusters renumbered 0..K-1 in slot order; z relabelled in place.

    Returns
    -------
    stats, cache, nk : ndarrays of K rows
    """
    remap = np.full(max(n_slots, 1), -1, dtype=np.int64)
    K = 0
    for k in range(n_slots):
        if nk[k] > 0.0:
            remap[k] = K
            K += 1
    s2 = np.empty((K, stats.shape[1]))
    c2 = np.empty((K, cache.shape[1]))
    n2 = np.empty(K)
    for k in range(n_slots):
        j = remap[k]
        if j >= 0:
            copy_vector(s2[j], stats[k])
            copy_vector(c2[j], cache[k])
            n2[j] = nk[k]
    for i in range(z.shape[0]):
        if z[i] >= 0:
            z[i] = remap[z[i]]
    return s2, c2, n2


@njit(cache=True, nogil=True)
def predict(X, stats, cache, nk, spec, prior, empty_c, alpha):
    """Out-of-sample prediction (seed 000, Section 3.2) for each row of X (N, D).

    Returns
    -------
    labels : ndarray of shape (N,), int64
        MAP assignment of eq. 3.5 over the K clusters and a new one; -1 for a new cluster.
    log_density : ndarray of shape (N,)
        log of the mixture predictive density of eq. 3.4, with weights N_k / (N0 + N) and
        N0 / (N0 + N).
    """
    K = stats.shape[0]
    log_norm = log_norm_of(nk, alpha)
    log_alpha = math.log(alpha)
    lognk = np.empty(K)
    for k in range(K):
        lognk[k] = crp.log_join(nk[k]) if nk[k] > 0.0 else -np.inf
    empty_s = np.zeros(stats.shape[1])
    N = X.shape[0]
    labels = np.empty(N, dtype=np.int64)
    logdens = np.empty(N)
    lp = np.empty(K + 1)
    terms = np.empty(K + 1)
    hot = spec.shape[0] == 1 and spec[0, 0] == product.GAUSSIAN_NW
    # as the sweep computes them (``_costs``): packed, the empty cache in column K
    P = np.empty((0, 0))
    none = np.int64(-1)
    if hot:
        P = pack_slots(P, cache, nk, K, none, none, none > 0, empty_c, X.shape[1])
    acc = np.empty(K + 1)
    qv = np.empty(K + 1)
    for i in range(N):
        x = X[i]
        if hot:
            gaussian_nw.packed_log_predictives(x, P, K + 1, acc, qv, lp)
        else:
            for k in range(K):
                if lognk[k] != -np.inf:
                    lp[k] = product.log_predictive(x, stats[k], cache[k], spec, prior)
            lp[K] = product.log_predictive(x, empty_s, empty_c, spec, prior)
        best, logdens[i] = _log_mixture(lp, lognk, K, log_norm, log_alpha, terms)
        labels[i] = best if best < K else -1
    return labels, logdens
