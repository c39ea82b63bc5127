"""ASUGS: adaptive sequential updating and greedy search (Tsiligkaridis and Forsythe 2015, Algorithm
1), SUGS with a fixed concentration (Tsiligkaridis and Forsythe 2015, Section 2; Wang and Dunson
2011) and ASUGS-PM's pruning and merging (Tsiligkaridis and Forsythe 2015, Section 6), over any
observation model of ``kernels.obs.product``.

Record i (1-based over the whole stream): (a) alpha_{i-1} = k_{i-1} / (lambda + log(i - 1)),
the mean of Section 2.1's Gamma approximation (SUGS keeps alpha); (b) gamma_i from eq. 1,
m_{i-1}(h) L_{i,h}(y_i) for a class, alpha_{i-1} L_{i,k+1}(y_i) for a new one: the arg max or a
draw; (c) class gamma_i's statistics and cache updated by the family's rank-one ``update`` (for
the Normal-Wishart eqs. 4-7 in Raykov et al. 2016, Appendix B's parameterisation).

Classes are rows 0..K-1 of ``stats``, ``cache``, ``nk`` (grown by doubling), each with a
lasting id (``ids``) and the record that opened it (``born``). A record's label is its class's
id; ``alias`` says what became of each id (``ALIVE``, ``PRUNED`` or the id it merged into),
resolved at the end (``row_of_ids``). ASUGS-PM's rounds (Section 6) run when ``pm_due``: every
``pm_interval`` records, half as often each time i doubles past 64 intervals; a round prunes
classes below ``prune_weight`` of the records since they opened (never the largest; their
statistics kept in ``pruned``), then merges greedily (``kernels.partition.greedy_merge``).
"""

import math

import numpy as np
from numba import njit

from kernels.arrays import borrowed, copy_vector
from kernels.mapdp import _grow as mapdp_grow
from kernels.obs import gaussian_nw, product
from kernels.partition import greedy_merge
from kernels.rng import sample_log_weights

ALIVE = -2
PRUNED = -1


@njit(cache=True, nogil=True)
def concentration(k, i, lam):
    """alpha_i = k_i / (lambda + log i) (Section 2.1) for k classes after i >= 1 records and the
    exponential prior's rate lam > 0."""
    return concentration_of_log(k, math.log(i), lam)


@njit(cache=True, nogil=True, inline="always")
def concentration_of_log(k, log_i, lam):
    """``concentration`` from log i."""
    return k / (lam + log_i)


@njit(cache=True, nogil=True)
def pm_due(i, pm_interval):
    """Whether a PM round runs after record i (module docstring; never for pm_interval <= 0)."""
    if pm_interval <= 0:
        return False
    step = pm_interval
    while i >= 64 * step:
        step *= 2
    return i % step == 0


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk, lognk, born, ids):
    """MAP-DP's class arrays grown (``kernels.mapdp._grow``) plus the stream's own two."""
    s2, c2, n2, l2 = mapdp_grow(stats, cache, nk, lognk)
    new_cap = s2.shape[0]
    b2 = np.zeros(new_cap)
    i2 = np.full(new_cap, -1, dtype=np.int64)
    copy_vector(b2, born)
    copy_vector(i2, ids)
    return s2, c2, n2, l2, b2, i2


@njit(cache=True, nogil=True)
def _grow_ids(alias):
    a2 = np.full(max(2 * alias.shape[0], 8), ALIVE, dtype=np.int64)
    copy_vector(a2, alias)
    return a2


@njit(cache=True, nogil=True)
def _remove_row(h, K, stats, cache, nk, lognk, born, ids):
    """Row K - 1 moves into row h (row h's cluster leaves); returns K - 1."""
    last = K - 1
    if h != last:
        copy_vector(stats[h], stats[last])
        copy_vector(cache[h], cache[last])
        nk[h] = nk[last]
        lognk[h] = lognk[last]
        born[h] = born[last]
        ids[h] = ids[last]
    return last


