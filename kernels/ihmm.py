"""The infinite hidden Markov model (HDP-HMM) in its direct-assignment form (Raykov et al. 2016,
Section 6).

The states z and global weights kappa are kept, emission parameters and transition matrix
integrated out; emissions are any ``kernels.obs.product`` model (a state is a statistics and a
cache row). Sequences are stored one after another, sequence s is ``X[starts[s]:starts[s + 1]]``.
A fit's states are *slots* (capacity ``cap``, free where ``nk == 0``): ``stats`` (cap, S),
``cache`` (cap, C), ``nk`` (cap,); ``trans`` (cap, cap), N_pk the transitions p -> k; ``start``
(cap,), transitions from a sequence's start (a row like the others); ``rows`` (cap,),
N_p. = sum_k N_pk; ``kappa`` (cap,) and ``ku`` (1,), the weights and the unrepresented mass.

The MAP objective (``objective``) is E(z, kappa) = -log p(X, z, kappa, K):

    -sum_k log p(X_k)
    - sum_rows [log Gamma(N0) - log Gamma(N0 + N_p.)
                + sum_k log Gamma(N0 kappa_k + N_pk) - log Gamma(N0 kappa_k)]
    - K log M0 - (M0 - 1) log kappa_{K+1}

the emission marginals (eq. 6.4), the transitions with the matrix integrated out (rows
Dirichlet-multinomial, eq. 6.5), and kappa | K ~ Dirichlet(1, ..., 1, M0) with P(K) proportional
to M0^K Gamma(M0) / Gamma(M0 + K) (the top-level sticks without size-biased order), whose mode
given the table counts is eq. 6.6's; under the top-level DP's own measure opening a state would
cost nothing for its weight.

``sweep`` moves each x_t to the state of least q_{t,k} = -log p(x_t | X_{k,-t}) (eq. 6.4)
- log p(z_t = k | z_-t, kappa) (eq. 6.5). For MAP each q_{t,k} is the exact change of
``objective``: a new state takes b kappa_u (b = ``b_new_of(M0)``), q_{t,K+1} = -log p(x_t)
- log(N0 b kappa_u kappa_{z_{t+1}}) - log M0 - (M0 - 1) log(1 - b), and a record alone may stay.
The Gibbs sweep is Teh et al.'s direct-assignment step, a new state splitting kappa_u by
b ~ Beta(1, M0). Tempered emissions (w = ``temper`` < 1): log p(w S_k), the power likelihood's
conjugate marginal, with ``tempered_log_predictive`` for the predictive.
"""

import math

import numpy as np
from numba import njit

from kernels.arrays import copy_rows, copy_vector
from kernels.mapdp import _free_slot
from kernels.obs import gaussian_nw, product
from kernels.rng import sample_log_weights, uniform
from kernels.special import digamma, logsumexp


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk, trans, start, rows, kappa, lmw, sw):
    new = max(2 * stats.shape[0], 8)
    s2 = np.zeros((new, stats.shape[1]))
    c2 = np.zeros((new, cache.shape[1]))
    w2 = np.zeros((new, sw.shape[1]))
    t2 = np.zeros((new, new))
    n2, st2, r2, k2, l2 = np.zeros(new), np.zeros(new), np.zeros(new), np.zeros(new), np.zeros(new)
    copy_rows(s2, stats)
    copy_rows(c2, cache)
    copy_rows(w2, sw)
    copy_rows(t2, trans)
    for v2, v in ((n2, nk), (st2, start), (r2, rows), (k2, kappa), (l2, lmw)):
        copy_vector(v2, v)
    return s2, c2, n2, t2, st2, r2, k2, l2, w2


@njit(cache=True, nogil=True, inline="always")
def _link(a, k, trans, start, rows, w):
    """Add (w = 1) or remove (w = -1) the transition a -> k; a = -1 is the start of a sequence."""
    if a < 0:
        start[k] += w
    else:
        trans[a, k] += w
        rows[a] += w


@njit(cache=True, nogil=True, inline="always")
def _move(x, k, a, c, stats, cache, nk, trans, start, rows, spec, prior, w):
    """Add (w = 1) or remove (w = -1) record x, between neighbours a and c (-1: none), to or
    from state k."""
    product.update(x, stats[k], cache[k], spec, prior, w)
    nk[k] += w
    _link(a, k, trans, start, rows, w)
    if c >= 0:
        _link(k, c, trans, start, rows, w)


