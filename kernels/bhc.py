"""Bayesian hierarchical clustering over leaf summaries (Xu et al. 2009, Sections 3-5).

A *leaf* is a statistics row (one record, or a group summarised by ``kernels.obs``' statistics);
a leaf of n records enters with d_i = alpha Gamma(n) (``kernels.alloc.crp.log_kappa``) and
pi_i = 1, so every quantity is the paper's restricted to partitions that keep leaves whole.
Leaves are nodes 0..M-1, the t-th merge's node is M + t (the root 2M - 2); per-node arrays have
length 2M - 1, a leaf ``left == right == -1`` and ``log_r == log_pi == 0``.

The merge score of active nodes i, j into k (eqs. 7-8, pi_k = alpha Gamma(n_k) / d_k):

    log r_k / (1 - r_k) = [log alpha + log Gamma(n_k) + log p(D_k | H_1)] - u_i - u_j

with u_i = log d_i + log p(D_i | T_i), u_k = logaddexp(log alpha + log Gamma(n_k)
+ log p(D_k | H_1), u_i + u_j): monotone in r_k, fixed while both are active, no subtraction.

Candidate pairs: each active node keeps its ``n_top`` best partners, sorted, and a bound ``ub``
on every other's score; merged-away entries drop lazily, a new node is scored against every
active one (O(M)) and offered to their lists, an emptied list is rebuilt by an O(M) scan. About
M^2 log marginals, O(M n_top) memory. Passes over at least ``min_parallel`` pairs run on
numba's threads (the ``*_parallel`` functions; None: never, not compiled), the same result.
"""

import math

import numpy as np
from numba import njit, prange

from kernels.alloc import crp
from kernels.arrays import copy_vector
from kernels.obs import product
from kernels.partition import canonical_labels
from kernels.special import logaddexp

_ROW_BUFFER = 8_000_000  # float64 entries of the row-block buffer used to build the first lists
_N_CHUNKS = 64  # work items of a parallel scan (each with its own scratch row)
# Fewer pair scores than this in one pass are computed in the calling thread: a parallel region
# per merge costs a barrier, which on a busy machine waits for a descheduled thread.
MIN_PARALLEL = 4096


@njit(cache=True, nogil=True)
def _node_pair_score(i, j, node_stats, n, u, scratch, spec, prior, log_alpha):
    """The merge score (module docstring) of nodes i and j."""
    si = node_stats[i]
    sj = node_stats[j]
    for t in range(scratch.shape[0]):
        scratch[t] = si[t] + sj[t]
    lm = product.log_marginal(scratch, spec, prior)
    return crp.log_kappa(n[i] + n[j], log_alpha) + lm - u[i] - u[j]


@njit(cache=True, nogil=True, parallel=True)
def _scores_vs_parallel(c, act, n_act, node_stats, n, u, spec, prior, log_alpha, out):
    S = node_stats.shape[1]
    n_chunks = min(n_act, _N_CHUNKS)
    for ch in prange(n_chunks):
        lo = ch * n_act // n_chunks
        hi = (ch + 1) * n_act // n_chunks
        scratch = np.empty(S)
        for t in range(lo, hi):
            j = act[t]
            if j == c:
                out[t] = -np.inf
            else:
                out[t] = _node_pair_score(c, j, node_stats, n, u, scratch, spec, prior, log_alpha)


@njit(cache=True, nogil=True)
def _scores_vs(c, act, n_act, node_stats, n, u, spec, prior, log_alpha, out, min_parallel):
    """out[t] = score(c, act[t]) for t < n_act, -inf where act[t] == c."""
    # None (a type numba prunes on) never compiles the threaded variant
    if min_parallel is not None:
        if n_act >= min_parallel:
            _scores_vs_parallel(c, act, n_act, node_stats, n, u, spec, prior, log_alpha, out)
            return
    scratch = np.empty(node_stats.shape[1])
    for t in range(n_act):
        j = act[t]
        if j == c:
            out[t] = -np.inf
        else:
            out[t] = _node_pair_score(c, j, node_stats, n, u, scratch, spec, prior, log_alpha)


