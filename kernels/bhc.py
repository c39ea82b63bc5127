"""Bayesian hierarchical clustering over leaf summaries (Xu et al. 2009, Sections 3-5).

A *leaf* is a statistics row: one record, or a whole group of records summarised by the additive
sufficient statistics of ``kernels.obs``. A leaf summarising n records enters the recursion
with d_i = alpha Gamma(n) and pi_i = 1, i.e. p(D_i | T_i) = p(D_i | H_1); for n = 1 this is the
paper's d_i = alpha. Every quantity below is then the paper's quantity restricted to partitions
that keep each leaf whole.

Node numbering
--------------
Leaves are nodes 0 .. M-1 (in input order); the internal node made by the t-th merge is M + t, so
the root is 2M - 2 and a parent always has a larger id than its children. Per-node arrays have
length 2M - 1; a leaf has ``left == right == -1``, ``log_r == log_pi == 0``.

The merge score
---------------
For two active nodes i, j merged into k, eqs. 7-8 give

    log r_k / (1 - r_k) = [log alpha + log Gamma(n_k) + log p(D_k | H_1)]
                          - [log d_i + log p(D_i | T_i)] - [log d_j + log p(D_j | T_j)]

since pi_k = alpha Gamma(n_k) / d_k and 1 - pi_k = d_i d_j / d_k. r_k is monotone in this
log-odds, so BHC's "merge the pair with the highest r_k" maximises it; it depends on i and j only,
never changes while both are active, and needs no subtraction of probabilities. Writing
u_i = log d_i + log p(D_i | T_i) (the log of the sum, over the tree-consistent partitions of D_i,
of prod_blocks alpha Gamma(n_b) p(D_b | H_1)), the recursion is u_k = logaddexp(log alpha
+ log Gamma(n_k) + log p(D_k | H_1), u_i + u_j).

The prior's parts, alpha Gamma(n) (a block of n records under the CRP), come from
``kernels.alloc.crp.log_kappa``; Bayes K-means (Section 5), whose merge score is the same with
u_i = log alpha + log Gamma(n_i) + log p(D_i | H_1), is ``kernels.bayes_kmeans``.

Candidate pairs
---------------
Each active node keeps a short list of its best partners (``n_top`` of them, sorted) and an upper
bound ``ub`` on the score of every active node not in the list. A list entry whose node has been
merged away is dropped lazily. When a merge creates node k, k is scored against every active node
(O(M) log marginals) and offered to each of their lists; a list that runs out of live entries is
rebuilt by one O(M) scan. The first lists come from the upper triangle of scores, computed one
block of rows at a time (at most ``_ROW_BUFFER`` floats). Total: about M^2 log marginals (M^2 / 2
for the first lists, M^2 / 2 over the merges, plus the rebuilds), O(M n_top) memory. Passes over
at least ``min_parallel`` pairs run on numba's threads (``parallel=True`` functions; None: never,
and they are then not compiled); the result does not depend on it.

The functions here are ``@njit(cache=True, nogil=True)`` like the rest of ``kernels``; the ones
named ``*_parallel`` and the two predictive kernels add ``parallel=True``.
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
    """log alpha + log Gamma(n_i + n_j) + log p(D_i u D_j | H_1) - u_i - u_j of nodes i and j,
    read from the node arrays: the log-odds log r_k / (1 - r_k) of eq. 8 for their merge."""
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
    """out[t] = score(c, act[t]) for t < n_act; -inf where act[t] == c.

    In parallel when there are at least ``min_parallel`` pairs, else in the calling thread.
    """
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
    """buf[i - i0, j] = score(i, j) for i0 <= i < i1 and i < j < M (the upper triangle).

    In parallel over rows when the block holds at least ``min_parallel`` pairs.
    """
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
    """Offer partner j with score s to node i's candidate list.

    Invariant kept: every live list entry scores >= ub[i] >= the score of every active node that
    is not in the list, so the list's first live entry is i's best active partner.
    """
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
    """Greedy BHC over leaf summaries (Xu et al. 2009, Section 3, eqs. 7-8, all in log space).

    Merges, at every step, the pair of active nodes with the highest r_k (eq. 8), with
    d_k = alpha Gamma(n_k) + d_left d_right, pi_k = alpha Gamma(n_k) / d_k and
    p(D_k | T_k) = pi_k p(D_k | H_1) + (1 - pi_k) p(D_left | T_left) p(D_right | T_right)
    (eq. 7). Leaves enter with d_i = alpha Gamma(n_i), pi_i = 1. O(M^2) log marginals.

    Parameters
    ----------
    stats : ndarray of shape (M, S), float64
        Leaf statistics rows, ``stats[:, 0] > 0`` the leaf sizes.
    spec, prior : product family description (``kernels.obs.product``).
    log_alpha : float
        log of the DP concentration alpha.
    n_top : int
        Candidate-list length per node (memory O(M n_top)); the tree does not depend on it.
    min_parallel : int or None
        Passes over at least this many pairs use numba's threads; None: never, and the threaded
        variants are not even compiled (numba prunes the branch on the argument's type).

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
    """``bhc``'s first candidate lists: the upper triangle of scores, one block of rows at a
    time."""
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
    """The active node whose best candidate scores highest (the first on ties), each list's
    stale head dropped first and a list left empty rebuilt."""
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
    """Take node x out of the active list act[:n_act] (pos: each node's place in it); returns
    the list's new length."""
    p = pos[x]
    last = act[n_act - 1]
    act[p] = last
    pos[last] = p
    pos[x] = -1
    return n_act - 1


@njit(cache=True, nogil=True)
def _node_terms(left, n, u, log_d, log_ph1, log_alpha):
    """log r_k, log pi_k and log p(D_k | T_k) of every node (eqs. 7-8) from the agglomeration's
    log d_k and u_k."""
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
    """log of the BHC lower bound, eq. 9: d_k Gamma(alpha) / Gamma(n_k + alpha) p(D_k | T_k).

    With summary leaves it bounds the DPM marginal likelihood (eq. 5) restricted to partitions
    that keep each leaf whole (which is itself a lower bound on eq. 5).
    """
    return log_d_k + log_p_k + crp.log_constant(n_k, math.exp(log_alpha))


@njit(cache=True, nogil=True)
def cut(left, right, log_r, n_leaves):
    """The partition of the leaves read off the tree at r_k = 0.5 (Xu et al. 2009, Section 3).

    Top-down from the root: a node with r_k > 0.5 (or a leaf) is one cluster holding all the
    leaves below it; otherwise both children are visited.

    Returns
    -------
    labels : ndarray of shape (M,), int64
        Cluster of each leaf, numbered 0.. in order of first appearance over the leaves.
    cluster_nodes : ndarray of shape (K,), int64
        The node of each cluster, in label order.
    """
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
    """log omega_k = log r_k + sum over the strict ancestors i of k of log(1 - r_i).

    omega_k is the posterior probability, under the tree's mixture over tree-consistent partitions
    (eq. 7 read as a mixture: all of D_k in one cluster with probability r_k, else the children's
    mixtures independently), that D_k is one block. It is the weight of Heller & Ghahramani
    (2005, Section 4). log(1 - r_k) = log d_l + log d_r - log d_k + log p_l + log p_r - log p_k,
    exact also where r_k is within rounding of 1.

    Returns
    -------
    log_omega : ndarray of shape (2M - 1,)
    """
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
    """log p(x | D, T) for each row of X: the BHC predictive density.

    Xu et al. (2009) defers the predictive distribution to Heller & Ghahramani (2005, Section 4),
    whose weights are omega_k (``log_block_posterior``). Here each tree-consistent partition
    predicts with the DPM's own predictive (the CRP's n_b / (N + alpha) for an existing block, alpha
    / (N + alpha) for a new one), averaged over the tree's posterior on partitions:

        p(x | D, T) = sum_k omega_k n_k / (N + alpha) p(x | D_k) + alpha / (N + alpha) p(x)

    which integrates to one because sum_k omega_k n_k = N. The caller passes
    ``log_w[k] = log omega_k + log n_k - log(N + alpha)`` and ``log_w_new``; nodes with
    ``log_w = -inf`` are skipped.

    Parameters
    ----------
    X : ndarray of shape (n, D)
        Records, columns in the product family's group order.
    node_stats : ndarray of shape (K, S)
    log_w : ndarray of shape (K,)
    spec, prior : product family description.
    log_w_new : float

    Returns
    -------
    ndarray of shape (n,)
    """
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
    """log p(x_i | D_k) for each record x_i (rows of X, group order) and statistics row k.

    Returns
    -------
    ndarray of shape (n, K)
    """
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
    """log delta_LB(i) (eq. 12) of the two alternative trees at each node (Section 4, Figs. 3-4).

    At an internal node k with children a, b, the child whose branches are relocated is a if a
    is internal, else b (Fig. 1(b)'s T_{k_l}); call it s, with children s_l, s_r, and o the
    other child of k. The alternative subtrees are (eqs. 10-11)

        T_k(1) = (j(1) = s_r u o, s_l),  p(D_k | T_k(1)) = p(D_j(1) | H_1) p(D_s_l | T_s_l),
                 d_k(1) = alpha Gamma(n_j(1)) d_s_l
        T_k(2) = (j(2) = s_l u o, s_r),  likewise,

    and the messages are propagated to the root R by Fig. 3 (only the split hypothesis at every
    ancestor: both the probability and d are multiplied by the sibling's), so that
    delta_LB(i) = d_R(i) Gamma(alpha) / Gamma(n_R + alpha) p(D_R | T_R(i)). The product of the
    siblings' d p along the path is accumulated top-down once, so the cost is O(M) plus two log
    marginals per relocated node. Nodes with two leaves below, or not flagged in ``relocate``,
    get -inf.

    Parameters
    ----------
    left, right, n, log_d, log_p : ndarray of shape (2M - 1,)
        The BHC tree (``bhc``).
    node_stats : ndarray of shape (2M - 1, S)
    spec, prior : product family description.
    log_alpha : float
    relocate : ndarray of shape (2M - 1,), bool
        Nodes at which to relocate (Fig. 4 iterates from a starting node l to the root R).

    Returns
    -------
    log_delta : ndarray of shape (2M - 1, 2)
    """
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