@njit(cache=True, nogil=True, inline="always")
def _fast_weights(x, P, K, lognk, log_alpha, d, acc, qv, logw, greedy, ub):
    """Step (b)'s log weights into logw[:K + 1] from the packed P; returns -1, or for
    ``greedy`` the arg max (lowest of ties), skipping the columns whose bound on the leading
    rows (``packed_log_predictive_bounds``; ub scratch) is 1e-9 (|best| + 1) below the best."""
    n = K + 1
    e0 = d * (d + 1) // 2 + d
    if not greedy:
        gaussian_nw.quad_forms(x, P, n, d, acc, qv)
        for h in range(n):
            logw[h] = (lognk[h] if h < K else log_alpha) + gaussian_nw.packed_log_predictive(
                P, h, qv[h], e0
            )
        return -1
    rows = gaussian_nw.leading_rows(d)
    gaussian_nw.leading_quad_forms(x, P, n, d, rows, acc, qv)
    gaussian_nw.packed_log_predictive_bounds(qv, P, n, e0, ub)
    # the prior terms without a branch (vectorised), then the arg max
    for h in range(K):
        ub[h] += lognk[h]
    ub[K] += log_alpha
    top = np.int64(0)  # not a literal: finish_quad_form would compile once more for it
    for h in range(1, n):
        if ub[h] > ub[top]:
            top = h
    q = gaussian_nw.finish_quad_form(x, P, top, d, rows, qv[top])
    best = (lognk[top] if top < K else log_alpha) + gaussian_nw.packed_log_predictive(P, top, q, e0)
    logw[top] = best
    arg = top
    thr = best - 1e-9 * (abs(best) + 1.0)
    for h in range(n):
        if h == top or ub[h] < thr:
            continue
        q = gaussian_nw.finish_quad_form(x, P, h, d, rows, qv[h])
        w = (lognk[h] if h < K else log_alpha) + gaussian_nw.packed_log_predictive(P, h, q, e0)
        logw[h] = w
        if w > best:
            best = w
            arg = h
            thr = best - 1e-9 * (abs(best) + 1.0)
        elif w == best and h < arg:
            arg = h
    return arg


@njit(cache=True, nogil=True)
def prune_merge(
    i, K, stats, cache, nk, lognk, born, ids, alias, pruned, spec, prior, log_alpha, prune_weight
):
    """One ASUGS-PM round after record i (Section 6) over the K classes, arrays updated:
    classes with nk[h] < prune_weight (i - born[h] + 1) pruned (not the largest; 0: none), then
    ``greedy_merge`` at log_alpha, a merged class keeping its lowest row's id and row and the
    earliest ``born``. Returns (K, n_pruned, n_merged)."""
    n_pruned = 0
    if prune_weight > 0.0 and K > 1:
        h = np.int64(0)  # not a literal: _remove_row would compile once more for it
        while h < K:
            largest = 0
            for j in range(1, K):
                if nk[j] > nk[largest]:
                    largest = j
            if h != largest and nk[h] < prune_weight * (i - born[h] + 1.0):
                for t in range(stats.shape[1]):
                    pruned[t] += stats[h, t]
                alias[ids[h]] = PRUNED
                K = _remove_row(h, K, stats, cache, nk, lognk, born, ids)
                n_pruned += 1
            else:
                h += 1
    if K < 2:
        return K, n_pruned, 0
    target, merged, n_merged = greedy_merge(
        np.ascontiguousarray(stats[:K]), nk[:K].copy(), spec, prior, log_alpha
    )
    if n_merged == 0:
        return K, n_pruned, 0
    K2 = merged.shape[0]
    # greedy_merge numbers the groups by their lowest rows
    first = np.full(K2, -1, dtype=np.int64)
    new_born = np.full(K2, np.inf)
    size = np.zeros(K2, dtype=np.int64)
    for k in range(K):
        g = target[k]
        if first[g] < 0:
            first[g] = k
        if born[k] < new_born[g]:
            new_born[g] = born[k]
        size[g] += 1
    new_ids = np.empty(K2, dtype=np.int64)
    for g in range(K2):
        new_ids[g] = ids[first[g]]
    for k in range(K):
        keep = new_ids[target[k]]
        if ids[k] != keep:
            alias[ids[k]] = keep
    for g in range(K2):
        if size[g] > 1:
            copy_vector(stats[g], merged[g])
            product.refresh(stats[g], cache[g], spec, prior)
        else:
            src = first[g]
            if src != g:
                copy_vector(stats[g], stats[src])
                copy_vector(cache[g], cache[src])
        nk[g] = merged[g, 0]
        lognk[g] = math.log(nk[g])
        born[g] = new_born[g]
        ids[g] = new_ids[g]
    return K2, n_pruned, n_merged


