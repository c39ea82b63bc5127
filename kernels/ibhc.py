"""Incremental Bayesian hierarchical clustering, IBHC (Lee and Choi 2015, Section 2.3), over leaf
summaries.

Leaves are statistics rows: a leaf summarising n records is an atomic block of size n, so its only
hypothesis is h_i and phi(X_i | t_i) = phi(X_i | h_i) = kappa(n, u) p(X_i).

A *forest* is a pool of nodes held in flat arrays, with a free list:

``ni`` : int64 ndarray of shape (cap, 5)
    LEFT, RIGHT, PARENT (-1 for none), LEAF (leaf index for a leaf node, -1 for an internal node),
    NLEAF (number of leaves under the node).
``nf`` : float64 ndarray of shape (cap, 3)
    LM = log p(X_c), the family's log marginal likelihood of the node's statistics;
    LOGPHI = log phi(X_c | t_c) of eq. 8; LOGD = log d(l(c), r(c)) of eq. 9 (-inf at a leaf).
``st`` : float64 ndarray of shape (cap, S)
    Sufficient statistics of the node: the sum of its children's rows (``st[v, 0]`` = |c|).
``free`` : int64 ndarray of shape (cap,)
    Stack of free node ids; ``meta[0]`` is its height.

Several leaf nodes may carry the same leaf index (tree-guided MCMC builds proposal trees next to
the current ones); a tree is identified by its root. Potentials follow eqs. 8-9:

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
    """An empty pool of ``cap`` nodes with statistics rows of length S.

    Returns
    -------
    ni, nf, st, free, meta : the forest arrays (see the module docstring)
    """
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
    """log d(a, b) between two trees (or subtrees) a and b, and log p(X_{a u b}).

    Returns
    -------
    logd : float
        log phi(X_a | t_a) + log phi(X_b | t_b) - log phi(X_{a u b} | h_{a u b})  (eq. 9).
    lm_ab : float
        log p(X_{a u b}), to be reused when a and b are joined.
    """
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
    """SeqInsert(r, q) of Lee and Choi 2015, Section 2.3, Step 2 and Step 3 (Fig. 1, middle and
    right).

    Insert tree q into tree r. At node c the three cases are compared through d(l(c), r(c)),
    d(l(c), q) and d(r(c), q): if d(l(c), r(c)) is the smallest (or c is a leaf), q becomes the
    sibling of c (case 1); otherwise the insertion recurses into l(c) (case 2) or r(c) (case 3).
    Ties prefer case 1, then case 2. The statistics, log marginals and potentials of every node on
    the path are then updated up to the root (Step 3); the log marginals computed on the way down
    are reused, so the cost is two log marginal evaluations per level. The descent stops after
    ``max_depth`` levels (case 1 there); IBHC passes a bound larger than any depth.

    Parameters
    ----------
    r, q : int
        Roots of the two trees.
    lm_rq : float
        log p(X_{r u q}) (from ``log_d_pair(r, q)``).
    scratch : ndarray of shape (S,)
    path : int64 ndarray of shape (>= depth,), path_lm : ndarray, work space
        On return path[:n_path] holds the ancestors of the new node, root first.
    max_depth : int

    Returns
    -------
    root : int
        The root of the merged tree.
    n_path : int
        Number of updated ancestors (the nodes whose d may now exceed 1).
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
    """Node ids of the tree rooted at r in pre-order (parents before children) into ``out``;
    returns their number."""
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
    """Leaf indices under node r into ``out``; returns their number. ``work`` is scratch of
    length >= 2 * NLEAF(r)."""
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
    """A copy of the tree rooted at r in fresh nodes; returns the copy's root. ``work`` is scratch
    of length >= 2 * (2 NLEAF(r) - 1)."""
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
    """IBHC (Lee and Choi 2015, Section 2.3): insert the leaves in ``order`` one at a time.

    Step 1 picks the tree c with the smallest d(i, c), or starts a new tree when that d exceeds 1;
    Step 2 runs SeqInsert; Step 3 updates the potentials to the root and, if an updated d(., .)
    exceeds 1, splits the tree at that level (the node and its ancestors are destroyed) and
    re-inserts every piece the same way. At most ``max_splits`` splits are made; after that the
    remaining insertions do not split, so the procedure always terminates.

    Parameters
    ----------
    leaf_st : ndarray of shape (L, S)
        Statistics of the leaves (one row per record or per summary).
    leaf_lm : ndarray of shape (L,)
        log p(X_i) of each leaf.
    order : int64 ndarray of shape (L,)
        Insertion order.
    u : float
        The auxiliary variable of Theorem 1 (ignored by the DP).
    pp : ndarray of shape (3,)
        Partition prior (``kernels.alloc``).
    spec, prior : product family description.
    mode : int
        SEQ_SPLIT (IBHC), SEQ_NOSPLIT, or TOP (put each leaf on top of the chosen tree, the
        initialisation of Lee and Choi 2015, Section 4.1).
    max_splits : int

    Returns
    -------
    ni, nf, st, free, meta : the forest
    roots : int64 ndarray of shape (K,)
        Roots of the trees; the partition is the set of their leaf sets.
    """
    L = leaf_st.shape[0]
    S = leaf_st.shape[1]
    ni, nf, st, free, meta = new_forest(2 * L + 2, S)
    roots = np.empty(L, dtype=np.int64)
    n_roots = 0
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
    """The IBHC lower bound of eq. 10 for a forest: log u^(n-1) e^(-psi(u)) / Gamma(n)
    + sum over trees of log phi(X_c | t_c) <= log P(dX, du) of eq. 7. For the DP the first term is
    the CRP constant (``alloc.log_prior_constant``) and the bound is on log p(X)."""
    n = 0.0
    out = 0.0
    for k in range(roots.shape[0]):
        n += st[roots[k], 0]
        out += nf[roots[k], LOGPHI]
    return out + log_prior_constant(n, u, pp)