@njit(cache=True, nogil=True)
def _move_tempered(
    gauss, x, k, a, c, stats, sw, cache, nk, trans, start, rows, spec, prior, sign, w
):
    """``_move`` in a tempered sweep of one full-covariance group: the statistics change by
    sign g(x), the weighted statistics sw[k] and their cache cache[k] by sign w g(x) (a rank-one
    change of eq. B.1, Raykov et al. 2016: ``gaussian_nw.update``); ``gauss``:
    ``product.gauss_paths``, whose None compiles nothing."""
    if gauss is not None:
        product.add_stats(x, stats[k], spec, sign)
        gaussian_nw.update(x, sw[k], cache[k], prior, sign * w)
        nk[k] += sign
        _link(a, k, trans, start, rows, sign)
        if c >= 0:
            _link(k, c, trans, start, rows, sign)


@njit(cache=True, nogil=True)
def _cached_tempering(gauss, spec, prior, d):
    """Whether a tempered predictive reads a cache of the weighted statistics: one Normal-Wishart
    group without cells, on an int32 spec (``gauss``: ``product.gauss_paths``)."""
    if gauss is None:
        return False
    one_nw = spec.shape[0] == 1 and spec[0, product.CODE] == product.GAUSSIAN_NW
    return one_nw and not gaussian_nw.has_cells(prior, d)


@njit(cache=True, nogil=True)
def _tempered_caches(gauss, stats, sw, cache, lmw, n_slots, prior, w, d):
    """The slots' weighted statistics w S_k (sw), their caches and ``tempered_constant`` (lmw)
    for ``_move_tempered``'s sweep; ``gauss`` as there."""
    if gauss is not None:
        for k in range(n_slots):
            for j in range(stats.shape[1]):
                sw[k, j] = w * stats[k, j]
            gaussian_nw.refresh(sw[k], cache[k], prior)
            lmw[k] = gaussian_nw.tempered_constant(cache[k], d, w)


@njit(cache=True, nogil=True)
def log_transition_gain(a, k, c, trans, start, rows, kappa, alpha):
    """log (N_{a k} + N0 kappa_k) (N_{k c} + N0 kappa_c + [a = k = c]) / (N_k. + N0 + [a = k]),
    eq. 6.5 of z_t = k between a and c (-1: the sequence's start or end) without 1 / (N_a. + N0)."""
    n_in = start[k] if a < 0 else trans[a, k]
    out = math.log(n_in + alpha * kappa[k])
    if c >= 0:
        same = 1.0 if a == k else 0.0
        both = 1.0 if (a == k and c == k) else 0.0
        out += math.log(trans[k, c] + alpha * kappa[c] + both) - math.log(rows[k] + alpha + same)
    return out


@njit(cache=True, nogil=True)
def b_new_of(gamma):
    """The share of kappa_{K+1} a state opened by a MAP sweep takes: 1 / M0 minimises its cost
    b (1 - b)^(M0 - 1); 1/2 for M0 <= 1."""
    return 1.0 / gamma if gamma > 1.0 else 0.5


