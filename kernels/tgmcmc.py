"""Tree-guided MCMC, tgMCMC (Lee and Choi 2015, Section 3), over leaf summaries, for the DP and
the NGGP.

The state is a partition Pi of the L leaves (a leaf of n records is an atomic block of size n)
and, for the NGGP, the auxiliary u of Theorem 1; the target is

    p(Pi, u | X)  oc  u^(n-1) e^(-psi(u)) / Gamma(n) prod_c kappa(|c|, u) p(X_c)      (eqs. 4, 7)

(the CRP, u integrated out, for the DP). Clusters carry binary trees t_c with the potentials and
dissimilarities of eqs. 8-9 (``kernels.ibhc``). The moves (Sections 3.1-3.3): SampleSub draws a
node of a tree with probability proportional to its d (epsilon, the largest d, for a leaf);
StocInsert puts a tree into one of S by SeqInsert, with probability proportional to d^-1, or
makes it a new cluster, proportional to 1; a global move picks c uniformly and puts each other
cluster into M with probability 1 / (1 + d): M empty splits c at a SampleSub node c* (l(c*),
r(c*) and the trees off the path to the root StocInserted, nearest first; reverse: eq. 11), else
c and M merge (reverse: the split path back, eq. 12's role); a local move re-assigns a leaf by
its Gibbs conditional (eq. 6); u is slice-sampled (``kernels.alloc.sample_u``). An iteration:
G global moves, ``n_local`` local moves, one update of u (the paper: G = 20, D = 2).

Where this departs from the letter of Lee and Choi 2015: the paper's proposals depend on the
chain's history through the trees, and eqs. 11-12 are the probabilities of one path through
StocInsert, so its chain is not exactly invariant. Here every acceptance ratio is exact:

* *Canonical trees*: t_c is a function of c's leaves and of a random order of all leaves
  (``rank``, uniform under the target, redrawn by an exact Gibbs update every iteration): its
  leaves in that order inserted by SeqInsert (SEQINSERT) or each put on top (CASCADE, the
  initialisation of Section 4.1), potentials at the current u; built when a move needs it,
  dropped when its cluster or u changes.
* *Path = proposal*: with canonical trees the split node and the StocInsert choices follow from
  the proposed partition, so the path probability is the proposal's, and a merge's reverse
  replays the unique path on the merged tree (zero when there is none).
* *d between clusters* is eq. 9's d of their trees, or (``CFG_TREE_D = 0``) the single-cluster
  d_h(c, c') = phi(X_c | h_c) phi(X_c' | h_c') / phi(X_{c u c'} | h), which needs no trees.
* A merge's forward probability sums eq. 11's form over which merged cluster was picked first.
* SeqInsert's descent stops after ``max_depth`` levels (case 1 there), bounding the cost on the
  caterpillar trees of homogeneous clusters.
* *Local moves*: with ``local_tree`` leaf i is drawn with probability w_i(Pi) (a cluster, D
  rounds of SampleSub, a leaf of the subtree), z_i from its Gibbs conditional, accepted with
  min(1, w_i(Pi') / w_i(Pi)), plus leaf j's term where j could have proposed the same move;
  without it the leaf is uniform (random-scan Gibbs, always accepted).
* *Two-way splits* (``CFG_STOC_NEW = 0``): StocInsert may only regroup into l(c*) and r(c*).
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import DP, KIND, log_kappa, log_prior_constant, merge_gap, sample_u
from kernels.arrays import add_vector, copy_vector
from kernels.ibhc import (
    LEAF,
    LEFT,
    LM,
    LOGD,
    NLEAF,
    PARENT,
    RIGHT,
    copy_tree,
    free_tree,
    join,
    leaves_of,
    log_d_pair,
    make_leaf,
    new_forest,
    preorder,
    seq_insert,
)
from kernels.obs import product
from kernels.partition import canonical_labels
from kernels.rng import randint, sample_log_weights, shuffle, uniform
from kernels.samplers import init_slots
from kernels.special import log1pexp, logaddexp, logsumexp

# move types (rows of the acceptance table)
SPLIT, MERGE, LOCAL = 0, 1, 2
# columns of the acceptance table
PROPOSED, ACCEPTED, SUM_LOG_R, N_IMPOSSIBLE = 0, 1, 2, 3
# entries of the integer configuration ``cfg``
CFG_D, CFG_MAX_DEPTH, CFG_LOCAL_TREE, CFG_TREE, CFG_STOC_NEW, CFG_TREE_D, CFG_REDRAW = range(7)
# kinds of canonical tree
CASCADE, SEQINSERT = 0, 1


@njit(cache=True, nogil=True)
def _tally(row, log_r):
    """Add min(log r, 0) of a proposal to its move's ``row`` (4,) of the acceptance table, or
    count it as impossible (r = 0). The row, not the table and a move type: a constant argument
    would compile one specialisation per move."""
    if log_r == -np.inf:
        row[N_IMPOSSIBLE] += 1.0
    else:
        row[SUM_LOG_R] += min(log_r, 0.0)


@njit(cache=True, nogil=True)
def make_workspace(L, cap, S):
    """Scratch arrays for the moves (tuple). ``cap`` is the node pool size."""
    big = 4 * L + 8
    return (
        np.empty(big, dtype=np.int64),  # 0 work: traversals
        np.empty(big, dtype=np.int64),  # 1 work2: nested traversals, paths
        np.empty(big, dtype=np.int64),  # 2 path (SeqInsert)
        np.empty(big),  # 3 path_lm
        np.empty(L + 2, dtype=np.int64),  # 4 members
        np.empty(L + 2, dtype=np.int64),  # 5 lab: block label per leaf
        np.empty(cap, dtype=np.int64),  # 6 blk: block label per node
        np.empty(cap),  # 7 aggmax per node
        np.empty(cap),  # 8 agglse per node
        np.empty(big),  # 9 log weights (SampleSub)
        np.empty(big),  # 10 log weights (StocInsert, leaf j's conditional), log_select
        np.empty(L + 2, dtype=np.int64),  # 11 S list (tree roots)
        np.empty(L + 2, dtype=np.int64),  # 12 Q list
        np.empty(L + 2, dtype=np.int64),  # 13 labels of S entries
        np.empty(S),  # 14 scratch statistics row
        np.empty(big),  # 15 log weights (Gibbs), log_select, StocInsert log marginals
        np.empty(L + 2),  # 16 log marginals of leaf i joining each cluster
        np.empty(S),  # 17 second scratch statistics row
    )


# -------------------------------------------------------------------------------------------------
# clusters and their canonical trees
#
# C = (z, cst, clm, cnl, troot, act, pos, lnode, kc): cluster slot of each leaf (L,); statistics
# (L, S), log marginal (L,) and number of leaves (L,) per slot (0 = free slot); tree root per slot
# (-1: no tree yet); active slots act[:K] with pos[slot] = index in act; leaf -> node of its
# cluster's tree (valid while the tree exists); kc[0] = K.
# P = (leaf_st, leaf_lm, rank, pp, spec, prior).


@njit(cache=True, nogil=True)
def build_canonical(members, m, P, F, W, u, cfg):
    """The root of the canonical tree (module docstring) of the leaves members[:m] at u."""
    leaf_st, leaf_lm, rank, pp, spec, prior = P
    ni, nf, st, free, meta = F
    keys = np.empty(m, dtype=np.int64)
    for a in range(m):
        keys[a] = rank[members[a]]
    idx = np.argsort(keys)
    root = make_leaf(members[idx[0]], leaf_st, leaf_lm, ni, nf, st, free, meta, u, pp)
    for a in range(1, m):
        q = make_leaf(members[idx[a]], leaf_st, leaf_lm, ni, nf, st, free, meta, u, pp)
        _, lm_rq = log_d_pair(root, q, nf, st, W[14], u, pp, spec, prior)
        if cfg[CFG_TREE] == CASCADE:
            root = join(root, q, lm_rq, ni, nf, st, free, meta, u, pp)
        else:
            root, _ = seq_insert(
                root, q, lm_rq, ni, nf, st, free, meta, W[14], W[2], W[3], u, pp, spec, prior,
                cfg[CFG_MAX_DEPTH],
            )  # fmt: skip
    return root


@njit(cache=True, nogil=True)
def _members(s, z, out):
    m = 0
    for i in range(z.shape[0]):
        if z[i] == s:
            out[m] = i
            m += 1
    return m


@njit(cache=True, nogil=True)
def _attach_tree(s, r, C, F, W):
    """Make the tree rooted at r the tree of slot s (and point the leaves at its nodes)."""
    troot = C[4]
    lnode = C[7]
    ni = F[0]
    troot[s] = r
    n = preorder(r, ni, W[1])
    for a in range(n):
        v = W[1][a]
        if ni[v, LEAF] >= 0:
            lnode[ni[v, LEAF]] = v


@njit(cache=True, nogil=True)
def _drop_tree(s, C, F, W):
    troot = C[4]
    if troot[s] >= 0:
        ni, _nf, _st, free, meta = F
        free_tree(troot[s], ni, free, meta, W[0])
        troot[s] = -1


@njit(cache=True, nogil=True)
def ensure_tree(s, C, F, W, P, u, cfg):
    """The tree of slot s, built if the cluster has none."""
    troot = C[4]
    if troot[s] < 0:
        m = _members(s, C[0], W[4])
        r = build_canonical(W[4], m, P, F, W, u, cfg)
        _attach_tree(s, r, C, F, W)
    return troot[s]


@njit(cache=True, nogil=True)
def _slot_new(C):
    _z, _cst, _clm, cnl, troot, act, pos, _lnode, kc = C
    s = -1
    for k in range(cnl.shape[0]):
        if cnl[k] == 0:
            s = k
            break
    act[kc[0]] = s
    pos[s] = kc[0]
    kc[0] += 1
    troot[s] = -1
    return s


@njit(cache=True, nogil=True)
def _slot_drop(s, C, F, W):
    _z, cst, clm, cnl, _troot, act, pos, _lnode, kc = C
    _drop_tree(s, C, F, W)
    cnl[s] = 0
    cst[s, :] = 0.0
    clm[s] = 0.0
    a = pos[s]
    last = act[kc[0] - 1]
    act[a] = last
    pos[last] = a
    kc[0] -= 1


@njit(cache=True, nogil=True)
def init_chain(leaf_st, leaf_lm, z0, spec, prior):
    """The chain's state for the initial labels z0 (L,) (values 0..K-1, every value used).

    Returns
    -------
    F : tuple (ni, nf, st, free, meta), the node pool (no trees yet: they are built on demand)
    C : tuple (z, cst, clm, cnl, troot, act, pos, lnode, kc), the clusters
    """
    L, S = leaf_st.shape
    F = new_forest(10 * L + 16, S)
    z, cst, clm, cnl = init_slots(leaf_st, z0, spec, prior)
    troot = np.full(L, -1, dtype=np.int64)
    act = np.zeros(L, dtype=np.int64)
    pos = np.zeros(L, dtype=np.int64)
    lnode = np.full(L, -1, dtype=np.int64)
    kc = np.zeros(1, dtype=np.int64)
    for s in range(L):
        if cnl[s] > 0:
            act[kc[0]] = s
            pos[s] = kc[0]
            kc[0] += 1
    return F, (z, cst, clm, cnl, troot, act, pos, lnode, kc)


@njit(cache=True, nogil=True)
def refresh_statistics(C, leaf_st, spec, prior):
    """Recompute every cluster's statistics and log marginal from its leaves (no drift from long
    chains of additions and subtractions)."""
    z, cst, clm, _cnl, _troot, act, _pos, _lnode, kc = C
    for a in range(kc[0]):
        cst[act[a], :] = 0.0
    for i in range(z.shape[0]):
        add_vector(cst[z[i]], leaf_st[i], 1.0)
    for a in range(kc[0]):
        s = act[a]
        clm[s] = product.log_marginal(cst[s], spec, prior)


@njit(cache=True, nogil=True)
def cl_term(s, C, u, pp):
    """log kappa(|c|, u) + log p(X_c) of the cluster in slot s."""
    return log_kappa(C[1][s, 0], u, pp) + C[2][s]


@njit(cache=True, nogil=True)
def log_joint(C, u, pp):
    """log p(X, Pi, u) (eq. 4 with the likelihoods; the CRP with u integrated out for the DP)."""
    _z, cst, _clm, _cnl, _troot, act, _pos, _lnode, kc = C
    n = 0.0
    out = 0.0
    for a in range(kc[0]):
        s = act[a]
        n += cst[s, 0]
        out += cl_term(s, C, u, pp)
    return out + log_prior_constant(n, u, pp)


@njit(cache=True, nogil=True)
def log_dh(sa, lma, sb, lmb, scratch, u, pp, spec, prior):
    """log d_h(a, b) = log phi(X_a | h_a) + log phi(X_b | h_b) - log phi(X_{a u b} | h) for two
    statistics rows with their log marginals; also returns log p(X_{a u b}).

    With phi(X_c | h_c) = kappa(|c|, u) p(X_c) this is minus the merge gap: the allocation
    model's (``kernels.alloc.merge_gap``) plus the observation model's
    (``kernels.obs.product.log_marginal_gap``)."""
    obs, lm_ab = product.log_marginal_gap(sa, sb, lma, lmb, scratch, spec, prior)
    return -(obs + merge_gap(sa[0], sb[0], u, pp)), lm_ab


# -------------------------------------------------------------------------------------------------
# SampleSub


@njit(cache=True, nogil=True)
def sample_sub(v, F, W, state, internal_only):
    """SampleSub (module docstring) in the subtree rooted at v, leaves excluded when
    ``internal_only``: (node, -1 for a leaf v then; log probability of the draw)."""
    ni = F[0]
    nf = F[1]
    work = W[0]
    logw = W[9]
    if ni[v, LEAF] >= 0:
        if internal_only:
            return -1, 0.0
        return v, 0.0
    n = preorder(v, ni, work)
    eps = -np.inf
    for a in range(n):
        w = work[a]
        if ni[w, LEAF] < 0 and nf[w, LOGD] > eps:
            eps = nf[w, LOGD]
    for a in range(n):
        w = work[a]
        if ni[w, LEAF] < 0:
            logw[a] = nf[w, LOGD]
        elif internal_only:
            logw[a] = -np.inf
        else:
            logw[a] = eps
    a = sample_log_weights(state, logw, n)
    return work[a], logw[a] - logsumexp(logw, n)


@njit(cache=True, nogil=True)
def log_select(root, leaf_node, D, F, W):
    """log w_i: the probability that D rounds of SampleSub from ``root`` and a uniform leaf of
    the final subtree pick the leaf node ``leaf_node``. O(size + D depth^2)."""
    ni, nf = F[0], F[1]
    work, aggmax, agglse = W[0], W[7], W[8]
    n = preorder(root, ni, work)
    for a in range(n - 1, -1, -1):
        v = work[a]
        if ni[v, LEAF] >= 0:
            aggmax[v] = -np.inf
            agglse[v] = -np.inf
        else:
            lc = ni[v, LEFT]
            rc = ni[v, RIGHT]
            aggmax[v] = max(nf[v, LOGD], max(aggmax[lc], aggmax[rc]))
            agglse[v] = logaddexp(nf[v, LOGD], logaddexp(agglse[lc], agglse[rc]))
    path = W[1]
    h = 0
    v = leaf_node
    while v != root:
        path[h] = v
        h += 1
        v = ni[v, PARENT]
    path[h] = root
    h += 1
    for a in range(h // 2):
        t = path[a]
        path[a] = path[h - 1 - a]
        path[h - 1 - a] = t
    logf = W[10]
    newf = W[15]
    logf[0] = 0.0
    for j in range(1, h):
        logf[j] = -np.inf
    for _ in range(D):
        for j in range(h):
            newf[j] = -np.inf
        for a in range(h):
            if logf[a] == -np.inf:
                continue
            pa = path[a]
            if ni[pa, LEAF] >= 0:
                newf[a] = logaddexp(newf[a], logf[a])
                continue
            eps = aggmax[pa]
            logW = logaddexp(agglse[pa], math.log(ni[pa, NLEAF]) + eps)
            for j in range(a, h):
                pj = path[j]
                lw = nf[pj, LOGD] if ni[pj, LEAF] < 0 else eps
                newf[j] = logaddexp(newf[j], logf[a] + lw - logW)
        for j in range(h):
            logf[j] = newf[j]
    out = -np.inf
    for j in range(h):
        out = logaddexp(out, logf[j] - math.log(ni[path[j], NLEAF]))
    return out


# -------------------------------------------------------------------------------------------------
# StocInsert: sampled (forward) and replayed (reverse)


@njit(cache=True, nogil=True)
def _detach(c_star, root, F, W, Slist, Qlist):
    """Copies of l(c*), r(c*) into Slist[0:2], the trees off the path from c* to the root into
    Qlist, nearest first; returns their number."""
    ni, nf, st, free, meta = F
    Slist[0] = copy_tree(ni[c_star, LEFT], ni, nf, st, free, meta, W[0])
    Slist[1] = copy_tree(ni[c_star, RIGHT], ni, nf, st, free, meta, W[0])
    nq = 0
    v = c_star
    while v != root:
        p = ni[v, PARENT]
        Qlist[nq] = ni[p, RIGHT] if ni[p, LEFT] == v else ni[p, LEFT]
        nq += 1
        v = p
    return nq


@njit(cache=True, nogil=True)
def stoc_insert(Slist, ns, q, F, W, state, forced, slab, qlab, u, pp, spec, prior, max_depth,
                allow_new):  # fmt: skip
    """StocInsert(S, q): a copy of tree q into an entry of S, or a new one (only with
    ``allow_new``); ``forced`` replays the entry whose label ``slab`` is ``qlab`` (a new one if
    none). Returns (the new size of S, log probability of the choice)."""
    ni, nf, st, free, meta = F
    logw = W[10]
    lmq = W[15]
    qc = copy_tree(q, ni, nf, st, free, meta, W[0])
    for s in range(ns):
        d, lm = log_d_pair(Slist[s], qc, nf, st, W[14], u, pp, spec, prior)
        logw[s] = -d
        lmq[s] = lm
    logw[ns] = 0.0 if allow_new else -np.inf
    if forced:
        choice = ns
        for s in range(ns):
            if slab[s] == qlab:
                choice = s
                break
    else:
        choice = sample_log_weights(state, logw, ns + 1)
    log_p = logw[choice] - logsumexp(logw, ns + 1)
    if choice == ns:
        Slist[ns] = qc
        slab[ns] = qlab
        return ns + 1, log_p
    Slist[choice], _ = seq_insert(
        Slist[choice], qc, lmq[choice], ni, nf, st, free, meta, W[14], W[2], W[3], u, pp, spec,
        prior, max_depth,
    )  # fmt: skip
    return ns, log_p


@njit(cache=True, nogil=True)
def log_split_path(U, F, W, state, u, pp, spec, prior, max_depth, allow_new):
    """log probability that SampleSub and StocInsert on tree U propose the partition of its
    leaves labelled in W[5]; -inf if no path does."""
    ni, nf, _st, free, meta = F
    work = W[0]
    lab = W[5]
    blk = W[6]
    Slist = W[11]
    Qlist = W[12]
    slab = W[13]
    n = preorder(U, ni, work)
    for a in range(n - 1, -1, -1):
        v = work[a]
        if ni[v, LEAF] >= 0:
            blk[v] = lab[ni[v, LEAF]]
        else:
            bl = blk[ni[v, LEFT]]
            br = blk[ni[v, RIGHT]]
            blk[v] = bl if (bl == br and bl >= 0) else -1
    if blk[U] >= 0:
        return -np.inf
    v = U
    while True:
        bl = blk[ni[v, LEFT]]
        br = blk[ni[v, RIGHT]]
        if bl >= 0 and br >= 0:
            break
        if bl < 0 and br < 0:
            return -np.inf
        v = ni[v, LEFT] if bl < 0 else ni[v, RIGHT]
    c_star = v
    logw = W[9]
    n = preorder(U, ni, work)
    for a in range(n):
        w = work[a]
        logw[a] = nf[w, LOGD] if ni[w, LEAF] < 0 else -np.inf
    log_p = nf[c_star, LOGD] - logsumexp(logw, n)
    nq = _detach(c_star, U, F, W, Slist, Qlist)
    slab[0] = blk[ni[c_star, LEFT]]
    slab[1] = blk[ni[c_star, RIGHT]]
    ns = np.int64(2)  # not a literal 2: stoc_insert would compile once more for it
    for a in range(nq):
        q = Qlist[a]
        ns, lp = stoc_insert(
            Slist, ns, q, F, W, state, np.bool_(True), slab, blk[q], u, pp, spec, prior, max_depth,
            allow_new,
        )  # fmt: skip
        log_p += lp
    for s in range(ns):
        free_tree(Slist[s], ni, free, meta, W[0])
    return log_p


# -------------------------------------------------------------------------------------------------
# global moves


@njit(cache=True, nogil=True)
def _log_d_slots(sa, sb, C, F, W, u, pp, spec, prior, tree_d):
    """log d of the clusters in slots sa and sb: of their trees with ``tree_d``, else d_h."""
    cst = C[1]
    clm = C[2]
    troot = C[4]
    if tree_d:
        d, _ = log_d_pair(troot[sa], troot[sb], F[1], F[2], W[17], u, pp, spec, prior)
        return d
    d, _ = log_dh(cst[sa], clm[sa], cst[sb], clm[sb], W[17], u, pp, spec, prior)
    return d


@njit(cache=True, nogil=True)
def global_move(C, F, W, P, state, fu, cfg, acc):
    """One global move (Section 3.2): split or merge, accepted by Metropolis-Hastings."""
    _z, _cst, _clm, _cnl, _troot, act, _pos, _lnode, kc = C
    _leaf_st, _leaf_lm, _rank, pp, spec, prior = P
    u = fu[0]
    K = kc[0]
    tree_d = cfg[CFG_TREE_D] != 0
    if tree_d:
        for b in range(K):
            ensure_tree(act[b], C, F, W, P, u, cfg)
    a = randint(state, K)
    s = act[a]
    dc = np.empty(K)
    inM = np.zeros(K, dtype=np.bool_)
    n_m = 0
    log_sel = -math.log(K)
    for b in range(K):
        if b == a:
            continue
        dc[b] = _log_d_slots(s, act[b], C, F, W, u, pp, spec, prior, tree_d)
        if math.log(1.0 - uniform(state)) < -log1pexp(dc[b]):
            inM[b] = True
            n_m += 1
            log_sel -= log1pexp(dc[b])
        else:
            log_sel += dc[b] - log1pexp(dc[b])
    if n_m == 0:
        _split(a, log_sel, C, F, W, P, state, fu, cfg, acc)
    else:
        _merge(a, dc, inM, C, F, W, P, state, fu, cfg, acc)


@njit(cache=True, nogil=True)
def _split(a, log_sel, C, F, W, P, state, fu, cfg, acc):
    z, cst, clm, cnl, troot, act, _pos, _lnode, kc = C
    _leaf_st, _leaf_lm, _rank, pp, spec, prior = P
    ni, nf, st, free, meta = F
    u = fu[0]
    max_depth = cfg[CFG_MAX_DEPTH]
    K = kc[0]
    s = act[a]
    if cnl[s] == 1:
        return  # a single leaf cannot be split: the chain stays
    c = ensure_tree(s, C, F, W, P, u, cfg)
    c_star, log_ss = sample_sub(c, F, W, state, np.bool_(True))
    log_fwd = log_sel + log_ss
    Slist = W[11]
    slab = W[13]
    nq = _detach(c_star, c, F, W, Slist, W[12])
    slab[0] = 0
    slab[1] = 1
    ns = np.int64(2)  # not a literal 2: stoc_insert would compile once more for it
    for k in range(nq):
        ns, lp = stoc_insert(
            Slist, ns, W[12][k], F, W, state, np.bool_(False), slab, ns, u, pp, spec, prior,
            max_depth, cfg[CFG_STOC_NEW] != 0,
        )  # fmt: skip
        log_fwd += lp
    log_pi = -cl_term(s, C, u, pp)
    for b in range(ns):
        log_pi += log_kappa(st[Slist[b], 0], u, pp) + nf[Slist[b], LM]
    tree_d = cfg[CFG_TREE_D] != 0
    T = Slist[:ns].copy()
    if tree_d:
        # the proposed clusters' canonical trees, for their d's
        for b in range(ns):
            m = leaves_of(Slist[b], ni, W[0], W[4])
            T[b] = build_canonical(W[4], m, P, F, W, u, cfg)
    # reverse, eq. 11: pick one of the new clusters, the others into M, no other cluster
    terms = np.zeros(ns)
    for b in range(ns):
        rb = T[b]
        for b2 in range(b + 1, ns):
            r2 = T[b2]
            if tree_d:
                d, _ = log_d_pair(rb, r2, nf, st, W[17], u, pp, spec, prior)
            else:
                d, _ = log_dh(st[rb], nf[rb, LM], st[r2], nf[r2, LM], W[17], u, pp, spec, prior)
            terms[b] -= log1pexp(d)
            terms[b2] -= log1pexp(d)
        for k in range(K):
            if k != a:
                t = act[k]
                if tree_d:
                    d, _ = log_d_pair(rb, troot[t], nf, st, W[17], u, pp, spec, prior)
                else:
                    d, _ = log_dh(st[rb], nf[rb, LM], cst[t], clm[t], W[17], u, pp, spec, prior)
                terms[b] += d - log1pexp(d)
    log_rev = -math.log(K - 1 + ns) + logsumexp(terms, ns)
    log_r = log_pi + log_rev - log_fwd
    acc[SPLIT, PROPOSED] += 1.0
    _tally(acc[SPLIT], log_r)
    if math.log(1.0 - uniform(state)) < log_r:
        acc[SPLIT, ACCEPTED] += 1.0
        _drop_tree(s, C, F, W)
        for b in range(ns):
            rb = Slist[b]
            t = s if b == 0 else _slot_new(C)
            copy_vector(cst[t], st[rb])
            clm[t] = nf[rb, LM]
            cnl[t] = ni[rb, NLEAF]
            m = leaves_of(rb, ni, W[0], W[4])
            for k in range(m):
                z[W[4][k]] = t
            if tree_d:
                _attach_tree(t, T[b], C, F, W)
    elif tree_d:
        for b in range(ns):
            free_tree(T[b], ni, free, meta, W[0])
    for b in range(ns):
        free_tree(Slist[b], ni, free, meta, W[0])


@njit(cache=True, nogil=True)
def _merge(a, dc, inM, C, F, W, P, state, fu, cfg, acc):
    z, cst, clm, cnl, troot, act, _pos, _lnode, kc = C
    _leaf_st, _leaf_lm, _rank, pp, spec, prior = P
    ni, nf, st, free, meta = F
    u = fu[0]
    max_depth = cfg[CFG_MAX_DEPTH]
    tree_d = cfg[CFG_TREE_D] != 0
    K = kc[0]
    Cl = np.empty(K, dtype=np.int64)  # positions in act, c first
    Cl[0] = a
    nC = 1
    for b in range(K):
        if inM[b]:
            Cl[nC] = b
            nC += 1
    inC = inM.copy()
    inC[a] = True
    # forward: eq. 11's form summed over the first pick among the merged clusters
    terms = np.zeros(nC)
    for k in range(nC):
        ka = Cl[k]
        for b in range(K):
            if b == ka:
                continue
            if ka == a:
                d = dc[b]
            elif b == a:
                d = dc[ka]
            else:
                d = _log_d_slots(act[ka], act[b], C, F, W, u, pp, spec, prior, tree_d)
            if inC[b]:
                terms[k] -= log1pexp(d)
            else:
                terms[k] += d - log1pexp(d)
    log_fwd = -math.log(K) + logsumexp(terms, nC)
    # the merged cluster
    U_st = np.zeros(cst.shape[1])
    log_pi = 0.0
    slots = np.empty(nC, dtype=np.int64)
    for k in range(nC):
        t = act[Cl[k]]
        slots[k] = t
        U_st += cst[t]
        log_pi -= cl_term(t, C, u, pp)
    U_lm = product.log_marginal(U_st, spec, prior)
    log_pi += log_kappa(U_st[0], u, pp) + U_lm
    # reverse: pick the merged cluster (1 / K*), M empty, then the split path back
    Kstar = K - nC + 1
    log_rev = -math.log(Kstar)
    lab = W[5]
    m = np.int64(0)  # not a literal 0: build_canonical would compile once more for it
    members = W[4]
    for i in range(z.shape[0]):
        for k in range(nC):
            if z[i] == slots[k]:
                members[m] = i
                lab[i] = k
                m += 1
                break
    U = build_canonical(members, m, P, F, W, u, cfg)
    for b in range(K):
        if not inC[b]:
            t = act[b]
            if tree_d:
                d, _ = log_d_pair(U, troot[t], nf, st, W[14], u, pp, spec, prior)
            else:
                d, _ = log_dh(U_st, U_lm, cst[t], clm[t], W[14], u, pp, spec, prior)
            log_rev += d - log1pexp(d)
    log_rev += log_split_path(U, F, W, state, u, pp, spec, prior, max_depth, cfg[CFG_STOC_NEW] != 0)
    log_r = log_pi + log_rev - log_fwd
    acc[MERGE, PROPOSED] += 1.0
    _tally(acc[MERGE], log_r)
    if log_rev > -np.inf and math.log(1.0 - uniform(state)) < log_r:
        acc[MERGE, ACCEPTED] += 1.0
        for k in range(nC):
            _slot_drop(slots[k], C, F, W)
        t = _slot_new(C)
        copy_vector(cst[t], U_st)
        clm[t] = U_lm
        cnl[t] = m
        for k in range(m):
            z[members[k]] = t
        _attach_tree(t, U, C, F, W)
    else:
        free_tree(U, ni, free, meta, W[0])


# -------------------------------------------------------------------------------------------------
# local moves


@njit(cache=True, nogil=True)
def _gibbs(i, C, W, P, u, lw, lmj):
    """Leaf i's Gibbs conditional (eq. 6) relative to the partition without i: lw[b] to join
    act[b], lw[K] a new cluster (-inf when i is alone), lmj[b] the log marginal after the move.
    Returns (log sum of the weights, i's index in act)."""
    z, cst, clm, cnl, _troot, act, pos, _lnode, kc = C
    leaf_st, leaf_lm, _rank, pp, spec, prior = P
    scratch = W[14]
    K = kc[0]
    s0 = z[i]
    ni_ = leaf_st[i, 0]
    alone = cnl[s0] == 1
    a0 = pos[s0]
    for b in range(K):
        t = act[b]
        if b == a0:
            if alone:
                lw[b] = log_kappa(ni_, u, pp) + leaf_lm[i]
                lmj[b] = leaf_lm[i]
            else:
                lmj[b] = product.log_marginal_with(scratch, cst[t], leaf_st[i], -1.0, spec, prior)
                lw[b] = cl_term(t, C, u, pp) - log_kappa(cst[t, 0] - ni_, u, pp) - lmj[b]
            continue
        lmj[b] = product.log_marginal_with(scratch, cst[t], leaf_st[i], 1.0, spec, prior)
        lw[b] = log_kappa(cst[t, 0] + ni_, u, pp) - log_kappa(cst[t, 0], u, pp) + lmj[b] - clm[t]
    lw[K] = -np.inf if alone else log_kappa(ni_, u, pp) + leaf_lm[i]
    return logsumexp(lw, K + 1), a0


@njit(cache=True, nogil=True)
def _apply_move(i, choice, lmj, C, F, W, P):
    """Leaf i to act[choice] (K: a new cluster), lmj from ``_gibbs``; both clusters lose their
    trees. Returns the target slot."""
    z, cst, clm, cnl, _troot, act, pos, _lnode, kc = C
    leaf_st, leaf_lm, _rank, _pp, _spec, _prior = P
    K = kc[0]
    s0 = z[i]
    a0 = pos[s0]
    lm_minus = lmj[a0]
    if choice == K:
        t = _slot_new(C)
        copy_vector(cst[t], leaf_st[i])
        clm[t] = leaf_lm[i]
    else:
        t = act[choice]
        _drop_tree(t, C, F, W)
        add_vector(cst[t], leaf_st[i], 1.0)
        clm[t] = lmj[choice]
    cnl[t] += 1
    z[i] = t
    if cnl[s0] == 1:
        _slot_drop(s0, C, F, W)
    else:
        _drop_tree(s0, C, F, W)
        add_vector(cst[s0], leaf_st[i], -1.0)
        clm[s0] = lm_minus
        cnl[s0] -= 1
    return t


@njit(cache=True, nogil=True)
def local_move_uniform(C, F, W, P, state, fu, acc):
    """A local move on a leaf drawn uniformly: random-scan collapsed Gibbs (eq. 6)."""
    leaf_st = P[0]
    i = randint(state, leaf_st.shape[0])
    lw = W[15]
    lmj = W[16]
    _, a0 = _gibbs(i, C, W, P, fu[0], lw, lmj)
    K = C[8][0]
    choice = sample_log_weights(state, lw, K + 1)
    if choice == a0:
        return
    acc[LOCAL, PROPOSED] += 1.0
    acc[LOCAL, ACCEPTED] += 1.0
    _apply_move(i, choice, lmj, C, F, W, P)


@njit(cache=True, nogil=True)
def _leaf_node_in(r, i, ni, work):
    n = preorder(r, ni, work)
    for a in range(n):
        if ni[work[a], LEAF] == i:
            return work[a]
    return -1


@njit(cache=True, nogil=True)
def local_move_tree(C, F, W, P, state, fu, cfg, acc):
    """A local move on a leaf drawn through the trees, made exact (module docstring)."""
    z, _cst, _clm, cnl, _troot, act, _pos, lnode, kc = C
    leaf_st, leaf_lm, _rank, pp, _spec, _prior = P
    ni, nf, st, free, meta = F
    u = fu[0]
    D = cfg[CFG_D]
    K = kc[0]
    s = act[randint(state, K)]
    r = ensure_tree(s, C, F, W, P, u, cfg)
    v = r
    for _ in range(D):
        v, _lp = sample_sub(v, F, W, state, np.bool_(False))
    m = leaves_of(v, ni, W[0], W[4])
    i = W[4][randint(state, m)]
    lw = W[15]
    lmj = W[16]
    log_A_i, a0 = _gibbs(i, C, W, P, u, lw, lmj)
    choice = sample_log_weights(state, lw, K + 1)
    if choice == a0:
        return
    acc[LOCAL, PROPOSED] += 1.0
    alone = cnl[s] == 1
    to_new = choice == K
    Kp = K - (1 if alone else 0) + (1 if to_new else 0)
    log_w_old = -math.log(K) + log_select(r, lnode[i], D, F, W)
    # the target cluster's tree with i
    if to_new:
        Tn = make_leaf(i, leaf_st, leaf_lm, ni, nf, st, free, meta, u, pp)
        node_i = Tn
        t_slot = -1
    else:
        t_slot = act[choice]
        mm = _members(t_slot, z, W[4])
        W[4][mm] = i
        Tn = build_canonical(W[4], mm + 1, P, F, W, u, cfg)
        node_i = _leaf_node_in(Tn, i, ni, W[0])
    log_w_new = -math.log(Kp) + log_select(Tn, node_i, D, F, W)
    # could leaf j have proposed the same partition? {i, j} -> {i}, {j} or {i}, {j} -> {i, j}
    j_leaf = -1
    if cnl[s] == 2 and to_new:
        lc = ni[r, LEFT]
        j_leaf = ni[lc, LEAF] if ni[lc, LEAF] != i else ni[ni[r, RIGHT], LEAF]
    elif alone and not to_new and cnl[t_slot] == 1:
        for k in range(z.shape[0]):
            if z[k] == t_slot:
                j_leaf = k
                break
    if j_leaf >= 0:
        log_r = _pair_ratio(
            i, j_leaf, s, to_new, t_slot, r, Tn, K, Kp, log_A_i, log_w_old, log_w_new, C, F, W,
            P, u, D,
        )  # fmt: skip
    else:
        log_r = log_w_new - log_w_old
    _tally(acc[LOCAL], log_r)
    if math.log(1.0 - uniform(state)) >= log_r:
        free_tree(Tn, ni, free, meta, W[0])
        return
    acc[LOCAL, ACCEPTED] += 1.0
    t = _apply_move(i, choice, lmj, C, F, W, P)
    _attach_tree(t, Tn, C, F, W)


@njit(cache=True, nogil=True)
def _pair_ratio(i, j, s, to_new, t_slot, r, Tn, K, Kp, log_A_i, log_w_old, log_w_new, C, F, W,
                P, u, D):  # fmt: skip
    """log MH ratio of a local move that leaf j could have proposed too: with Z_x the
    normalisers of the Gibbs conditionals, (w_i(Pi') / Z_i + w_j(Pi') / Z_j) /
    (w_i(Pi) / Z_i + w_j(Pi) / Z_j), where Z_i / Z_j = phi(X_j | h_j) A_i / (phi(X_i | h_i) A_j)
    and A_x sums x's weights relative to the partition without x."""
    z, cst, clm, _cnl, _troot, act, _pos, _lnode, _kc = C
    leaf_st, leaf_lm, _rank, pp, spec, prior = P
    ni = F[0]
    scratch = W[17]
    # A_j: j joining each cluster of R, joining {i}, or alone
    lw2 = W[10]
    n2 = 0
    nj = leaf_st[j, 0]
    for b in range(K):
        t = act[b]
        if t == s or t == z[j]:
            continue
        lm = product.log_marginal_with(scratch, cst[t], leaf_st[j], 1.0, spec, prior)
        lw2[n2] = log_kappa(cst[t, 0] + nj, u, pp) - log_kappa(cst[t, 0], u, pp) + lm - clm[t]
        n2 += 1
    lm = product.log_marginal_with(scratch, leaf_st[i], leaf_st[j], 1.0, spec, prior)
    gain = log_kappa(leaf_st[i, 0] + nj, u, pp) - log_kappa(leaf_st[i, 0], u, pp)
    lw2[n2] = gain + lm - leaf_lm[i]
    lw2[n2 + 1] = log_kappa(nj, u, pp) + leaf_lm[j]
    log_A_j = logsumexp(lw2, n2 + 2)
    phi_i = log_kappa(leaf_st[i, 0], u, pp) + leaf_lm[i]
    phi_j = log_kappa(nj, u, pp) + leaf_lm[j]
    log_Zi = phi_j + log_A_i
    log_Zj = phi_i + log_A_j
    if to_new:
        # j sits with i in the two-leaf tree r now, alone afterwards
        lwj_old = -math.log(K) + log_select(r, C[7][j], D, F, W)
        lwj_new = -math.log(Kp)
    else:
        lwj_old = -math.log(K)
        node_j = ni[Tn, LEFT] if ni[ni[Tn, LEFT], LEAF] == j else ni[Tn, RIGHT]
        lwj_new = -math.log(Kp) + log_select(Tn, node_j, D, F, W)
    return logaddexp(log_w_new - log_Zi, lwj_new - log_Zj) - logaddexp(
        log_w_old - log_Zi, lwj_old - log_Zj
    )


# -------------------------------------------------------------------------------------------------
# the chain


@njit(cache=True, nogil=True)
def run(C, F, P, state, fu, cfg, n_iter, G, n_local, do_global, do_local, n_u_steps, record_from,
        thin, out_z, out_lj, out_K, out_u, acc):  # fmt: skip
    """Run ``n_iter`` tgMCMC iterations: G global moves, ``n_local`` local moves, one update of u.

    Parameters
    ----------
    C, F : the chain state of ``init_chain``, updated
    P : tuple (leaf_st (L, S), leaf_lm (L,), rank (L,) int64, pp (3,), spec, prior)
    state : uint64 ndarray of shape (1,)
    fu : ndarray of shape (1,)
        (u,), updated.
    cfg : int64 ndarray of shape (7,)
        D, max_depth, local_tree, CASCADE or SEQINSERT, StocInsert may open clusters, d of
        trees (else d_h), order redrawn every iteration (the ``CFG_*`` entries).
    n_iter, G, n_local, n_u_steps : int
    do_global, do_local : bool
    record_from, thin : int
        Iteration t >= record_from with (t - record_from) % thin == 0 keeps its labels, numbered
        by first leaf, in row (t - record_from) // thin of out_z (int64, (n_kept, L)).
    out_z, out_lj, out_K, out_u : ndarrays
        out_lj, out_K, out_u (>= n_iter,) or shorter: log p(X, Pi, u), K and u per iteration.
    acc : ndarray of shape (3, 4)
        Per move (split, merge, local): proposed, accepted, sum of min(log r, 0) over r > 0,
        number with r = 0; updated.

    Returns
    -------
    float
        log p(X, Pi, u) at the end.
    """
    leaf_st, _leaf_lm, rank, pp, spec, prior = P
    z, _cst, _clm, _cnl, _troot, act, _pos, _lnode, kc = C
    ni, _nf, _st, _free, _meta = F
    L = leaf_st.shape[0]
    W = make_workspace(L, ni.shape[0], leaf_st.shape[1])
    n_tot = 0.0
    for i in range(L):
        n_tot += leaf_st[i, 0]
    perm = np.arange(L)
    for t in range(n_iter):
        # a fresh canonical order (an exact Gibbs update of the auxiliary permutation, which the
        # target leaves uniform): every tree is rebuilt on demand
        if cfg[CFG_REDRAW] != 0 or t == 0:
            shuffle(state, perm)
            for k in range(L):
                rank[perm[k]] = k
            for a in range(kc[0]):
                _drop_tree(act[a], C, F, W)
        if do_global:
            for _ in range(G):
                global_move(C, F, W, P, state, fu, cfg, acc)
        if do_local:
            for _ in range(n_local):
                if cfg[CFG_LOCAL_TREE] != 0:
                    local_move_tree(C, F, W, P, state, fu, cfg, acc)
                else:
                    local_move_uniform(C, F, W, P, state, fu, acc)
        refresh_statistics(C, leaf_st, spec, prior)
        if pp[KIND] != DP:
            fu[0] = sample_u(state, fu[0], n_tot, float(kc[0]), pp, n_u_steps)
            # the trees' shapes and potentials were those of the old u
            for a in range(kc[0]):
                _drop_tree(act[a], C, F, W)
        if t < out_lj.shape[0]:
            out_lj[t] = log_joint(C, fu[0], pp)
            out_K[t] = kc[0]
            out_u[t] = fu[0]
        if t >= record_from and (t - record_from) % thin == 0:
            row = (t - record_from) // thin
            if row < out_z.shape[0]:
                canonical_labels(z, out_z[row])
    return log_joint(C, fu[0], pp)
