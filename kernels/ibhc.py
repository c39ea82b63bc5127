"""Incremental Bayesian hierarchical clustering, IBHC (Lee and Choi 2015, Section 2.3), over leaf
summaries.

A leaf of n records is an atomic block: phi(X_i | t_i) = phi(X_i | h_i) = kappa(n, u) p(X_i).
A *forest* is a pool of nodes in flat arrays with a free list: ``ni`` (cap, 5) int64: LEFT,
RIGHT, PARENT (-1: none), LEAF (the leaf index, -1 for an internal node), NLEAF; ``nf`` (cap, 3):
LM = log p(X_c), LOGPHI = log phi(X_c | t_c) (eq. 8), LOGD = log d(l(c), r(c)) (eq. 9, -inf at
a leaf); ``st`` (cap, S): the node's statistics; ``free`` (cap,) int64, a stack of free ids of
height ``meta[0]``. A tree is its root; leaf nodes may share a leaf index (tgMCMC's proposals).

    phi(X_c | h_c) = kappa(|c|, u) p(X_c)
    phi(X_c | t_c) = phi(X_c | h_c) + phi(X_l | t_l) phi(X_r | t_r)                      (eq. 8)
    d(l, r)        = phi(X_l | t_l) phi(X_r | t_r) / phi(X_{l u r} | h_{l u r})           (eq. 9)

and the dissimilarity of two trees a, b is
d(a, b) = phi(X_a | t_a) phi(X_b | t_b) / phi(X_{a u b} | h).
"""

import numpy as np
from numba import njit

from kernels.alloc import log_kappa, log_prior_constant
from kernels.arrays import add_vector, copy_vector
from kernels.obs import product
from kernels.special import logaddexp

LEFT, RIGHT, PARENT, LEAF, NLEAF = range(5)
LM, LOGPHI, LOGD = range(3)

# IBHC insertion modes
SEQ_SPLIT = 0  # SeqInsert, then split where an updated d exceeds 1 (IBHC, Fig. 1 right)
SEQ_NOSPLIT = 1  # SeqInsert without splitting (as inside StocInsert)
#: put the record on top of the chosen tree (the initialisation of Lee and Choi 2015, Section 4.1)
TOP = 2


@njit(cache=True, nogil=True)
def new_forest(cap, S):
    """The forest (ni, nf, st, free, meta) of ``cap`` free nodes, statistics rows of length S."""
    ni = np.full((cap, 5), -1, dtype=np.int64)
    nf = np.zeros((cap, 3))
    st = np.zeros((cap, S))
    free = np.empty(cap, dtype=np.int64)
    for k in range(cap):
        free[k] = cap - 1 - k
    meta = np.zeros(1, dtype=np.int64)
    meta[0] = cap
    return ni, nf, st, free, meta


@njit(cache=True, nogil=True)
def alloc(ni, free, meta):
    """Take a node from the free list."""
    if meta[0] == 0:
        raise ValueError("ibhc: node pool exhausted")
    meta[0] -= 1
    v = free[meta[0]]
    ni[v, LEFT] = -1
    ni[v, RIGHT] = -1
    ni[v, PARENT] = -1
    ni[v, LEAF] = -1
    ni[v, NLEAF] = 0
    return v


@njit(cache=True, nogil=True)
def release(v, ni, free, meta):
    """Return node v to the free list."""
    ni[v, LEAF] = -2
    free[meta[0]] = v
    meta[0] += 1


@njit(cache=True, nogil=True)
def log_phi_h(v, nf, st, u, pp):
    """log phi(X_c | h_c) = log kappa(|c|, u) + log p(X_c)."""
    return log_kappa(st[v, 0], u, pp) + nf[v, LM]


@njit(cache=True, nogil=True)
def refresh_node(v, ni, nf, st, u, pp):
    """Recompute LOGPHI and LOGD of node v from its LM and its children (eqs. 8-9)."""
    h = log_phi_h(v, nf, st, u, pp)
    if ni[v, LEAF] >= 0:
        nf[v, LOGPHI] = h
        nf[v, LOGD] = -np.inf
    else:
        prod_lr = nf[ni[v, LEFT], LOGPHI] + nf[ni[v, RIGHT], LOGPHI]
        nf[v, LOGPHI] = logaddexp(h, prod_lr)
        nf[v, LOGD] = prod_lr - h