@njit(cache=True, nogil=True, parallel=True)
def _row_block_scores_parallel(i0, i1, M, node_stats, n, u, spec, prior, log_alpha, buf):
    S = node_stats.shape[1]
    for ii in prange(i1 - i0):
        i = i0 + ii
        scratch = np.empty(S)
        for j in range(i + 1, M):
            buf[ii, j] = _node_pair_score(i, j, node_stats, n, u, scratch, spec, prior, log_alpha)


@njit(cache=True, nogil=True)
def _row_block_scores(i0, i1, M, node_stats, n, u, spec, prior, log_alpha, buf, min_parallel):
    """buf[i - i0, j] = score(i, j) for i0 <= i < i1 and i < j < M."""
    if min_parallel is not None:
        n_pairs = 0
        for i in range(i0, i1):
            n_pairs += M - 1 - i
        if n_pairs >= min_parallel:
            _row_block_scores_parallel(i0, i1, M, node_stats, n, u, spec, prior, log_alpha, buf)
            return
    scratch = np.empty(node_stats.shape[1])
    for i in range(i0, i1):
        for j in range(i + 1, M):
            buf[i - i0, j] = _node_pair_score(
                i, j, node_stats, n, u, scratch, spec, prior, log_alpha
            )


@njit(cache=True, nogil=True)
def _offer(i, j, s, top_id, top_sc, top_len, ub, active):
    """Offer partner j of score s to i's list, keeping every live entry >= ub[i] >= every
    active node's not in it."""
    if s < ub[i]:
        return
    K = top_id.shape[1]
    L = top_len[i]
    if L == K:
        w = 0
        for t in range(L):
            if active[top_id[i, t]]:
                top_id[i, w] = top_id[i, t]
                top_sc[i, w] = top_sc[i, t]
                w += 1
        L = w
        if L == K:
            if s <= top_sc[i, K - 1]:
                ub[i] = max(ub[i], s)
                top_len[i] = L
                return
            ub[i] = max(ub[i], top_sc[i, K - 1])
            L = K - 1
    t = L
    while t > 0 and top_sc[i, t - 1] < s:
        top_id[i, t] = top_id[i, t - 1]
        top_sc[i, t] = top_sc[i, t - 1]
        t -= 1
    top_id[i, t] = j
    top_sc[i, t] = s
    top_len[i] = L + 1


@njit(cache=True, nogil=True)
def _drop_stale_head(i, top_id, top_sc, top_len, active):
    """Remove merged-away entries from the front of i's list; return its new length."""
    L = top_len[i]
    t = 0
    while t < L and not active[top_id[i, t]]:
        t += 1
    if t > 0:
        for w in range(L - t):
            top_id[i, w] = top_id[i, w + t]
            top_sc[i, w] = top_sc[i, w + t]
        L -= t
        top_len[i] = L
    return L