@njit(cache=True, nogil=True, inline="always")
def _costs(
    costs, x, a, c, k_alone, stats, cache, nk, trans, start, rows, kappa, ku, lmw, scratch,
    empty_s, empty_c, n_slots, spec, prior, alpha, gamma, log_ag, gibbs, w, fast, lm0,
):  # fmt: skip
    """costs: q_{t,k} of x for the slots k < n_slots, then a new state; inf for a free slot but
    ``k_alone`` (x's emptied state, which MAP may restore) and for a new one in its place.
    ``fast``: a tempered sweep of one full-covariance group (``sweep``), lm0 the empty state's
    ``gaussian_nw.tempered_constant``."""
    if fast:
        lp0 = gaussian_nw.tempered_log_predictive(x, empty_c, w, lm0)
    elif w != 1.0:
        lp0 = tempered_log_predictive(x, empty_s, 0.0, scratch, spec, prior, w)
    else:
        lp0 = product.log_predictive(x, empty_s, empty_c, spec, prior)
    for k in range(n_slots):
        if nk[k] > 0.0:
            if fast:
                lp = gaussian_nw.tempered_log_predictive(x, cache[k], w, lmw[k])
            elif w != 1.0:
                lp = tempered_log_predictive(x, stats[k], lmw[k], scratch, spec, prior, w)
            else:
                lp = product.log_predictive(x, stats[k], cache[k], spec, prior)
            costs[k] = -lp - log_transition_gain(a, k, c, trans, start, rows, kappa, alpha)
        elif k == k_alone:
            # stay alone: restoring the state's weight kappa_k (top-level measure)
            g = log_transition_gain(a, k, c, trans, start, rows, kappa, alpha) + math.log(gamma)
            if gamma != 1.0:
                g += (gamma - 1.0) * (math.log(ku[0]) - math.log(ku[0] + kappa[k]))
            costs[k] = -lp0 - g
        else:
            costs[k] = np.inf
    costs[n_slots] = -lp0 - (math.log(kappa[c]) if c >= 0 else 0.0)
    if gibbs:
        costs[n_slots] -= math.log(alpha) + math.log(ku[0])
    elif k_alone >= 0:
        # a new state in place of the one being emptied differs from staying only in its share
        # of kappa_u: the kappa step decides that
        costs[n_slots] = np.inf
    else:
        costs[n_slots] -= log_ag + math.log(ku[0])


@njit(cache=True, nogil=True, inline="always")
def _choose(costs, k0, n_slots, gibbs, state):
    """x's slot (n_slots: new): a draw from exp(-costs), or the argmin with ties to k0."""
    if gibbs:
        for k in range(n_slots + 1):
            costs[k] = -costs[k]
        return sample_log_weights(state, costs, n_slots + 1)
    best = k0 if k0 >= 0 else n_slots
    if best == n_slots and costs[n_slots] == np.inf:
        best = 0
    for k in range(n_slots + 1):
        if costs[k] < costs[best]:
            best = k
    return best


