"""Reference samplers over the same leaves and partition priors as tree-guided MCMC.

The marginal Gibbs sampler (Lee and Choi 2015, Section 2.2; De Bacco and Valera, Algorithm 3):
leaf i joins c proportional to kappa(|c| + n_i, u) / kappa(|c|, u) p(X_i | X_c), a new cluster
to kappa(n_i, u) p(X_i) (eq. 6). Jain and Neal's restricted Gibbs split-merge (Section 2.2):
leaves i, j sharing a cluster propose a split by a restricted scan from a launch state, else
their clusters' merge. u (NGGP) is resampled once an iteration. Slots 0..L-1: ``cst`` (L, S),
``clm`` (L,) log marginals, ``cnl`` (L,) leaves (0: free); ``z`` (L,) each leaf's slot.
"""

import math

import numpy as np
from numba import njit

from kernels.alloc import DP, KIND, log_kappa, log_prior_constant, sample_u
from kernels.arrays import add_vector, copy_vector
from kernels.obs import product
from kernels.partition import canonical_labels
from kernels.rng import randint, sample_log_weights, shuffle, uniform


@njit(cache=True, nogil=True)
def init_slots(leaf_st, z0, spec, prior):
    """The slots (z, cst, clm, cnl) of the labels z0 (L,) in 0..K-1."""
    L, S = leaf_st.shape
    z = z0.copy()
    cst = np.zeros((L, S))
    clm = np.zeros(L)
    cnl = np.zeros(L, dtype=np.int64)
    for i in range(L):
        add_vector(cst[z[i]], leaf_st[i], 1.0)
        cnl[z[i]] += 1
    for k in range(L):
        if cnl[k] > 0:
            clm[k] = product.log_marginal(cst[k], spec, prior)
    return z, cst, clm, cnl


@njit(cache=True, nogil=True)
def refresh_statistics(z, cst, clm, cnl, leaf_st, spec, prior):
    """Recompute the statistics and log marginals of the occupied slots from their leaves."""
    for k in range(cnl.shape[0]):
        if cnl[k] > 0:
            cst[k, :] = 0.0
    for i in range(z.shape[0]):
        add_vector(cst[z[i]], leaf_st[i], 1.0)
    for k in range(cnl.shape[0]):
        if cnl[k] > 0:
            clm[k] = product.log_marginal(cst[k], spec, prior)


@njit(cache=True, nogil=True)
def log_joint(cst, clm, cnl, u, pp):
    """log p(X, Pi, u) (the CRP with u integrated out for the DP)."""
    n = 0.0
    out = 0.0
    for k in range(cnl.shape[0]):
        if cnl[k] > 0:
            n += cst[k, 0]
            out += log_kappa(cst[k, 0], u, pp) + clm[k]
    return out + log_prior_constant(n, u, pp)


@njit(cache=True, nogil=True)
def n_clusters(cnl):
    K = 0
    for k in range(cnl.shape[0]):
        if cnl[k] > 0:
            K += 1
    return K


@njit(cache=True, nogil=True)
def gibbs_sweep(order, z, cst, clm, cnl, leaf_st, leaf_lm, u, pp, spec, prior, state):
    """One collapsed Gibbs scan over the leaves in ``order`` (eq. 6), O(L K) log marginals."""
    L = leaf_st.shape[0]
    S = leaf_st.shape[1]
    act = np.empty(L, dtype=np.int64)
    nact = 0
    for k in range(L):
        if cnl[k] > 0:
            act[nact] = k
            nact += 1
    lw = np.empty(L + 1)
    lmj = np.empty(L + 1)
    scratch = np.empty(S)
    for t in range(order.shape[0]):
        i = order[t]
        s0 = z[i]
        ni = leaf_st[i, 0]
        alone = cnl[s0] == 1
        pos0 = -1
        for a in range(nact):
            k = act[a]
            if k == s0:
                pos0 = a
                if alone:
                    lw[a] = log_kappa(ni, u, pp) + leaf_lm[i]
                else:
                    lmj[a] = product.log_marginal_with(
                        scratch, cst[k], leaf_st[i], -1.0, spec, prior
                    )
                    lw[a] = (
                        log_kappa(cst[k, 0], u, pp)
                        + clm[k]
                        - log_kappa(cst[k, 0] - ni, u, pp)
                        - lmj[a]
                    )
                continue
            lmj[a] = product.log_marginal_with(scratch, cst[k], leaf_st[i], 1.0, spec, prior)
            lw[a] = log_kappa(cst[k, 0] + ni, u, pp) - log_kappa(cst[k, 0], u, pp) + lmj[a] - clm[k]
        lw[nact] = -np.inf if alone else log_kappa(ni, u, pp) + leaf_lm[i]
        choice = sample_log_weights(state, lw, nact + 1)
        if choice == pos0:
            continue
        if choice == nact:
            target = -1
            for k in range(L):
                if cnl[k] == 0:
                    target = k
                    break
            copy_vector(cst[target], leaf_st[i])
            clm[target] = leaf_lm[i]
            act[nact] = target
            nact += 1
        else:
            target = act[choice]
            add_vector(cst[target], leaf_st[i], 1.0)
            clm[target] = lmj[choice]
        cnl[target] += 1
        z[i] = target
        # remove i from s0
        if alone:
            cnl[s0] = 0
            cst[s0, :] = 0.0
            clm[s0] = 0.0
            act[pos0] = act[nact - 1]
            nact -= 1
        else:
            add_vector(cst[s0], leaf_st[i], -1.0)
            clm[s0] = lmj[pos0]
            cnl[s0] -= 1


