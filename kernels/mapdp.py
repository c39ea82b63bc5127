"""MAP-DP (Raykov et al. 2016, Algorithm 1), the collapsed Gibbs sampler it derives from (eq. 2.7;
De Bacco and Valera, Algorithm 3) and out-of-sample prediction (eqs. 3.4-3.5).

Clusters live in *slots*: rows of ``stats`` (K_cap, S), ``cache`` (K_cap, C), ``nk`` (K_cap,),
free where ``nk == 0``; ``z[i] == -1``: record i in no cluster yet (a sequential first pass).
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import crp
from kernels.arrays import aligned_matrix, borrowed, copy_rows, copy_vector, prefetch
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
def pack_slots(cache, n_slots, empty_c, d):
    """A new P (``gaussian_nw.pack_column``), a column per row of cache plus one: the slots
    below n_slots, then the empty cache."""
    P = np.empty((d * (d + 1) // 2 + d + 3, cache.shape[0] + 1))
    gaussian_nw.pack_columns(P, cache, n_slots, empty_c, d)
    return P


@njit(cache=True, nogil=True)
def pack_move(P, cache, nk, n_slots, k0, knew, grew, empty_c, d):
    """P after a move from slot k0 (-1: none) to knew (``grew``: a new slot)."""
    if k0 >= 0 and nk[k0] > 0.0:
        gaussian_nw.pack_column(P, k0, cache[k0], d)
    gaussian_nw.pack_column(P, knew, cache[knew], d)
    if grew:
        gaussian_nw.pack_column(P, n_slots, empty_c, d)


@njit(cache=True, nogil=True, inline="always")
def _costs(
    x, k0, stats, cache, lognk, n_slots, spec, prior, empty_s, empty_c, log_alpha, scratch_s,
    scratch_c, costs, lp, P, acc, qv, nw,
):  # fmt: skip
    """costs[k] = q_{i,k} - log N_{k,-i} (eqs. 3.1-3.2; the CRP's ``log_join`` in ``lognk``)
    for slots k < n_slots (inf when free, or k0 with x alone), costs[n_slots] with log N0 for a
    new cluster; k0 by the leave-one-out predictive. lp[k] gets log p(x | X_k), lp[n_slots]
    log p(x) (eq. 3.4's terms), from the packed P when not empty (lp[k0]: x among X_k0)."""
    log_new = crp.log_new(log_alpha)
    hot = P.shape[0] > 0
    if nw is not None and hot:
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


@njit(cache=True, nogil=True, inline="always")
def _loo_cost(x, k0, stats, cache, lognk, spec, prior, loo, loo_ok, scratch_s, scratch_c, d, r):
    """``_costs``' costs[k0] (up to rounding; Normal-Wishart without cells) from k0's cached
    ``gaussian_nw.loo_constants`` (refilled when loo_ok[k0] is False; loo[k0, 3]: log
    N_{k0,-i}, inf when x is alone) and r, x's quadratic form under k0's packed column."""
    if not loo_ok[k0]:
        n_minus = math.exp(lognk[k0]) - 1.0
        if n_minus > 0.5:
            gaussian_nw.loo_constants(cache[k0], d, loo[k0])
            loo[k0, 3] = crp.log_join(n_minus)
        else:
            loo[k0, 3] = np.inf
        loo_ok[k0] = True
    if loo[k0, 3] == np.inf:
        return np.inf
    one_minus = 1.0 - loo[k0, 2] * r
    if one_minus > 0.0:
        v = loo[k0, 0] + loo[k0, 1] * math.log(one_minus)
    else:
        # rounding: the downdated copy, as ``product.log_predictive_loo`` does
        v = product.log_predictive_loo(x, stats[k0], cache[k0], spec, prior, scratch_s, scratch_c)
    return -v - loo[k0, 3]


@njit(cache=True, nogil=True, inline="always")
def _pruned_costs_from(k0, lognk, n_slots, log_new, P, e0, qv, lpb, ub, costs, cost0, x, d, rows):
    """``_costs``' packed costs (k != k0) where one can be the arg min, inf elsewhere, from x's
    quadratic forms qv: exact only where a column's bound lpb (``packed_log_predictive_bounds``;
    kept unless ub, scratch, is lpb) is within 1e-9 (|m| + 1) of m, the least exact cost known
    (cost0, k0's, else the lowest bound's column's): the full evaluation's arg min, ties too. qv
    may hold the first ``rows`` rows only (``leading_quad_forms``), finished where needed."""
    n = n_slots + 1
    low = np.inf
    top = np.int64(-1)  # not a literal: finish_quad_form would compile once more for it
    for h in range(n):
        pt = lognk[h] if h < n_slots else log_new
        if h == k0 or pt == -np.inf:
            ub[h] = np.inf
        else:
            ub[h] = -lpb[h] - pt
            if ub[h] < low:
                low = ub[h]
                top = h
    m = cost0
    if not m < np.inf and top >= 0:
        pt = lognk[top] if top < n_slots else log_new
        qv[top] = gaussian_nw.finish_quad_form(x, P, top, d, rows, qv[top])
        m = -gaussian_nw.packed_log_predictive_exact(P, top, qv[top], e0) - pt
    thr = m + 1e-9 * (abs(m) + 1.0)
    # the threshold falls with each lower cost found: a column left out has a bound above the
    # threshold of its turn, hence a cost above the final minimum
    for h in range(n):
        if h == k0:
            costs[h] = cost0
        elif h == top and not cost0 < np.inf:
            costs[h] = m
        elif ub[h] <= thr:
            pt = lognk[h] if h < n_slots else log_new
            qv[h] = gaussian_nw.finish_quad_form(x, P, h, d, rows, qv[h])
            c = -gaussian_nw.packed_log_predictive_exact(P, h, qv[h], e0) - pt
            costs[h] = c
            if c < m:
                m = c
                thr = m + 1e-9 * (abs(m) + 1.0)
        else:
            costs[h] = np.inf


@njit(cache=True, nogil=True)
def log_norm_of(nk, alpha):
    """log(N0 + N), the normaliser of eq. 3.4's weights, with N the sum of the sizes nk."""
    n_train = 0.0
    for k in range(nk.shape[0]):
        n_train += nk[k]
    return math.log(alpha + n_train)


@njit(cache=True, nogil=True, inline="always")
def _log_mixture(lp, lognk, K, log_norm, log_alpha, terms):
    """Eqs. 3.4-3.5 from lp[k] = log p(x | X_k) (k < K), lp[K] = log p(x): (the largest term's
    index, K for a new cluster; log sum_k N_k / (N0 + N) p(x | X_k) + N0 / (N0 + N) p(x))."""
    for k in range(K):
        terms[k] = (lognk[k] - log_norm) + lp[k] if lognk[k] != -np.inf else -np.inf
    terms[K] = (log_alpha - log_norm) + lp[K]
    best = 0
    for k in range(1, K + 1):
        if terms[k] > terms[best]:
            best = k
    return best, _log_sum(terms, K, best)


@njit(cache=True, nogil=True, inline="always")
def _log_sum(terms, K, best):
    """log sum_k exp(terms[k]) for k <= K, from the largest term terms[best] (``_log_mixture``)."""
    m = terms[best]
    acc = 0.0
    for k in range(K + 1):
        # exp(-40) is below half an ulp of the sum (>= 1): such terms cannot change it
        # (written so that a NaN still propagates); the largest term's is exp(0) = 1 exactly
        e = terms[k] - m
        if k == best and e == 0.0:
            acc += 1.0
        elif not e <= -40.0:
            acc += math.exp(e)
    if acc == 1.0:
        # log(1) = 0 exactly: a record that only its own cluster explains, the common case
        return m
    return m + math.log(acc)


@njit(cache=True, nogil=True, inline="always")
def _pruned_log_mixture_from(qv, P, e0, lognk, K, log_norm, log_alpha, lpb, ub, lp, terms):
    """``_log_mixture`` of the packed predictives (the same arg max and sum) from the quadratic
    forms qv and the bounds lpb of the K + 1 columns (``packed_log_predictive_bounds``), lp[k] =
    -inf where the term's bound is 40 below a known term (``_log_sum`` skips such terms); ub
    scratch, may be lpb."""
    n = K + 1
    top = np.int64(-1)  # not a literal: finish_quad_form would compile once more for it
    hi = -np.inf
    for k in range(n):
        if k < K and lognk[k] == -np.inf:
            ub[k] = -np.inf
        else:
            ub[k] = ((lognk[k] if k < K else log_alpha) - log_norm) + lpb[k]
            if ub[k] > hi or top < 0:
                hi = ub[k]
                top = k
    if top < 0:
        for k in range(n):
            lp[k] = -np.inf
        return _log_mixture(lp, lognk, K, log_norm, log_alpha, terms)
    lp[top] = gaussian_nw.packed_log_predictive_exact(P, top, qv[top], e0)
    m = ((lognk[top] if top < K else log_alpha) - log_norm) + lp[top]
    thr = m - 40.0 - 1e-9 * (abs(m) + 1.0)
    # the terms and their arg max on the way; a NaN or infinite term: ``_log_mixture``
    plain = m > -np.inf and m < np.inf
    terms[top] = m
    best = top
    for k in range(n):
        if k != top:
            if ub[k] <= thr:
                lp[k] = -np.inf
                terms[k] = -np.inf
            else:
                lp[k] = gaussian_nw.packed_log_predictive_exact(P, k, qv[k], e0)
                t = ((lognk[k] if k < K else log_alpha) - log_norm) + lp[k]
                terms[k] = t
                if not (t > -np.inf and t < np.inf):
                    plain = False
                elif t > terms[best] or (t == terms[best] and k < best):
                    best = k
    if not plain:
        return _log_mixture(lp, lognk, K, log_norm, log_alpha, terms)
    return best, _log_sum(terms, K, best)


@njit(cache=True, nogil=True, inline="always")
def _move(
    x, i, k0, knew, z, stats, cache, nk, lognk, n_slots, spec, prior, empty_c, hot, work, touched,
    nw,
):  # fmt: skip
    """Record i from slot k0 (-1: none) to knew (n_slots: a new cluster, the lowest free slot
    or n_slots, ``_room``); returns n_slots. ``hot``: ``_update``'s, slots marked in touched."""
    if k0 >= 0:
        _update(x, stats[k0], cache[k0], spec, prior, -1.0, hot, work, nw)
        touched[k0] = True
        nk[k0] -= 1.0
        lognk[k0] = crp.log_join(nk[k0]) if nk[k0] > 0.0 else -np.inf
    if knew == n_slots:
        free = _free_slot(nk, n_slots)
        if free < 0:
            free = n_slots
            n_slots += 1
        stats[free, :] = 0.0
        copy_vector(cache[free], empty_c)
        knew = free
    _update(x, stats[knew], cache[knew], spec, prior, 1.0, hot, work, nw)
    touched[knew] = True
    nk[knew] += 1.0
    lognk[knew] = crp.log_join(nk[knew])
    z[i] = knew
    return n_slots


@njit(cache=True, nogil=True, inline="always")
def _update(x, s, c, spec, prior, w, hot, work, nw):
    """``product.update``; ``hot`` (one Normal-Wishart group) with the scratch work and without
    L, which ``_scan`` restores at its end (nw: ``product.nw_paths``'s)."""
    if nw is not None and hot:
        gaussian_nw.update_with(x, s, c, prior, w, work, True, False)
    else:
        product.update(x, s, c, spec, prior, w)


@njit(cache=True, nogil=True, inline="always")
def _free_slot(nk, n_slots, lo=0, skip=-1):
    """The lowest free slot (nk == 0) from lo up to n_slots but ``skip``, -1 if none."""
    for k in range(lo, n_slots):
        if nk[k] == 0.0 and k != skip:
            return k
    return -1


@njit(cache=True, nogil=True, inline="always")
def _room(nk, n_slots):
    """Whether a new cluster fits without growing the slot arrays."""
    return n_slots < nk.shape[0] or _free_slot(nk, n_slots) >= 0


_BLOCK = 64
# records a scan prefetches ahead (``kernels.arrays.prefetch``): a block's worth
_AHEAD = 64
_MAX_DIRTY = 4
_MAX_BLOCK_MOVES = 2


@njit(cache=True, nogil=True, inline="always")
def _mark_dirty(dirty, n_dirty, h):
    """Add column h (-1: none) to the block's recomputed columns; returns their number."""
    if h < 0:
        return n_dirty
    for q in range(n_dirty):
        if dirty[q] == h:
            return n_dirty
    dirty[n_dirty] = h
    return n_dirty + 1


@njit(cache=True, nogil=True)
def load_block(XT, X, order, t0, t1):
    """XT[:, v] = X[order[t0 + v]] for v < t1 - t0 (``gaussian_nw.block_quad_forms``)."""
    for v in range(t1 - t0):
        j = order[t0 + v]
        for c in range(X.shape[1]):
            XT[c, v] = X[j, c]


@njit(cache=True, nogil=True, inline="always")
def _stay_density(
    x, k0, stats, cache, lognk, n_slots, spec, prior, log_alpha, log_norm, hot, pruned, P, e0, qv,
    lpb, ub, lp, terms, nw,
):  # fmt: skip
    """Eq. 3.4's log density of x staying in k0, from ``_scan_run``'s costs."""
    if nw is not None and pruned:
        return _pruned_log_mixture_from(
            qv, P, e0, lognk, n_slots, log_norm, log_alpha, lpb, ub, lp, terms
        )[1]
    if not hot:
        lp[k0] = product.log_predictive(x, stats[k0], cache[k0], spec, prior)
    return _log_mixture(lp, lognk, n_slots, log_norm, log_alpha, terms)[1]


# _scan_run's position between calls: next record, n_slots, block start and end, batched, its
# moves, its recomputed columns, all moves
_T, _SLOTS, _BLK0, _BLK1, _BATCH, _BLK_MOVES, _N_DIRTY, _CHANGED = range(8)


@njit(cache=True, nogil=True)
def _scan(
    X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, log_alpha, gibbs, state, logdens,
    log_norm, nw,
):  # fmt: skip
    """``sweep`` (argmin) and ``gibbs_sweep`` (a draw): ``_scan_run`` until every record is
    done, the slot arrays grown between its calls. log_norm: ``log_norm_of`` the start; nw:
    ``product.nw_paths``' (an argument, not inlined: numba drops the branches under ``nw is not
    None`` untyped when it is None, so a spec of any family compiles no packed path)."""
    d = X.shape[1]
    lognk = np.full(stats.shape[0], -np.inf)
    for k in range(n_slots):
        if nk[k] > 0.0:
            lognk[k] = crp.log_join(nk[k])
    M = order.shape[0]
    # sized for every slot the scan can open
    size = stats.shape[0] + M + 1
    costs = np.empty(size)
    lp = np.empty(size)
    terms = np.empty(size)
    acc = np.empty(size)
    qv = np.empty(size)
    # one full-covariance group: the slots' predictives packed, kept in step with every move;
    # a spec of any family (int64) compiles none of that code
    hot = False
    pruned = False
    P = np.empty((0, 0))
    if nw is not None:
        hot = spec.shape[0] == 1 and spec[0, 0] == product.GAUSSIAN_NW
        if hot:
            P = pack_slots(cache, n_slots, empty_c, d)
        # the arg min and eq. 3.4 without most logarithms (no cells; a Gibbs scan needs every
        # cost)
        pruned = hot and not gibbs and not gaussian_nw.has_cells(prior, d)
    ub = np.empty(size if pruned else 0)
    lpb = np.empty(ub.shape[0])
    loo = np.empty((ub.shape[0], 4))
    loo_ok = np.zeros(ub.shape[0], dtype=np.bool_)
    XT = aligned_matrix(d, _BLOCK if pruned else 0)
    Q = aligned_matrix(P.shape[1] if pruned else 0, _BLOCK)
    bacc = aligned_matrix(1, _BLOCK)[0]
    dirty = np.empty(_MAX_DIRTY + 3, dtype=np.int64)
    empty_s = np.zeros(stats.shape[1])
    scratch_s = np.empty(stats.shape[1])
    scratch_c = np.empty(cache.shape[1])
    x = np.empty(d)
    work = np.empty(4 * d)
    touched = np.zeros(size, dtype=np.bool_)
    pos = np.zeros(8, dtype=np.int64)
    pos[_SLOTS] = n_slots
    pos[_BLK_MOVES] = _MAX_BLOCK_MOVES + 1
    while True:
        _scan_run(
            X, order, z, stats, cache, nk, lognk, spec, prior, empty_c, log_alpha, gibbs, state,
            logdens, log_norm, hot, pruned, P, costs, lp, terms, acc, qv, ub, lpb, loo, loo_ok,
            XT, Q, bacc, dirty, empty_s, scratch_s, scratch_c, x, work, touched, pos, nw,
        )  # fmt: skip
        if pos[_T] == M:
            break
        stats, cache, nk, lognk = _grow(stats, cache, nk, lognk)
        if nw is not None and hot:
            P = pack_slots(cache, pos[_SLOTS], empty_c, d)
        if nw is not None and pruned:
            Q = aligned_matrix(P.shape[1], _BLOCK)
            if pos[_BATCH] and pos[_T] < pos[_BLK1]:
                # the block's remaining records against the repacked columns
                gaussian_nw.block_quad_forms(
                    XT, pos[_T] - pos[_BLK0], pos[_BLK1] - pos[_BLK0], P, pos[_SLOTS] + 1, d,
                    bacc, Q,
                )  # fmt: skip
                pos[_N_DIRTY] = 0
    if nw is not None and hot:
        for k in range(pos[_SLOTS]):
            if touched[k]:
                gaussian_nw.restore_factor(cache[k], d)
    return stats, cache, nk, pos[_SLOTS], pos[_CHANGED]


@njit(cache=True, nogil=True)
def _scan_run(
    X, order, z, stats, cache, nk, lognk, spec, prior, empty_c, log_alpha, gibbs, state, logdens,
    log_norm, hot, pruned, P, costs, lp, terms, acc, qv, ub, lpb, loo, loo_ok, XT, Q, bacc, dirty,
    empty_s, scratch_s, scratch_c, x, work, touched, pos, nw,
):  # fmt: skip
    """``_scan``'s records from pos[_T] on, until the last or one that is to open a cluster
    with no row left (``_room``); the position is kept in pos.

    No array is assigned in the loop and every array is borrowed (``kernels.arrays.borrowed``):
    numba's reference counting took a sixth of the time (docs/performance.md). While records
    rarely move, a block's quadratic forms are computed at once (``block_quad_forms``), the
    columns a move changes (``dirty``) one by one after it, the block's rest again past
    _MAX_DIRTY; after a block of more than _MAX_BLOCK_MOVES moves, records go one at a time on
    the leading rows (``leading_quad_forms``), finished where a cluster can win.
    """
    X, order, z, stats, cache, nk, lognk = (
        borrowed(X), borrowed(order), borrowed(z), borrowed(stats), borrowed(cache),
        borrowed(nk), borrowed(lognk),
    )  # fmt: skip
    spec, prior, empty_c, logdens, P, costs, lp, terms = (
        borrowed(spec), borrowed(prior), borrowed(empty_c), borrowed(logdens), borrowed(P),
        borrowed(costs), borrowed(lp), borrowed(terms),
    )  # fmt: skip
    acc, qv, ub, lpb, loo, loo_ok, XT, Q, bacc, dirty = (
        borrowed(acc), borrowed(qv), borrowed(ub), borrowed(lpb), borrowed(loo),
        borrowed(loo_ok), borrowed(XT), borrowed(Q), borrowed(bacc), borrowed(dirty),
    )  # fmt: skip
    empty_s, scratch_s, scratch_c, x, work, touched, pos = (
        borrowed(empty_s), borrowed(scratch_s), borrowed(scratch_c), borrowed(x), borrowed(work),
        borrowed(touched), borrowed(pos),
    )  # fmt: skip
    d = X.shape[1]
    scoring = logdens.shape[0] > 0
    e0 = d * (d + 1) // 2 + d
    rows = gaussian_nw.leading_rows(d)
    log_new = crp.log_new(log_alpha)
    M = order.shape[0]
    t, n_slots, blk0, blk1 = pos[_T], pos[_SLOTS], pos[_BLK0], pos[_BLK1]
    batch, blk_moves, n_dirty = pos[_BATCH] != 0, pos[_BLK_MOVES], pos[_N_DIRTY]
    n_changed = pos[_CHANGED]
    while t < M:
        if t + _AHEAD < M:
            j = order[t + _AHEAD]
            prefetch(X, j)
            prefetch(z, j)
            if scoring:
                prefetch(logdens, j)
        i = order[t]
        for c in range(d):
            x[c] = X[i, c]
        k0 = z[i]
        if nw is not None and pruned:
            if t >= blk1:
                blk0 = t
                blk1 = min(t + _BLOCK, M)
                batch = blk_moves <= _MAX_BLOCK_MOVES
                blk_moves = 0
                n_dirty = 0
                if batch:
                    load_block(XT, X, order, blk0, blk1)
                    # t - blk0 = 0 as an int64: a literal 0 would compile another variant
                    gaussian_nw.block_quad_forms(
                        XT, t - blk0, blk1 - blk0, P, n_slots + 1, d, bacc, Q
                    )
            # a record scored before any move needs every full quadratic form
            r = d if batch or (scoring and n_changed == 0) else rows
            if batch:
                u = t - blk0
                for h in range(n_slots + 1):
                    qv[h] = Q[h, u]
                for q in range(n_dirty):
                    qv[dirty[q]] = gaussian_nw.quad_form(x, P, dirty[q], d)
            else:
                gaussian_nw.leading_quad_forms(x, P, n_slots + 1, d, r, acc, qv)
            cost0 = np.inf
            if k0 >= 0:
                qv[k0] = gaussian_nw.finish_quad_form(x, P, k0, d, r, qv[k0])
                cost0 = _loo_cost(
                    x, k0, stats, cache, lognk, spec, prior, loo, loo_ok, scratch_s, scratch_c, d,
                    qv[k0],
                )  # fmt: skip
            gaussian_nw.packed_log_predictive_bounds(qv, P, n_slots + 1, e0, lpb)
            _pruned_costs_from(
                k0, lognk, n_slots, log_new, P, e0, qv, lpb, ub, costs, cost0, x, d, r
            )
        else:
            _costs(
                x, k0, stats, cache, lognk, n_slots, spec, prior, empty_s, empty_c, log_alpha,
                scratch_s, scratch_c, costs, lp, P, acc, qv, nw,
            )  # fmt: skip
        drawn_from = state[0]
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
                logdens[i] = _stay_density(
                    x, k0, stats, cache, lognk, n_slots, spec, prior, log_alpha, log_norm, hot,
                    pruned, P, e0, qv, lpb, ub, lp, terms, nw,
                )  # fmt: skip
            t += 1
            continue
        if best == n_slots and not _room(nk, n_slots):
            # no row: ``_scan`` grows, and this record again from the same RNG state
            state[0] = drawn_from
            break
        before = n_slots
        n_slots = _move(
            x, i, k0, best, z, stats, cache, nk, lognk, n_slots, spec, prior, empty_c, hot, work,
            touched, nw,
        )  # fmt: skip
        n_changed += 1
        if pruned:
            if k0 >= 0:
                loo_ok[k0] = False
            loo_ok[z[i]] = False
        if nw is not None and hot:
            pack_move(P, cache, nk, n_slots, k0, z[i], n_slots > before, empty_c, d)
        if nw is not None and pruned:
            blk_moves += 1
            if batch and t + 1 < blk1:
                n_dirty = _mark_dirty(dirty, n_dirty, k0)
                n_dirty = _mark_dirty(dirty, n_dirty, z[i])
                if n_slots > before:
                    n_dirty = _mark_dirty(dirty, n_dirty, n_slots)
                if n_dirty > _MAX_DIRTY:
                    gaussian_nw.block_quad_forms(
                        XT, t + 1 - blk0, blk1 - blk0, P, n_slots + 1, d, bacc, Q
                    )
                    n_dirty = 0
        t += 1
    pos[_T], pos[_SLOTS], pos[_BLK0], pos[_BLK1] = t, n_slots, blk0, blk1
    pos[_BATCH], pos[_BLK_MOVES], pos[_N_DIRTY] = 1 if batch else 0, blk_moves, n_dirty
    pos[_CHANGED] = n_changed


@njit(cache=True, nogil=True)
def sweep(X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, alpha, logdens):
    """One MAP-DP iteration over the records in ``order`` (Raykov et al. 2016, Algorithm 1):
    each record to argmin_k [q_{i,k} - log N_{k,-i}] over the clusters and a new one (eqs.
    3.1-3.2), statistics and caches updated incrementally, O(N K d^2); ties keep the lowest
    slot, a record alone that would open a new cluster stays. While no record has moved, each
    gets logdens[i], eq. 3.4 as ``predict`` computes it: a confirming pass (n_changed == 0)
    doubles as the write-out.

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
        X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, math.log(alpha), False,
        state, logdens, log_norm, product.nw_paths(spec),
    )  # fmt: skip


@njit(cache=True, nogil=True)
def gibbs_sweep(X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, log_alpha, state):
    """One collapsed Gibbs scan (Raykov et al. 2016, eq. 2.7): z_i drawn proportional to
    N_{k,-i} p(x_i | X_{k,-i}), or N0 p(x_i). As ``sweep``, with log_alpha (log N0) and
    ``state`` (uint64 (1,), the RNG state, advanced) for alpha and logdens."""
    no_scores = np.empty(0)
    return _scan(
        X, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, log_alpha, True, state,
        no_scores, 0.0, product.nw_paths(spec),
    )  # fmt: skip


@njit(cache=True, nogil=True)
def objective(stats, nk, n_slots, spec, prior, alpha):
    """E = -log p(X, z | N0), eq. 3.3: -sum_k log p(X_k) - log p(z) (eq. 2.3, with Algorithm
    1's omitted constant, so that concentrations compare)."""
    out = 0.0
    for k in range(n_slots):
        if nk[k] > 0.0:
            out -= product.log_marginal(stats[k], spec, prior)
    return out - crp.log_eppf(nk, n_slots, alpha)


@njit(cache=True, nogil=True)
def compact(z, stats, cache, nk, n_slots):
    """(stats, cache, nk) without the empty slots, renumbered 0..K-1 in slot order in z."""
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
def _packed_predict(
    X, cache, K, empty_c, lognk, log_norm, log_alpha, lp, terms, labels, logdens, nw
):
    """``predict``'s labels and logdens of one full-covariance group by the sweep's packed
    columns (the empty cache in column K); False, untouched, for a spec of any family (nw:
    ``product.nw_paths``', None: numba drops the rest untyped)."""
    if nw is None:
        return False
    N = X.shape[0]
    P = pack_slots(cache, K, empty_c, X.shape[1])
    qv = np.empty(K + 1)
    d = X.shape[1]
    e0 = d * (d + 1) // 2 + d
    XT = aligned_matrix(d, _BLOCK)
    Q = aligned_matrix(K + 1, _BLOCK)
    bacc = aligned_matrix(1, _BLOCK)[0]
    ub = np.empty(K + 1)
    for b0 in range(0, N, _BLOCK):
        b1 = min(b0 + _BLOCK, N)
        for v in range(b1 - b0):
            for c in range(d):
                XT[c, v] = X[b0 + v, c]
        gaussian_nw.block_quad_forms(XT, 0, b1 - b0, P, K + 1, d, bacc, Q)
        for v in range(b1 - b0):
            for h in range(K + 1):
                qv[h] = Q[h, v]
            gaussian_nw.packed_log_predictive_bounds(qv, P, K + 1, e0, ub)
            best, logdens[b0 + v] = _pruned_log_mixture_from(
                qv, P, e0, lognk, K, log_norm, log_alpha, ub, ub, lp, terms
            )
            labels[b0 + v] = best if best < K else -1
    return True


@njit(cache=True, nogil=True)
def predict(X, stats, cache, nk, spec, prior, empty_c, alpha):
    """Out-of-sample prediction (Raykov et al. 2016, Section 3.2) for each row of X (N, D).

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
    if hot and _packed_predict(
        X, cache, K, empty_c, lognk, log_norm, log_alpha, lp, terms, labels, logdens,
        product.nw_paths(spec),
    ):  # fmt: skip
        return labels, logdens
    for i in range(N):
        x = X[i]
        for k in range(K):
            if lognk[k] != -np.inf:
                lp[k] = product.log_predictive(x, stats[k], cache[k], spec, prior)
        lp[K] = product.log_predictive(x, empty_s, empty_c, spec, prior)
        best, logdens[i] = _log_mixture(lp, lognk, K, log_norm, log_alpha, terms)
        labels[i] = best if best < K else -1
    return labels, logdens