@njit(cache=True, nogil=True)
def sweep(
    X, starts, z, slots, ku, n_slots, spec, prior, empty_c, alpha, gamma, gibbs, state, n_fixed, w
):
    """One sweep over every step of every sequence: the argmin of eq. 6.7 (MAP-iHMM, Section
    6.2) or, with ``gibbs``, a draw from eq. 6.3; records with z = -1 are in no state yet.

    Parameters
    ----------
    X : ndarray of shape (N, D)
        Records of all sequences; ``starts`` (n_seq + 1,) int64, the offsets.
    z : ndarray of shape (N,), int64
        State slot of each record, -1 if none; updated.
    slots : tuple
        (stats, cache, nk, trans, start, rows, kappa), ``n_slots`` in use; ku (1,) updated.
    spec, prior, empty_c : the observation model and the empty statistics' cache
    alpha, gamma : float
        N0 (transitions) and M0 (top level).
    gibbs : bool, with ``state`` (1,) uint64, the RNG state of its draws
    n_fixed : int
        Slots below it are never reused for a new state (a chunk's copy of the global ones).
    w : float in (0, 1]
        Each record's emission weight (``tempered_log_predictive``; 1: the caches').

    Returns
    -------
    stats, cache, nk, trans, start, rows, kappa : ndarrays, reallocated when slots ran out; a
        tempered sweep of one full-covariance group returns the caches of w S_k
    n_slots, n_changed : int
        Slots in use, and records whose state changed.
    """
    stats, cache, nk, trans, start, rows, kappa = slots
    costs = np.empty(stats.shape[0] + 2)
    empty_s = np.zeros(stats.shape[1])
    scratch = np.empty(stats.shape[1])
    d = X.shape[1]
    # tempered, one full-covariance group: each slot keeps w S_k (sw) and its cache (in cache),
    # so that a predictive is O(d^2) and a move a rank-one change; otherwise a tempered
    # predictive is a ratio of log marginals, a Cholesky factor each (3.4 times the sweep's time
    # on 6 columns)
    gauss = product.gauss_paths(spec)
    fast = w != 1.0 and _cached_tempering(gauss, spec, prior, d)
    sw = np.zeros((stats.shape[0], stats.shape[1] if fast else 0))
    # log p(w S_k) of every slot (fast: its ``gaussian_nw.tempered_constant``), kept up to date
    # as records move (tempered sweeps only)
    lmw = np.zeros(stats.shape[0])
    lm0 = gaussian_nw.tempered_constant(empty_c, d, w) if fast else 0.0
    if fast:
        _tempered_caches(gauss, stats, sw, cache, lmw, n_slots, prior, w, d)
    for k in range(n_slots if w != 1.0 and not fast else 0):
        lmw[k] = tempered_log_marginal(stats[k], scratch, spec, prior, w)
    b_new = b_new_of(gamma)
    log_ag = math.log(alpha * b_new) + math.log(gamma) + (gamma - 1.0) * math.log1p(-b_new)
    n_changed = 0
    for s in range(starts.shape[0] - 1):
        for t in range(starts[s], starts[s + 1]):
            x, k0 = X[t], z[t]
            a = z[t - 1] if t > starts[s] else -1
            c = z[t + 1] if t + 1 < starts[s + 1] else -1
            alone = False
            if k0 >= 0:
                if fast:
                    _move_tempered(
                        gauss, x, k0, a, c, stats, sw, cache, nk, trans, start, rows, spec, prior,
                        -1.0, w,
                    )  # fmt: skip
                else:
                    _move(x, k0, a, c, stats, cache, nk, trans, start, rows, spec, prior, -1.0)
                if nk[k0] == 0.0:
                    stats[k0, :] = 0.0
                    sw[k0, :] = 0.0
                    copy_vector(cache[k0], empty_c)
                    alone = True
                    if gibbs:
                        ku[0] += kappa[k0]
                        kappa[k0] = 0.0
                if fast:
                    lmw[k0] = gaussian_nw.tempered_constant(cache[k0], d, w)
                elif w != 1.0:
                    lmw[k0] = tempered_log_marginal(stats[k0], scratch, spec, prior, w)
            if costs.shape[0] < n_slots + 2:
                costs = np.empty(2 * n_slots + 2)
            k_alone = k0 if alone and not gibbs else -1
            _costs(
                costs, x, a, c, k_alone, stats, cache, nk, trans, start, rows, kappa, ku, lmw,
                scratch, empty_s, empty_c, n_slots, spec, prior, alpha, gamma, log_ag, gibbs, w,
                fast, lm0,
            )  # fmt: skip
            best = _choose(costs, k0, n_slots, gibbs, state)
            if best == n_slots:
                free = _free_slot(nk, n_slots, n_fixed, k_alone)
                if free < 0:
                    if n_slots == stats.shape[0]:
                        stats, cache, nk, trans, start, rows, kappa, lmw, sw = _grow(
                            stats, cache, nk, trans, start, rows, kappa, lmw, sw
                        )
                    free = n_slots
                    n_slots += 1
                # b ~ Beta(1, M0) by inversion for the Gibbs sweep
                b = 1.0 - uniform(state) ** (1.0 / gamma) if gibbs else b_new
                kappa[free] = b * ku[0]
                ku[0] *= 1.0 - b
                stats[free, :] = 0.0
                sw[free, :] = 0.0
                copy_vector(cache[free], empty_c)
                best = free
            if k_alone >= 0 and best != k0:
                ku[0] += kappa[k0]
                kappa[k0] = 0.0
            if fast:
                _move_tempered(
                    gauss, x, best, a, c, stats, sw, cache, nk, trans, start, rows, spec, prior,
                    1.0, w,
                )  # fmt: skip
                lmw[best] = gaussian_nw.tempered_constant(cache[best], d, w)
            else:
                _move(x, best, a, c, stats, cache, nk, trans, start, rows, spec, prior, 1.0)
                if w != 1.0:
                    lmw[best] = tempered_log_marginal(stats[best], scratch, spec, prior, w)
            if best != k0:
                n_changed += 1
            z[t] = best
    return stats, cache, nk, trans, start, rows, kappa, n_slots, n_changed