@njit(cache=True, nogil=True)
def _restricted_scan(
    Sidx, m, side, stA, stB, lmAB, leaf_st, u, pp, spec, prior, state, forced, target
):
    """One restricted Gibbs scan of Sidx[:m] between A (side 0) and B (1), stA, stB and lmAB
    kept current (``forced``: to target[leaf]); returns the assignments' log probability."""
    S = leaf_st.shape[1]
    tmp = np.empty(S)
    log_q = 0.0
    for a in range(m):
        k = Sidx[a]
        nk = leaf_st[k, 0]
        # remove k from its side
        if side[k] == 0:
            lm_with_A = lmAB[0]
            stA -= leaf_st[k]
            lm_wo_A = product.log_marginal(stA, spec, prior)
            lm_wo_B = lmAB[1]
            lm_with_B = product.log_marginal_with(tmp, stB, leaf_st[k], 1.0, spec, prior)
        else:
            lm_with_B = lmAB[1]
            stB -= leaf_st[k]
            lm_wo_B = product.log_marginal(stB, spec, prior)
            lm_wo_A = lmAB[0]
            lm_with_A = product.log_marginal_with(tmp, stA, leaf_st[k], 1.0, spec, prior)
        nA = stA[0]
        nB = stB[0]
        wA = log_kappa(nA + nk, u, pp) - log_kappa(nA, u, pp) + lm_with_A - lm_wo_A
        wB = log_kappa(nB + nk, u, pp) - log_kappa(nB, u, pp) + lm_with_B - lm_wo_B
        mx = max(wA, wB)
        lse = mx + math.log(math.exp(wA - mx) + math.exp(wB - mx))
        if forced:
            new_side = target[k]
        else:
            new_side = 0 if math.log(1.0 - uniform(state)) < wA - lse else 1
        if new_side == 0:
            log_q += wA - lse
            stA += leaf_st[k]
            lmAB[0] = lm_with_A
            lmAB[1] = lm_wo_B
        else:
            log_q += wB - lse
            stB += leaf_st[k]
            lmAB[0] = lm_wo_A
            lmAB[1] = lm_with_B
        side[k] = new_side
    return log_q


@njit(cache=True, nogil=True, inline="always")
def _accept_split(z, cst, clm, cnl, i, si, Sidx, m, side, stA, stB, lmAB):
    """si splits: i and the side-0 leaves to a free row (stA), the rest stay (stB)."""
    new = -1
    for k in range(z.shape[0]):
        if cnl[k] == 0:
            new = k
            break
    copy_vector(cst[new], stA)
    clm[new] = lmAB[0]
    copy_vector(cst[si], stB)
    clm[si] = lmAB[1]
    z[i] = new
    cnl[new] = 1
    cnl[si] = 1
    for a in range(m):
        k = Sidx[a]
        if side[k] == 0:
            z[k] = new
            cnl[new] += 1
        else:
            cnl[si] += 1


@njit(cache=True, nogil=True, inline="always")
def _accept_merge(z, cst, clm, cnl, si, sj, stM, lm_m):
    """Clusters si and sj merge into si (statistics stM, log marginal lm_m)."""
    copy_vector(cst[si], stM)
    clm[si] = lm_m
    cnl[si] += cnl[sj]
    cnl[sj] = 0
    cst[sj, :] = 0.0
    clm[sj] = 0.0
    for k in range(z.shape[0]):
        if z[k] == sj:
            z[k] = si