@njit(cache=True, nogil=True)
def bhc(stats, spec, prior, log_alpha, n_top=16, min_parallel=MIN_PARALLEL):
    """Greedy BHC over leaf summaries (Xu et al. 2009, Section 3, eqs. 7-8 in log space): the
    pair with the highest r_k merges, d_k = alpha Gamma(n_k) + d_left d_right.

    Parameters
    ----------
    stats : ndarray of shape (M, S)
        Leaf statistics rows (sizes > 0).
    spec, prior : the product family (``kernels.obs.product``)
    log_alpha : float
    n_top : int
        Candidate-list length (module docstring); the tree does not depend on it.
    min_parallel : int or None
        Pairs from which a pass runs threaded (module docstring).

    Returns
    -------
    left, right : ndarray of shape (2M - 1,), int64
        Children of each node (-1 for leaves), ``left < right``.
    n : ndarray of shape (2M - 1,)
        Records under each node.
    log_r, log_d, log_pi, log_p, log_ph1 : ndarray of shape (2M - 1,)
        log r_k (eq. 8), log d_k, log pi_k, log p(D_k | T_k) (eq. 7), log p(D_k | H_1) (eq. 6).
    node_stats : ndarray of shape (2M - 1, S)
        Statistics of every node (the sum of its leaves' rows).
    """
    M, S = stats.shape
    cap = 2 * M - 1
    node_stats = np.zeros((cap, S))
    n = np.zeros(cap)
    log_ph1 = np.zeros(cap)
    log_d = np.zeros(cap)
    u = np.zeros(cap)
    left = np.full(cap, -1, dtype=np.int64)
    right = np.full(cap, -1, dtype=np.int64)
    for i in range(M):
        copy_vector(node_stats[i], stats[i])
        n[i] = stats[i, 0]
        log_ph1[i] = product.log_marginal(stats[i], spec, prior)
        log_d[i] = crp.log_kappa(n[i], log_alpha)
        u[i] = log_d[i] + log_ph1[i]

    K = max(1, min(n_top, M))
    top_id = np.zeros((cap, K), dtype=np.int64)
    top_sc = np.zeros((cap, K))
    top_len = np.zeros(cap, dtype=np.int64)
    ub = np.full(cap, -np.inf)
    active = np.zeros(cap, dtype=np.bool_)
    act = np.empty(cap, dtype=np.int64)
    pos = np.full(cap, -1, dtype=np.int64)
    for i in range(M):
        active[i] = True
        act[i] = i
        pos[i] = i
    n_act = M

    _first_lists(M, node_stats, n, u, spec, prior, log_alpha, min_parallel, top_id, top_sc,
                 top_len, ub, active)  # fmt: skip

    scores = np.empty(cap)
    next_id = M
    while n_act > 1:
        bi = _best_head(act, n_act, node_stats, n, u, spec, prior, log_alpha, scores,
                        min_parallel, top_id, top_sc, top_len, ub, active)  # fmt: skip
        bj = top_id[bi, 0]
        a = min(bi, bj)
        b = max(bi, bj)
        k = next_id
        next_id += 1
        left[k] = a
        right[k] = b
        for t in range(S):
            node_stats[k, t] = node_stats[a, t] + node_stats[b, t]
        n[k] = n[a] + n[b]
        log_ph1[k] = product.log_marginal(node_stats[k], spec, prior)
        # eq. 7: d_k = alpha Gamma(n_k) + d_a d_b, and u_k likewise (module docstring)
        one = crp.log_kappa(n[k], log_alpha)
        log_d[k] = logaddexp(one, log_d[a] + log_d[b])
        u[k] = logaddexp(one + log_ph1[k], u[a] + u[b])
        for x in (a, b):
            active[x] = False
            n_act = _swap_remove(x, act, pos, n_act)
        _scores_vs(k, act, n_act, node_stats, n, u, spec, prior, log_alpha, scores, min_parallel)
        active[k] = True
        for q in range(n_act):
            j = act[q]
            _offer(k, j, scores[q], top_id, top_sc, top_len, ub, active)
            _offer(j, k, scores[q], top_id, top_sc, top_len, ub, active)
        act[n_act] = k
        pos[k] = n_act
        n_act += 1

    log_r, log_pi, log_p = _node_terms(left, n, u, log_d, log_ph1, log_alpha)
    return left, right, n, log_r, log_d, log_pi, log_p, log_ph1, node_stats