@njit(cache=True, nogil=True)
def log_transitions(trans, start, rows, kappa, ku, nk, alpha, gamma):
    """log p(z | kappa) + log p(kappa, K), ``objective``'s transition and kappa terms over the
    states with nk > 0; trans (K, K), start, rows, kappa, nk (K,), ku, alpha, gamma floats."""
    K = nk.shape[0]
    out = 0.0
    lga = math.lgamma(alpha)
    n_start = 0.0
    for k in range(K):
        n_start += start[k]
    for p in range(-1, K):
        n_p = n_start if p < 0 else rows[p]
        if n_p == 0.0:
            continue
        out += lga - math.lgamma(alpha + n_p)
        for k in range(K):
            n = start[k] if p < 0 else trans[p, k]
            if n > 0.0:
                a = alpha * kappa[k]
                out += math.lgamma(a + n) - math.lgamma(a)
    n_states = 0
    for k in range(K):
        if nk[k] > 0.0:
            n_states += 1
    out += n_states * math.log(gamma)
    if gamma != 1.0:
        out += (gamma - 1.0) * math.log(ku)
    return out


@njit(cache=True, nogil=True)
def objective(stats, nk, trans, start, rows, kappa, ku, spec, prior, alpha, gamma):
    """E(z, kappa) of MAP-iHMM (module docstring; Section 6.2) from stats (K, S) and
    ``log_transitions``' arguments."""
    out = 0.0
    for k in range(stats.shape[0]):
        if nk[k] > 0.0:
            out -= product.log_marginal(stats[k], spec, prior)
    return out - log_transitions(trans, start, rows, kappa, ku, nk, alpha, gamma)


@njit(cache=True, nogil=True)
def count_transitions(z, starts, K):
    """(trans (K, K), start (K,), rows (K,)) of the states z (N,) 0..K-1 of the sequences at
    starts (n_seq + 1,); -1 counts no transition."""
    trans = np.zeros((K, K))
    start = np.zeros(K)
    rows = np.zeros(K)
    for s in range(starts.shape[0] - 1):
        t0 = starts[s]
        t1 = starts[s + 1]
        if t1 <= t0:
            continue
        if z[t0] >= 0:
            start[z[t0]] += 1.0
        for t in range(t0 + 1, t1):
            if z[t - 1] >= 0 and z[t] >= 0:
                trans[z[t - 1], z[t]] += 1.0
                rows[z[t - 1]] += 1.0
    return trans, start, rows


@njit(cache=True, nogil=True)
def emission_matrix(X, stats, cache, spec, prior, empty_c):
    """(N, K + 1): log p(x_t | X_k) of X (N, D) under stats (K, S) and cache (K, C), then log
    p(x_t) (eq. 6.4's predictive)."""
    N = X.shape[0]
    K = stats.shape[0]
    out = np.empty((N, K + 1))
    empty_s = np.zeros(stats.shape[1])
    for t in range(N):
        for k in range(K):
            out[t, k] = product.log_predictive(X[t], stats[k], cache[k], spec, prior)
        out[t, K] = product.log_predictive(X[t], empty_s, empty_c, spec, prior)
    return out


@njit(cache=True, nogil=True)
def tempered_log_predictive(x, s, lm_s, scratch, spec, prior, temper):
    """log p(w (S_k + g(x))) - log p(w S_k) of x (D,) joining the state of unweighted
    statistics s (S,), w = ``temper``, lm_s = log p(w S_k); scratch (S,)."""
    for j in range(s.shape[0]):
        scratch[j] = temper * s[j]
    product.add_stats(x, scratch, spec, temper)
    return product.log_marginal(scratch, spec, prior) - lm_s


@njit(cache=True, nogil=True)
def tempered_log_marginal(s, scratch, spec, prior, temper):
    """log p(w S_k) of the statistics s (S,)."""
    for j in range(s.shape[0]):
        scratch[j] = temper * s[j]
    return product.log_marginal(scratch, spec, prior)