@njit(cache=True, nogil=True)
def make_leaf(i, leaf_st, leaf_lm, ni, nf, st, free, meta, u, pp):
    """A new leaf node for leaf summary i."""
    v = alloc(ni, free, meta)
    ni[v, LEAF] = i
    ni[v, NLEAF] = 1
    copy_vector(st[v], leaf_st[i])
    nf[v, LM] = leaf_lm[i]
    refresh_node(v, ni, nf, st, u, pp)
    return v


@njit(cache=True, nogil=True)
def log_d_pair(a, b, nf, st, scratch, u, pp, spec, prior):
    """(log d(a, b), eq. 9, of two (sub)trees; log p(X_{a u b}), for ``join``)."""
    lm_ab = product.log_marginal_with(scratch, st[a], st[b], 1.0, spec, prior)
    h = log_kappa(scratch[0], u, pp) + lm_ab
    return nf[a, LOGPHI] + nf[b, LOGPHI] - h, lm_ab


@njit(cache=True, nogil=True)
def join(a, b, lm_ab, ni, nf, st, free, meta, u, pp):
    """A new internal node with children a and b (both roots), log p(X_{a u b}) = lm_ab given."""
    m = alloc(ni, free, meta)
    ni[m, LEFT] = a
    ni[m, RIGHT] = b
    ni[m, NLEAF] = ni[a, NLEAF] + ni[b, NLEAF]
    ni[a, PARENT] = m
    ni[b, PARENT] = m
    copy_vector(st[m], st[a])
    add_vector(st[m], st[b], 1.0)
    nf[m, LM] = lm_ab
    refresh_node(m, ni, nf, st, u, pp)
    return m


@njit(cache=True, nogil=True)
def seq_insert(
    r, q, lm_rq, ni, nf, st, free, meta, scratch, path, path_lm, u, pp, spec, prior, max_depth
):
    """SeqInsert(r, q) (Lee and Choi 2015, Section 2.3, Steps 2-3): tree q into tree r. At c,
    q becomes c's sibling when d(l(c), r(c)) is the least of it, d(l(c), q) and d(r(c), q) (or c
    is a leaf, or ``max_depth`` levels down), else descends to l(c) or r(c) (ties in that
    order); the path is then updated to the root, two log marginals a level.

    Parameters
    ----------
    r, q : int
        The trees' roots; lm_rq = log p(X_{r u q}).
    scratch : ndarray of shape (S,)
    path, path_lm : ndarrays of shape (>= depth,), int64 and float
        Work; path[:n_path] returns the new node's ancestors, root first.
    max_depth : int

    Returns
    -------
    root, n_path : int
        The merged tree's root and the number of updated ancestors.
    """
    v = r
    lm_vq = lm_rq
    n_path = 0
    while ni[v, LEAF] < 0 and n_path < max_depth:
        lc = ni[v, LEFT]
        rc = ni[v, RIGHT]
        d_lr = nf[v, LOGD]
        d_lq, lm_lq = log_d_pair(lc, q, nf, st, scratch, u, pp, spec, prior)
        d_rq, lm_rcq = log_d_pair(rc, q, nf, st, scratch, u, pp, spec, prior)
        if d_lr <= d_lq and d_lr <= d_rq:
            break
        path[n_path] = v
        path_lm[n_path] = lm_vq
        n_path += 1
        if d_lq <= d_rq:
            v = lc
            lm_vq = lm_lq
        else:
            v = rc
            lm_vq = lm_rcq
    p = ni[v, PARENT]
    m = join(v, q, lm_vq, ni, nf, st, free, meta, u, pp)
    ni[m, PARENT] = p
    if p >= 0:
        if ni[p, LEFT] == v:
            ni[p, LEFT] = m
        else:
            ni[p, RIGHT] = m
    for k in range(n_path - 1, -1, -1):
        w = path[k]
        add_vector(st[w], st[q], 1.0)
        ni[w, NLEAF] += ni[q, NLEAF]
        nf[w, LM] = path_lm[k]
        refresh_node(w, ni, nf, st, u, pp)
    if n_path == 0:
        return m, 0
    return r, n_path