@njit(cache=True, nogil=True)
def _first_lists(
    M, node_stats, n, u, spec, prior, log_alpha, min_parallel, top_id, top_sc, top_len, ub, active
):
    """``bhc``'s first lists, the upper triangle of scores a block of rows at a time."""
    B = max(1, min(M, _ROW_BUFFER // max(M, 1)))
    buf = np.empty((B, M))
    for i0 in range(0, M, B):
        i1 = min(M, i0 + B)
        _row_block_scores(i0, i1, M, node_stats, n, u, spec, prior, log_alpha, buf, min_parallel)
        for i in range(i0, i1):
            for j in range(i + 1, M):
                s = buf[i - i0, j]
                _offer(i, j, s, top_id, top_sc, top_len, ub, active)
                _offer(j, i, s, top_id, top_sc, top_len, ub, active)


@njit(cache=True, nogil=True)
def _best_head(act, n_act, node_stats, n, u, spec, prior, log_alpha, scores, min_parallel,
               top_id, top_sc, top_len, ub, active):  # fmt: skip
    """The active node whose best candidate scores highest (first on ties), stale heads
    dropped and emptied lists rebuilt."""
    best = -np.inf
    bi = -1
    for t in range(n_act):
        i = act[t]
        L = _drop_stale_head(i, top_id, top_sc, top_len, active)
        if L == 0:
            # every listed partner has been merged away: rebuild i's list
            ub[i] = -np.inf
            _scores_vs(
                i, act, n_act, node_stats, n, u, spec, prior, log_alpha, scores, min_parallel
            )
            for q in range(n_act):
                if act[q] != i:
                    _offer(i, act[q], scores[q], top_id, top_sc, top_len, ub, active)
        if top_len[i] > 0 and (bi < 0 or top_sc[i, 0] > best):
            best = top_sc[i, 0]
            bi = i
    return bi


@njit(cache=True, nogil=True)
def _swap_remove(x, act, pos, n_act):
    """Node x out of act[:n_act] (pos: places); returns the new length."""
    p = pos[x]
    last = act[n_act - 1]
    act[p] = last
    pos[last] = p
    pos[x] = -1
    return n_act - 1


@njit(cache=True, nogil=True)
def _node_terms(left, n, u, log_d, log_ph1, log_alpha):
    """log r_k, log pi_k and log p(D_k | T_k) of every node (eqs. 7-8) from log d_k and u_k."""
    cap = left.shape[0]
    log_r = np.zeros(cap)
    log_pi = np.zeros(cap)
    log_p = np.empty(cap)
    for k in range(cap):
        log_p[k] = u[k] - log_d[k]
        if left[k] >= 0:
            one = crp.log_kappa(n[k], log_alpha)
            log_pi[k] = one - log_d[k]
            log_r[k] = one + log_ph1[k] - u[k]
    return log_r, log_pi, log_p


@njit(cache=True, nogil=True)
def log_lower_bound(log_d_k, log_p_k, n_k, log_alpha):
    """log of eq. 9's lower bound d_k Gamma(alpha) / Gamma(n_k + alpha) p(D_k | T_k) of eq. 5
    (with summary leaves, of eq. 5 over partitions that keep leaves whole)."""
    return log_d_k + log_p_k + crp.log_constant(n_k, math.exp(log_alpha))


@njit(cache=True, nogil=True)
def cut(left, right, log_r, n_leaves):
    """The partition cut at r_k = 0.5 (Section 3), top-down: a node with r_k > 0.5, or a
    leaf, is one cluster. Returns labels (M,) int64, numbered by first leaf, and each
    cluster's node (K,) int64."""
    M = n_leaves
    root = 2 * M - 2
    node_of = np.empty(M, dtype=np.int64)
    log_half = math.log(0.5)
    stack = np.empty(2 * M, dtype=np.int64)
    owner = np.empty(2 * M, dtype=np.int64)
    top = 0
    stack[0] = root
    owner[0] = -1
    top = 1
    while top > 0:
        top -= 1
        k = stack[top]
        o = owner[top]
        if o < 0 and (left[k] < 0 or log_r[k] > log_half):
            o = k
        if left[k] < 0:
            node_of[k] = o
        else:
            stack[top] = left[k]
            owner[top] = o
            stack[top + 1] = right[k]
            owner[top + 1] = o
            top += 2
    labels = np.empty(M, dtype=np.int64)
    K = canonical_labels(node_of, labels)
    nodes = np.empty(K, dtype=np.int64)
    for i in range(M):
        nodes[labels[i]] = node_of[i]
    return labels, nodes


@njit(cache=True, nogil=True)
def log_block_posterior(left, right, log_d, log_p, log_r):
    """log omega_k (2M - 1,) = log r_k + sum over k's strict ancestors of log(1 - r_i): the
    posterior probability under eq. 7's mixture that D_k is one block (Heller and Ghahramani
    2005, Section 4), log(1 - r_k) from the d's and p's (exact near r_k = 1)."""
    cap = left.shape[0]
    log_q = np.zeros(cap)
    log_omega = np.empty(cap)
    for k in range(cap - 1, -1, -1):
        log_omega[k] = log_q[k] + log_r[k]
        a = left[k]
        if a >= 0:
            b = right[k]
            log_1mr = log_d[a] + log_d[b] - log_d[k] + log_p[a] + log_p[b] - log_p[k]
            log_q[a] = log_q[k] + log_1mr
            log_q[b] = log_q[k] + log_1mr
    return log_omega


@njit(cache=True, nogil=True, parallel=True)
def log_predictive_density(X, node_stats, log_w, spec, prior, log_w_new):
    """The BHC predictive log p(x | D, T) (n,) of each row of X (n, D): the DPM's predictive
    averaged over the tree's partitions (Heller and Ghahramani 2005, Section 4),

        p(x | D, T) = sum_k omega_k n_k / (N + alpha) p(x | D_k) + alpha / (N + alpha) p(x)

    with log_w (K,) the terms' log weights (-inf: skipped) of node_stats (K, S), log_w_new."""
    K, S = node_stats.shape
    C = 0
    for g in range(spec.shape[0]):
        C += spec[g, product.NCACHE]
    live = np.zeros(K + 1, dtype=np.int64)
    n_live = 0
    for k in range(K):
        if log_w[k] > -np.inf:
            live[n_live] = k
            n_live += 1
    stats = np.zeros((n_live + 1, S))
    w = np.empty(n_live + 1)
    for q in range(n_live):
        copy_vector(stats[q], node_stats[live[q]])
        w[q] = log_w[live[q]]
    w[n_live] = log_w_new
    cache = np.zeros((n_live + 1, C))
    for q in range(n_live + 1):
        product.refresh(stats[q], cache[q], spec, prior)
    out = np.empty(X.shape[0])
    for i in prange(X.shape[0]):
        m = -np.inf
        acc = 0.0
        for q in range(n_live + 1):
            t = w[q] + product.log_predictive(X[i], stats[q], cache[q], spec, prior)
            if t > m:
                acc = acc * math.exp(m - t) + 1.0 if m > -np.inf else 1.0
                m = t
            elif t > -np.inf:
                acc += math.exp(t - m)
        out[i] = m + math.log(acc)
    return out


@njit(cache=True, nogil=True, parallel=True)
def log_predictive_matrix(X, stats, spec, prior):
    """log p(x_i | D_k) (n, K) of the rows of X (n, D) and statistics rows (K, S)."""
    K = stats.shape[0]
    C = 0
    for g in range(spec.shape[0]):
        C += spec[g, product.NCACHE]
    cache = np.zeros((K, C))
    for k in range(K):
        product.refresh(stats[k], cache[k], spec, prior)
    out = np.empty((X.shape[0], K))
    for i in prange(X.shape[0]):
        for k in range(K):
            out[i, k] = product.log_predictive(X[i], stats[k], cache[k], spec, prior)
    return out


@njit(cache=True, nogil=True)
def alternative_tree_increments(
    left, right, n, log_d, log_p, node_stats, spec, prior, log_alpha, relocate
):
    """log delta_LB(i) (eq. 12) of the two alternative trees at each node flagged in
    ``relocate`` (Section 4, Figs. 3-4), (2M - 1, 2), -inf elsewhere and below two leaves.

    At node k the relocated child s is a if internal, else b (o the other): T_k(1) =
    (s_r u o, s_l) with d_k(1) = alpha Gamma(n_j(1)) d_s_l, T_k(2) = (s_l u o, s_r) likewise
    (eqs. 10-11), propagated to the root by Fig. 3 (the siblings' d p, accumulated top-down
    once): O(M) plus two log marginals a node. left, right, n, log_d, log_p (2M - 1,) and
    node_stats (2M - 1, S): ``bhc``'s tree."""
    cap = left.shape[0]
    root = cap - 1
    const = crp.log_constant(n[root], math.exp(log_alpha))
    log_out = np.zeros(cap)
    for k in range(cap - 1, -1, -1):
        a = left[k]
        if a >= 0:
            b = right[k]
            log_out[a] = log_out[k] + log_d[b] + log_p[b]
            log_out[b] = log_out[k] + log_d[a] + log_p[a]
    log_delta = np.full((cap, 2), -np.inf)
    scratch = np.empty(node_stats.shape[1])
    for k in range(cap):
        if not relocate[k] or left[k] < 0:
            continue
        a = left[k]
        b = right[k]
        if left[a] >= 0:
            s, o = a, b
        elif left[b] >= 0:
            s, o = b, a
        else:
            continue
        for v in range(2):
            moved = right[s] if v == 0 else left[s]
            kept = left[s] if v == 0 else right[s]
            for t in range(scratch.shape[0]):
                scratch[t] = node_stats[moved, t] + node_stats[o, t]
            lm = product.log_marginal(scratch, spec, prior)
            log_dj = crp.log_kappa(n[moved] + n[o], log_alpha)
            log_delta[k, v] = log_out[k] + log_dj + lm + log_d[kept] + log_p[kept] + const
    return log_delta