@njit(cache=True, nogil=True)
def split_merge_move(z, cst, clm, cnl, leaf_st, leaf_lm, u, pp, spec, prior, state, n_launch, acc):
    """One Jain-Neal split-merge move after ``n_launch`` restricted scans; acc (3, 4) as in
    ``kernels.tgmcmc.run``."""
    L, _S = leaf_st.shape
    if L < 2:
        return
    i = randint(state, L)
    j = randint(state, L - 1)
    if j >= i:
        j += 1
    si = z[i]
    sj = z[j]
    Sidx = np.empty(L, dtype=np.int64)
    m = 0
    for k in range(L):
        if k != i and k != j and (z[k] == si or z[k] == sj):
            Sidx[m] = k
            m += 1
    side = np.zeros(L, dtype=np.int64)
    stA = leaf_st[i].copy()
    stB = leaf_st[j].copy()
    for a in range(m):
        k = Sidx[a]
        if uniform(state) < 0.5:
            side[k] = 0
            stA += leaf_st[k]
        else:
            side[k] = 1
            stB += leaf_st[k]
    lmAB = np.empty(2)
    lmAB[0] = product.log_marginal(stA, spec, prior)
    lmAB[1] = product.log_marginal(stB, spec, prior)
    for _ in range(n_launch):
        _restricted_scan(
            Sidx, m, side, stA, stB, lmAB, leaf_st, u, pp, spec, prior, state, False, side
        )
    if si == sj:
        log_q = _restricted_scan(
            Sidx, m, side, stA, stB, lmAB, leaf_st, u, pp, spec, prior, state, False, side
        )
        log_pi = (
            log_kappa(stA[0], u, pp)
            + lmAB[0]
            + log_kappa(stB[0], u, pp)
            + lmAB[1]
            - log_kappa(cst[si, 0], u, pp)
            - clm[si]
        )
        log_r = log_pi - log_q
        acc[0, 0] += 1.0
        acc[0, 2] += min(log_r, 0.0)
        if math.log(1.0 - uniform(state)) < log_r:
            acc[0, 1] += 1.0
            _accept_split(z, cst, clm, cnl, i, si, Sidx, m, side, stA, stB, lmAB)
    else:
        target = np.zeros(L, dtype=np.int64)
        for a in range(m):
            k = Sidx[a]
            target[k] = 0 if z[k] == si else 1
        log_q_rev = _restricted_scan(
            Sidx, m, side, stA, stB, lmAB, leaf_st, u, pp, spec, prior, state, True, target
        )
        stM = cst[si] + cst[sj]
        lm_m = product.log_marginal(stM, spec, prior)
        log_pi = (
            log_kappa(stM[0], u, pp)
            + lm_m
            - log_kappa(cst[si, 0], u, pp)
            - clm[si]
            - log_kappa(cst[sj, 0], u, pp)
            - clm[sj]
        )
        log_r = log_pi + log_q_rev
        acc[1, 0] += 1.0
        acc[1, 2] += min(log_r, 0.0)
        if math.log(1.0 - uniform(state)) < log_r:
            acc[1, 1] += 1.0
            _accept_merge(z, cst, clm, cnl, si, sj, stM, lm_m)


@njit(cache=True, nogil=True)
def run(
    z, cst, clm, cnl, leaf_st, leaf_lm, state, fu, pp, spec, prior, n_iter, n_sm, n_launch,
    do_gibbs, n_u_steps, record_from, thin, out_z, out_lj, out_K, out_u, acc,
):  # fmt: skip
    """``n_iter`` iterations: ``n_sm`` split-merge moves, a Gibbs scan in random order if
    ``do_gibbs``, an update of u; arguments as ``kernels.tgmcmc.run``. Returns log p(X, Pi, u)."""
    L = leaf_st.shape[0]
    order = np.arange(L)
    n_tot = 0.0
    for i in range(L):
        n_tot += leaf_st[i, 0]
    for t in range(n_iter):
        u = fu[0]
        for _ in range(n_sm):
            split_merge_move(
                z, cst, clm, cnl, leaf_st, leaf_lm, u, pp, spec, prior, state, n_launch, acc
            )
        if do_gibbs:
            shuffle(state, order)
            gibbs_sweep(order, z, cst, clm, cnl, leaf_st, leaf_lm, u, pp, spec, prior, state)
        refresh_statistics(z, cst, clm, cnl, leaf_st, spec, prior)
        if pp[KIND] != DP:
            u = sample_u(state, u, n_tot, float(n_clusters(cnl)), pp, n_u_steps)
            fu[0] = u
        if t < out_lj.shape[0]:
            out_lj[t] = log_joint(cst, clm, cnl, u, pp)
            out_K[t] = n_clusters(cnl)
            out_u[t] = u
        if t >= record_from and (t - record_from) % thin == 0:
            row = (t - record_from) // thin
            if row < out_z.shape[0]:
                canonical_labels(z, out_z[row])
    return log_joint(cst, clm, cnl, fu[0], pp)
