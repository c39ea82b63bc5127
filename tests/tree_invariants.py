"""Invariants of the IBHC forests and of the tree-guided MCMC chain state (``kernels.ibhc``,
``kernels.tgmcmc``): the tests' checks, not part of the product (compiled, not cached: numba
would not see a change of the kernels they call)."""

import numpy as np
from numba import njit

from kernels.arrays import add_vector, copy_vector
from kernels.ibhc import LEAF, LEFT, LM, LOGD, LOGPHI, NLEAF, PARENT, RIGHT, log_phi_h, preorder
from kernels.obs import product
from kernels.special import logaddexp


@njit
def check_tree(r, ni, nf, st, u, pp, spec, prior, work, tol):
    """Invariants of the tree rooted at r: parent links, NLEAF, statistics equal to the sum of the
    children's, LM equal to the log marginal of the statistics, potentials per eqs. 8-9 of Lee and
    Choi 2015. Returns the number of violations."""
    n = preorder(r, ni, work)
    bad = 0
    scratch = np.empty(st.shape[1])
    for k in range(n):
        v = work[k]
        if ni[v, LEAF] < 0:
            lc = ni[v, LEFT]
            rc = ni[v, RIGHT]
            if ni[lc, PARENT] != v or ni[rc, PARENT] != v:
                bad += 1
            if ni[v, NLEAF] != ni[lc, NLEAF] + ni[rc, NLEAF]:
                bad += 1
            for j in range(st.shape[1]):
                if abs(st[v, j] - st[lc, j] - st[rc, j]) > tol * (1.0 + abs(st[v, j])):
                    bad += 1
                    break
            h = log_phi_h(v, nf, st, u, pp)
            prod_lr = nf[lc, LOGPHI] + nf[rc, LOGPHI]
            if abs(nf[v, LOGPHI] - logaddexp(h, prod_lr)) > tol * (1.0 + abs(nf[v, LOGPHI])):
                bad += 1
            if abs(nf[v, LOGD] - (prod_lr - h)) > tol * (1.0 + abs(nf[v, LOGD])):
                bad += 1
        elif ni[v, NLEAF] != 1:
            bad += 1
        copy_vector(scratch, st[v])
        if abs(nf[v, LM] - product.log_marginal(scratch, spec, prior)) > tol * (
            1.0 + abs(nf[v, LM])
        ):
            bad += 1
    return bad


@njit
def check_state(C, F, P, u):
    """Invariants of the chain state: slots, labels and statistics agree; every existing tree holds
    exactly its cluster's leaves, with the leaf map pointing at them, and is consistent
    (``check_tree``). Returns the number of violations."""
    z, cst, clm, cnl, troot, act, pos, lnode, kc = C
    leaf_st, _leaf_lm, _rank, pp, spec, prior = P
    ni, nf, st, _free, _meta = F
    L, S = leaf_st.shape
    work = np.empty(4 * L + 8, dtype=np.int64)
    bad = 0
    count = np.zeros(L, dtype=np.int64)
    sums = np.zeros((L, S))
    for i in range(L):
        count[z[i]] += 1
        add_vector(sums[z[i]], leaf_st[i], 1.0)
    n_active = 0
    for s in range(L):
        if cnl[s] > 0:
            n_active += 1
            if act[pos[s]] != s:
                bad += 1
        if count[s] != cnl[s]:
            bad += 1
        for j in range(S):
            if abs(sums[s, j] - cst[s, j]) > 1e-8 * (1.0 + abs(sums[s, j])):
                bad += 1
                break
        if cnl[s] > 0:
            if abs(clm[s] - product.log_marginal(cst[s], spec, prior)) > 1e-8 * (1.0 + abs(clm[s])):
                bad += 1
            r = troot[s]
            if r >= 0:
                if ni[r, PARENT] != -1 or ni[r, NLEAF] != cnl[s]:
                    bad += 1
                bad += check_tree(r, ni, nf, st, u, pp, spec, prior, work, 1e-8)
                n = preorder(r, ni, work)
                for k in range(n):
                    v = work[k]
                    i = ni[v, LEAF]
                    if i >= 0 and (z[i] != s or lnode[i] != v):
                        bad += 1
    if n_active != kc[0]:
        bad += 1
    return bad