@njit(cache=True, nogil=True)
def emission_matrix_tempered(X, stats, spec, prior, temper):
    """``emission_matrix`` (N, K + 1) with ``tempered_log_predictive``; one full-covariance
    Normal-Wishart group without cells by ``gaussian_nw.tempered_log_predictive`` (the same value
    from the weighted statistics' caches; Raykov et al. 2016, eq. B.1)."""
    N = X.shape[0]
    K = stats.shape[0]
    S = stats.shape[1]
    out = np.empty((N, K + 1))
    scratch = np.empty(S)
    d = X.shape[1]
    gauss = product.gauss_paths(spec)
    if _cached_tempering(gauss, spec, prior, d):
        # one full-covariance group: a cache per state of its weighted statistics gives every
        # predictive in O(d^2), where a ratio of log marginals costs a Cholesky factor (7 times
        # the time on 6 columns); row K, no statistics, is a new state's
        padded = np.zeros((K + 1, S))
        copy_rows(padded, stats)
        cache = np.empty((K + 1, spec[0, product.NCACHE]))
        const = np.empty(K + 1)
        _tempered_caches(gauss, padded, np.empty((K + 1, S)), cache, const, K + 1, prior, temper, d)
        for t in range(N):
            for k in range(K + 1):
                out[t, k] = gaussian_nw.tempered_log_predictive(X[t], cache[k], temper, const[k])
        return out
    empty_s = np.zeros(S)
    lm = np.empty(K)
    for k in range(K):
        lm[k] = tempered_log_marginal(stats[k], scratch, spec, prior, temper)
    for t in range(N):
        for k in range(K):
            out[t, k] = tempered_log_predictive(X[t], stats[k], lm[k], scratch, spec, prior, temper)
        out[t, K] = tempered_log_predictive(X[t], empty_s, 0.0, scratch, spec, prior, temper)
    return out


@njit(cache=True, nogil=True)
def forward_steps(log_b, starts, log_pi, log_a):
    """log p(x_t | x_1..x_{t-1}) (N,) of every step by the forward algorithm, each alpha_t
    normalised by its sum, the step's term.

    Parameters
    ----------
    log_b : ndarray of shape (N, K)
        Emission log densities.
    starts : ndarray of shape (n_seq + 1,), int64
    log_pi : ndarray of shape (K,)
        Initial-state log probabilities.
    log_a : ndarray of shape (K, K)
        Transition log probabilities, rows summing to 1.

    """
    K = log_pi.shape[0]
    out = np.empty(log_b.shape[0])
    prev, cur, tmp = np.empty((3, K))
    for s in range(starts.shape[0] - 1):
        t0 = starts[s]
        t1 = starts[s + 1]
        if t1 <= t0:
            continue
        for k in range(K):
            prev[k] = log_pi[k] + log_b[t0, k]
        norm = logsumexp(prev, K)
        out[t0] = norm
        for k in range(K):
            prev[k] -= norm
        for t in range(t0 + 1, t1):
            for k in range(K):
                for j in range(K):
                    tmp[j] = prev[j] + log_a[j, k]
                cur[k] = logsumexp(tmp, K) + log_b[t, k]
            norm = logsumexp(cur, K)
            out[t] = norm
            for k in range(K):
                prev[k] = cur[k] - norm
    return out


@njit(cache=True, nogil=True)
def viterbi(log_b, starts, log_pi, log_a):
    """The most probable state path of each sequence (Viterbi), and its log joint probability.

    Parameters
    ----------
    As ``forward_steps``.

    Returns
    -------
    path : ndarray of shape (N,), int64
    best : ndarray of shape (n_seq,)
        max over paths of log p(x, z) of each sequence.
    """
    N = log_b.shape[0]
    K = log_pi.shape[0]
    n_seq = starts.shape[0] - 1
    path = np.empty(N, dtype=np.int64)
    best = np.empty(n_seq)
    back = np.empty((N, K), dtype=np.int64)
    prev = np.empty(K)
    cur = np.empty(K)
    for s in range(n_seq):
        t0 = starts[s]
        t1 = starts[s + 1]
        for k in range(K):
            prev[k] = log_pi[k] + log_b[t0, k]
        for t in range(t0 + 1, t1):
            for k in range(K):
                arg = 0
                m = prev[0] + log_a[0, k]
                for j in range(1, K):
                    v = prev[j] + log_a[j, k]
                    if v > m:
                        m = v
                        arg = j
                back[t, k] = arg
                cur[k] = m + log_b[t, k]
            copy_vector(prev, cur)
        arg = 0
        for k in range(1, K):
            if prev[k] > prev[arg]:
                arg = k
        best[s] = prev[arg]
        path[t1 - 1] = arg
        for t in range(t1 - 1, t0, -1):
            path[t - 1] = back[t, path[t]]
    return path, best