@njit(cache=True, nogil=True)
def stream(
    X, z, alpha_trace, logq, stats, cache, nk, born, ids, K, alias, n_ids, pruned, n_seen, spec,
    prior, empty_c, lam, alpha_fixed, sample, state, pm_interval, prune_weight,
):  # fmt: skip
    """Algorithm 1 of Tsiligkaridis and Forsythe 2015 (ASUGS; SUGS when ``lam`` <= 0, at
    ``alpha_fixed``) over the records of X in order, from the state given (module docstring).

    Parameters
    ----------
    X : ndarray of shape (N, D)
        Records in stream order, columns in the product's group order.
    z : ndarray of shape (N,), int64, output
        Each record's class id.
    alpha_trace, logq : ndarrays of shape (N,) or (0,), output
        alpha_i after each record, and log [L_{i,gamma_i}(y_i) pi_{i,gamma_i}(alpha_{i-1})]
        (eq. 1 times eq. 3), the sequential log joint's increments.
    stats, cache, nk, born, ids : (K_cap, S), (K_cap, C), (K_cap,), (K_cap,), int64 (K_cap,)
        The classes, K of them in use (module docstring).
    alias : ndarray of shape (A,), int64
        The fate of the ids 0..n_ids - 1.
    pruned : ndarray of shape (S,)
        Pruned statistics, added to.
    n_seen : int
        Records seen before X.
    spec, prior, empty_c : the observation model and the empty statistics' cache
    lam, alpha_fixed : float
    sample : bool
        Step (b) draws (True) or takes the arg max (ties: lowest row, a class before new).
    state : ndarray of shape (1,), uint64
    pm_interval : int
        ``pm_due``'s; <= 0: no PM rounds.
    prune_weight : float

    Returns
    -------
    stats, cache, nk, born, ids, K, alias, n_ids, n_seen : the state (arrays maybe reallocated)
    n_pruned, n_merged : int
        This call's PM rounds' prunes and merges.
    """
    N = X.shape[0]
    d = X.shape[1]
    fast = spec.shape[0] == 1 and spec[0, 0] == product.GAUSSIAN_NW
    lognk = np.full(stats.shape[0], -np.inf)
    for h in range(K):
        lognk[h] = math.log(nk[h])
    logw = np.empty(stats.shape[0] + 1)
    P, acc, qv, ub = _packed(cache, K, empty_c, d, stats.shape[0] + 1, fast)
    counts = np.zeros(2, dtype=np.int64)
    empty_s = np.zeros(stats.shape[1])
    work = np.empty(4 * d)
    # the record copied into one buffer: a row view X[t] would take and drop a reference
    x = np.empty(d)
    t = np.int64(0)  # not a literal 0: _run would compile once more for it (14 CPU s)
    while True:
        t, K, n_ids, n_seen = _run(
            X, t, z, alpha_trace, logq, stats, cache, nk, lognk, born, ids, K, alias, n_ids,
            pruned, n_seen, spec, prior, empty_c, lam, alpha_fixed, sample, state, pm_interval,
            prune_weight, fast, P, acc, qv, ub, logw, counts, empty_s, work, x,
        )  # fmt: skip
        if t == N:
            break
        # a full table: grown outside ``_run``'s loop
        if K == stats.shape[0]:
            stats, cache, nk, lognk, born, ids = _grow(stats, cache, nk, lognk, born, ids)
            logw = np.empty(stats.shape[0] + 1)
            P, acc, qv, ub = _packed(cache, K, empty_c, d, stats.shape[0] + 1, fast)
        if n_ids == alias.shape[0]:
            alias = _grow_ids(alias)
    if fast:
        # the factors L that add_record left behind
        for h in range(K):
            gaussian_nw.restore_factor(cache[h], d)
    return stats, cache, nk, born, ids, K, alias, n_ids, n_seen, counts[0], counts[1]