@njit(cache=True, nogil=True)
def preorder(r, ni, out):
    """The tree r's node ids in pre-order into ``out``; returns their number."""
    n = 0
    out[0] = r
    top = 1
    # ``out`` doubles as the stack: entries [n, top) are pending
    while n < top:
        v = out[n]
        n += 1
        if ni[v, LEAF] < 0:
            out[top] = ni[v, LEFT]
            out[top + 1] = ni[v, RIGHT]
            top += 2
    return n


@njit(cache=True, nogil=True)
def leaves_of(r, ni, work, out):
    """Leaf indices under r into ``out``, their number returned; work (>= 2 NLEAF(r),)."""
    n = preorder(r, ni, work)
    m = 0
    for k in range(n):
        v = work[k]
        if ni[v, LEAF] >= 0:
            out[m] = ni[v, LEAF]
            m += 1
    return m


@njit(cache=True, nogil=True)
def free_tree(r, ni, free, meta, work):
    """Release every node of the tree rooted at r."""
    n = preorder(r, ni, work)
    for k in range(n):
        release(work[k], ni, free, meta)


@njit(cache=True, nogil=True)
def _copy_node(v, ni, nf, st, free, meta):
    c = alloc(ni, free, meta)
    ni[c, LEAF] = ni[v, LEAF]
    ni[c, NLEAF] = ni[v, NLEAF]
    copy_vector(st[c], st[v])
    copy_vector(nf[c], nf[v])
    return c


@njit(cache=True, nogil=True)
def copy_tree(r, ni, nf, st, free, meta, work):
    """The root of a copy of tree r in fresh nodes; work (>= 2 (2 NLEAF(r) - 1),)."""
    root = _copy_node(r, ni, nf, st, free, meta)
    work[0] = r
    work[1] = root
    top = 1
    while top > 0:
        top -= 1
        v = work[2 * top]
        c = work[2 * top + 1]
        if ni[v, LEAF] < 0:
            for side in (LEFT, RIGHT):
                cc = _copy_node(ni[v, side], ni, nf, st, free, meta)
                ni[c, side] = cc
                ni[cc, PARENT] = c
                work[2 * top] = ni[v, side]
                work[2 * top + 1] = cc
                top += 1
    return root


# -------------------------------------------------------------------------------------------------
# IBHC


@njit(cache=True, nogil=True)
def _remove_root(roots, n_roots, r):
    for k in range(n_roots):
        if roots[k] == r:
            roots[k] = roots[n_roots - 1]
            return n_roots - 1
    return n_roots


@njit(cache=True, nogil=True)
def _insert_piece(
    q, roots, n_roots, ni, nf, st, free, meta, scratch, path, path_lm, queue, n_queue, split, u,
    pp, spec, prior,
):  # fmt: skip
    """Steps 1-3 of IBHC for one tree q (a leaf or a piece of a split tree)."""
    best = -1
    best_d = np.inf
    best_lm = 0.0
    for k in range(n_roots):
        dq, lm = log_d_pair(roots[k], q, nf, st, scratch, u, pp, spec, prior)
        if dq < best_d:
            best_d = dq
            best = k
            best_lm = lm
    # Step 1: a new tree when the closest tree is still dissimilar, d > 1
    if best < 0 or best_d > 0.0:
        roots[n_roots] = q
        return n_roots + 1, n_queue
    r = roots[best]
    if split == TOP:
        roots[best] = join(r, q, best_lm, ni, nf, st, free, meta, u, pp)
        return n_roots, n_queue
    # Step 2: SeqInsert; Step 3: update to the root
    root, n_path = seq_insert(
        r, q, best_lm, ni, nf, st, free, meta, scratch, path, path_lm, u, pp, spec, prior,
        path.shape[0],
    )  # fmt: skip
    roots[best] = root
    if split != SEQ_SPLIT:
        return n_roots, n_queue
    # split at the lowest updated level where d > 1: destroy that node and its ancestors and
    # queue the pieces for re-insertion
    lowest = -1
    for k in range(n_path - 1, -1, -1):
        if nf[path[k], LOGD] > 0.0:
            lowest = k
            break
    if lowest < 0:
        return n_roots, n_queue
    n_roots = _remove_root(roots, n_roots, root)
    w = path[lowest]
    lc = ni[w, LEFT]
    rc = ni[w, RIGHT]
    ni[lc, PARENT] = -1
    ni[rc, PARENT] = -1
    queue[n_queue] = lc
    queue[n_queue + 1] = rc
    n_queue += 2
    child = w
    for k in range(lowest - 1, -1, -1):
        a = path[k]
        sib = ni[a, RIGHT] if ni[a, LEFT] == child else ni[a, LEFT]
        ni[sib, PARENT] = -1
        queue[n_queue] = sib
        n_queue += 1
        release(child, ni, free, meta)
        child = a
    release(child, ni, free, meta)
    return n_roots, n_queue