@njit(cache=True, nogil=True)
def table_counts(trans, start, kappa, alpha, state, urn):
    """M_k (K,), the tables serving state k (Section 6.1): with ``urn`` drawn by eq. 6.2's Polya
    urn (RNG ``state``, uint64 (1,)), else the mean sum_p sum_{j < N_pk} a / (a + j),
    a = N0 kappa_k (a (psi(a + N) - psi(a)) from 1000 on); trans (K, K), start, kappa (K,)."""
    K = kappa.shape[0]
    M = np.zeros(K)
    for p in range(-1, K):
        for k in range(K):
            n = start[k] if p < 0 else trans[p, k]
            if n <= 0.0:
                continue
            a = alpha * kappa[k]
            if urn:
                for j in range(int(n)):
                    if uniform(state) * (a + j) < a:
                        M[k] += 1.0
            elif n < 1000.0:
                acc = 0.0
                for j in range(int(n)):
                    acc += a / (a + j)
                M[k] += acc
            else:
                M[k] += a * (digamma(a + n) - digamma(a))
    return M


@njit(cache=True, nogil=True)
def _row_term(n_row, counts, kappa, alpha, K):
    """One row's Dirichlet-multinomial term of ``log_transitions``."""
    if n_row == 0.0:
        return 0.0
    out = math.lgamma(alpha) - math.lgamma(alpha + n_row)
    for k in range(K):
        if counts[k] > 0.0:
            a = alpha * kappa[k]
            out += math.lgamma(a + counts[k]) - math.lgamma(a)
    return out


@njit(cache=True, nogil=True)
def merge_deltas(stats, trans, start, kappa, spec, prior, alpha, gamma):
    """(K, K): [a, b] (a < b) the change of ``objective`` when states a and b merge, O(K) a
    pair; inf elsewhere. stats (K, S), trans (K, K), start, kappa (K,)."""
    K = stats.shape[0]
    out = np.full((K, K), np.inf)
    lm = np.empty(K)
    rows = np.zeros(K)
    for k in range(K):
        lm[k] = product.log_marginal(stats[k], spec, prior)
        for j in range(K):
            rows[k] += trans[k, j]
    row_terms = np.empty(K)
    for p in range(K):
        row_terms[p] = _row_term(rows[p], trans[p], kappa, alpha, K)
    scratch = np.empty(stats.shape[1])
    for a in range(K):
        for b in range(a + 1, K):
            for t in range(stats.shape[1]):
                scratch[t] = stats[a, t] + stats[b, t]
            d = -(product.log_marginal(scratch, spec, prior) - lm[a] - lm[b])
            d += math.log(gamma)
            kab = alpha * (kappa[a] + kappa[b])
            ka = alpha * kappa[a]
            kb = alpha * kappa[b]
            # columns a and b of the start row and of every row but a and b
            for p in range(-1, K):
                if p == a or p == b:
                    continue
                na = start[a] if p < 0 else trans[p, a]
                nb = start[b] if p < 0 else trans[p, b]
                if na + nb == 0.0:
                    continue
                new = math.lgamma(kab + na + nb) - math.lgamma(kab)
                old = 0.0
                if na > 0.0:
                    old += math.lgamma(ka + na) - math.lgamma(ka)
                if nb > 0.0:
                    old += math.lgamma(kb + nb) - math.lgamma(kb)
                d -= new - old
            # rows a and b become one row; its column a holds a->a, a->b, b->a, b->b
            n_row = rows[a] + rows[b]
            new_row = 0.0
            if n_row > 0.0:
                new_row = math.lgamma(alpha) - math.lgamma(alpha + n_row)
                for k in range(K):
                    if k == b:
                        continue
                    if k == a:
                        n = trans[a, a] + trans[a, b] + trans[b, a] + trans[b, b]
                        kk = kab
                    else:
                        n = trans[a, k] + trans[b, k]
                        kk = alpha * kappa[k]
                    if n > 0.0:
                        new_row += math.lgamma(kk + n) - math.lgamma(kk)
            d -= new_row - row_terms[a] - row_terms[b]
            out[a, b] = d
    return out