@njit(cache=True, nogil=True)
def _packed(cache, K, empty_c, d, cols, fast):
    """The packed predictives P (``cols`` columns, the empty class at K) and a record's scratch;
    empty unless ``fast`` (Normal-Wishart only)."""
    if not fast:
        return np.empty((0, 0)), np.empty(0), np.empty(0), np.empty(0)
    P = np.empty((d * (d + 1) // 2 + d + 3, cols))
    gaussian_nw.pack_columns(P, cache, K, empty_c, d)
    return P, np.empty(cols), np.empty(cols), np.empty(cols)


@njit(cache=True, nogil=True, inline="always")
def _weights(x, stats, cache, lognk, K, log_alpha, spec, prior, empty_s, empty_c, logw):
    """Step (b)'s log weights into logw[:K + 1], any family."""
    for h in range(K):
        logw[h] = lognk[h] + product.log_predictive(x, stats[h], cache[h], spec, prior)
    logw[K] = log_alpha + product.log_predictive(x, empty_s, empty_c, spec, prior)


@njit(cache=True, nogil=True, inline="always")
def _open_class(K, i, n_id, stats, cache, nk, born, ids, alias, empty_c):
    """Row K becomes the empty class that record i opens, with the new id n_id."""
    stats[K, :] = 0.0
    copy_vector(cache[K], empty_c)
    nk[K] = 0.0
    born[K] = i
    ids[K] = n_id
    alias[n_id] = ALIVE


@njit(cache=True, nogil=True)
def _run(
    X, t, z, alpha_trace, logq, stats, cache, nk, lognk, born, ids, K, alias, n_ids, pruned,
    n_seen, spec, prior, empty_c, lam, alpha_fixed, sample, state, pm_interval, prune_weight,
    fast, P, acc, qv, ub, logw, counts, empty_s, work, x,
):  # fmt: skip
    """``stream``'s records from t on, until the last or one that is to open a class with no row
    left: returns (the next record, K, n_ids, n_seen). Every array borrowed, none assigned
    (``kernels.mapdp._scan_run``); counts (2,) gains the prunes and merges; empty_s (S,),
    work (4 d,), x (d,) scratch.
    """
    X, z, alpha_trace, logq, stats, cache, nk, lognk, born, ids = (
        borrowed(X), borrowed(z), borrowed(alpha_trace), borrowed(logq), borrowed(stats),
        borrowed(cache), borrowed(nk), borrowed(lognk), borrowed(born), borrowed(ids),
    )  # fmt: skip
    alias, pruned, spec, prior, empty_c, state, P, acc, qv, ub = (
        borrowed(alias), borrowed(pruned), borrowed(spec), borrowed(prior), borrowed(empty_c),
        borrowed(state), borrowed(P), borrowed(acc), borrowed(qv), borrowed(ub),
    )  # fmt: skip
    logw, counts, empty_s, work, x = (
        borrowed(logw), borrowed(counts), borrowed(empty_s), borrowed(work), borrowed(x),
    )  # fmt: skip
    N = X.shape[0]
    d = X.shape[1]
    adaptive = lam > 0.0
    trace = alpha_trace.shape[0] > 0
    want_q = logq.shape[0] > 0
    # log(i - 1) of alpha_{i-1} is the log(i) of the record before
    log_prev = math.log(float(n_seen))
    while t < N:
        for c in range(d):
            x[c] = X[t, c]
        i = n_seen + 1
        drawn_from = state[0]
        if K == 0:
            # record 1 (or the first after everything was pruned) opens class 1: pi = 1
            best = 0
            q = product.log_predictive(x, empty_s, empty_c, spec, prior)
        else:
            # (a) alpha_{i-1}
            alpha = concentration_of_log(K, log_prev, lam) if adaptive else alpha_fixed
            log_alpha = math.log(alpha)
            # (b) log [m_{i-1}(h) L_{i,h}(y_i)] and log [alpha L_{i,k+1}(y_i)]
            if fast:
                best = _fast_weights(x, P, K, lognk, log_alpha, d, acc, qv, logw, not sample, ub)
            else:
                _weights(x, stats, cache, lognk, K, log_alpha, spec, prior, empty_s, empty_c, logw)
                best = -1
            if sample:
                best = sample_log_weights(state, logw, K + 1)
            elif best < 0:
                best = 0
                for h in range(1, K + 1):
                    if logw[h] > logw[best]:
                        best = h
            q = logw[best] - math.log(i - 1.0 + alpha)
        if best == K:
            if K == stats.shape[0] or n_ids == alias.shape[0]:
                # no row: ``stream`` grows, and this record again from the same RNG state
                state[0] = drawn_from
                return t, K, n_ids, n_seen
            _open_class(K, i, n_ids, stats, cache, nk, born, ids, alias, empty_c)
            n_ids += 1
            K += 1
            if fast:
                gaussian_nw.pack_column(P, K, empty_c, d)
        # (c) the posterior update of class gamma_i
        if fast:
            gaussian_nw.add_record(x, stats[best], cache[best], prior, work, True, False)
            gaussian_nw.pack_column(P, best, cache[best], d)
        else:
            product.update(x, stats[best], cache[best], spec, prior, 1.0)
        nk[best] += 1.0
        lognk[best] = math.log(nk[best])
        z[t] = ids[best]
        n_seen = i
        if pm_due(i, pm_interval):
            a_i = concentration(K, i, lam) if adaptive else alpha_fixed
            K, np_, nm_ = prune_merge(
                i, K, stats, cache, nk, lognk, born, ids, alias, pruned, spec, prior,
                math.log(a_i), prune_weight,
            )  # fmt: skip
            counts[0] += np_
            counts[1] += nm_
            if fast and np_ + nm_ > 0:
                gaussian_nw.pack_columns(P, cache, K, empty_c, d)
        log_prev = math.log(float(i))
        if trace:
            alpha_trace[t] = concentration_of_log(K, log_prev, lam) if adaptive else alpha_fixed
        if want_q:
            logq[t] = q
        t += 1
    return t, K, n_ids, n_seen


@njit(cache=True, nogil=True)
def row_of_ids(alias, ids, K):
    """The final class row of every id (A,): the id followed through ``alias``; -1: pruned."""
    A = alias.shape[0]
    row = np.full(A, -1, dtype=np.int64)
    live = np.full(A, -1, dtype=np.int64)
    for h in range(K):
        live[ids[h]] = h
    for a in range(A):
        r = a
        while alias[r] >= 0:
            r = alias[r]
        row[a] = live[r] if alias[r] == ALIVE else -1
    return row