@njit(cache=True, nogil=True)
def ibhc(leaf_st, leaf_lm, order, u, pp, spec, prior, mode, max_splits):
    """IBHC (Lee and Choi 2015, Section 2.3): the leaves inserted in ``order`` (L,) int64 into
    the tree of least d (a new tree when it exceeds 1) by SeqInsert, and a tree split where an
    updated d exceeds 1, its pieces re-inserted; no splits after ``max_splits``.

    Parameters
    ----------
    leaf_st, leaf_lm : ndarrays of shapes (L, S) and (L,)
        The leaves' statistics and log marginals.
    order : int64 ndarray of shape (L,)
    u : float
    pp : ndarray of shape (3,)
        The partition prior (``kernels.alloc``).
    spec, prior : the product family
    mode : int
        SEQ_SPLIT (IBHC), SEQ_NOSPLIT, or TOP (on top of the chosen tree, Section 4.1).
    max_splits : int

    Returns
    -------
    ni, nf, st, free, meta : the forest
    roots : int64 ndarray of shape (K,)
        The trees, whose leaf sets are the partition.
    """
    L = leaf_st.shape[0]
    S = leaf_st.shape[1]
    ni, nf, st, free, meta = new_forest(2 * L + 2, S)
    roots = np.empty(L, dtype=np.int64)
    n_roots = np.int64(0)  # not a literal 0: _insert_piece would compile once more for it
    scratch = np.empty(S)
    path = np.empty(2 * L + 2, dtype=np.int64)
    path_lm = np.empty(2 * L + 2)
    queue = np.empty(2 * L + 2, dtype=np.int64)
    n_splits = 0
    for t in range(L):
        q = make_leaf(order[t], leaf_st, leaf_lm, ni, nf, st, free, meta, u, pp)
        queue[0] = q
        n_queue = 1
        while n_queue > 0:
            n_queue -= 1
            piece = queue[n_queue]
            m = mode
            if mode == SEQ_SPLIT and n_splits >= max_splits:
                m = SEQ_NOSPLIT
            before = n_queue
            n_roots, n_queue = _insert_piece(
                piece, roots, n_roots, ni, nf, st, free, meta, scratch, path, path_lm, queue,
                n_queue, m, u, pp, spec, prior,
            )  # fmt: skip
            if n_queue > before:
                n_splits += 1
    return ni, nf, st, free, meta, roots[:n_roots].copy()


@njit(cache=True, nogil=True)
def forest_labels(roots, ni, L):
    """Cluster label of each of the L leaves: the position of its tree in ``roots``."""
    z = np.full(L, -1, dtype=np.int64)
    work = np.empty(2 * L + 2, dtype=np.int64)
    leaves = np.empty(L, dtype=np.int64)
    for k in range(roots.shape[0]):
        m = leaves_of(roots[k], ni, work, leaves)
        for j in range(m):
            z[leaves[j]] = k
    return z


@njit(cache=True, nogil=True)
def log_lower_bound(roots, nf, st, u, pp):
    """Eq. 10's lower bound of eq. 7 for a forest: log u^(n-1) e^(-psi(u)) / Gamma(n) (the
    CRP's constant for the DP) + sum over trees of log phi(X_c | t_c)."""
    n = 0.0
    out = 0.0
    for k in range(roots.shape[0]):
        n += st[roots[k], 0]
        out += nf[roots[k], LOGPHI]
    return out + log_prior_constant(n, u, pp)
