"""The infinite hidden Markov model (HDP-HMM) in its direct-assignment form (Raykov et al. 2016,
Section 6).

State indicators ``z`` and the global weights ``kappa`` are kept; emission parameters and the
transition matrix are integrated out. The emissions are any observation model of
``kernels.obs.product`` (a state is one statistics row and one cache row, as a cluster of the
mixture kernels). Many sequences share the states: records are stored sequence after sequence and
``starts`` (S + 1,) holds the offsets, so sequence s is ``X[starts[s]:starts[s + 1]]``.

State of a fit, in *slots* (rows of capacity ``cap``; a slot with ``nk == 0`` is free):

``stats`` (cap, S), ``cache`` (cap, C), ``nk`` (cap,)
    Emission statistics, caches and sizes of the states.
``trans`` (cap, cap)
    N_pk: transitions from state p to state k.
``start`` (cap,)
    Transitions from the start of a sequence into state k (the initial state is drawn from
    DP(N0, kappa) as every row of the transition matrix: a start row).
``rows`` (cap,)
    N_p. = sum_k N_pk, transitions out of state p.
``kappa`` (cap,), ``ku`` (1,)
    Global weights of the represented states and the unrepresented mass kappa_{K+1}.

The objective of the MAP variant (``objective``) is E(z, kappa) = -log p(X, z, kappa, K):

    -sum_k log p(X_k)
    - sum_rows [log Gamma(N0) - log Gamma(N0 + N_p.)
                + sum_k log Gamma(N0 kappa_k + N_pk) - log Gamma(N0 kappa_k)]
    - K log M0 - (M0 - 1) log kappa_{K+1}

the emission marginals (eq. 6.4's psi_0 differences sum to them), the transitions given kappa
with the transition matrix integrated out (each row a Dirichlet-multinomial whose one-step
conditional is eq. 6.5), and a prior on the represented weights: kappa | K ~ Dirichlet(1, ...,
1, M0) with P(K) proportional to M0^K Gamma(M0) / Gamma(M0 + K) (the top-level DP's sticks,
v_k ~ Beta(1, M0), without the size-biased order). Given the table counts M_k its posterior is
Dirichlet(M_1 + 1, ..., M_K + 1, M0), eq. 6.1 with a uniform base, and its mode
kappa_k = M_k / (M + M0 - 1), kappa_{K+1} = (M0 - 1) / (M + M0 - 1) is eq. 6.6's. MAP over
a density of kappa whose dimension changes with K needs this choice: under the top-level DP's
own measure (prod_k kappa_k^{-1}) opening a state would cost nothing for its weight.

The sweep (``sweep``) moves each record x_t to the state of least cost q_{t,k} = -log p(x_t |
X_{k,-t}) (eq. 6.4) - log p(z_t = k | z_-t, kappa) (eq. 6.5). For the MAP sweep every q_{t,k} is
the exact change of ``objective`` when x_t joins state k, so a sweep never raises it: a new state
K+1 takes kappa_{K+1} = b kappa_u from the unrepresented mass (b = ``b_new_of(M0)``), so with the
prior's change q_{t,K+1} = -log p(x_t) - log(N0 b kappa_u kappa_{z_{t+1}}) - log M0 - (M0 - 1)
log(1 - b); a record alone in its state may stay or join another one (the state then disappears
and kappa_u takes its weight back). The Gibbs sweep is Teh et al.'s direct-assignment step: the
record is removed (its state dropped if it empties), q_{t,K+1} = -log p(x_t) - log(N0 kappa_u
kappa_{z_{t+1}}) (eq. 6.5, last case), and a new state splits kappa_u by b ~ Beta(1, M0).

Tempered emissions (``temper`` w < 1, ``MAPiHMM(temper=...)``): log p(X_k) becomes log p(w S_k),
the marginal of the power likelihood prod_t p(x_t | theta_k)^w (for an exponential family, the
conjugate marginal with every record's sufficient statistics, base measure included, counting
w). The statistics rows stay unweighted; ``tempered_log_predictive`` is the change of
log p(w S_k) when a record joins, in place of the caches' predictive.
"""

import math

import numpy as np
from numba import njit

from kernels.arrays import copy_rows, copy_vector
from kernels.obs import product
from kernels.rng import sample_log_weights, uniform
from kernels.special import digamma, logsumexp


@njit(cache=True, nogil=True)
def _grow(stats, cache, nk, trans, start, rows, kappa, lmw):
    new = max(2 * stats.shape[0], 8)
    s2 = np.zeros((new, stats.shape[1]))
    c2 = np.zeros((new, cache.shape[1]))
    t2 = np.zeros((new, new))
    n2, st2, r2, k2, l2 = np.zeros(new), np.zeros(new), np.zeros(new), np.zeros(new), np.zeros(new)
    copy_rows(s2, stats)
    copy_rows(c2, cache)
    copy_rows(t2, trans)
    for v2, v in ((n2, nk), (st2, start), (r2, rows), (k2, kappa), (l2, lmw)):
        copy_vector(v2, v)
    return s2, c2, n2, t2, st2, r2, k2, l2


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
def log_transition_gain(a, k, c, trans, start, rows, kappa, alpha):
    """log of the transition factor of z_t = k given its neighbours (Raykov et al. 2016, eq. 6.5).

    (N_{a k} + N0 kappa_k) (N_{k c} + N0 kappa_c + [a = k = c]) / (N_k. + N0 + [a = k]), the
    Dirichlet-multinomial one-step conditional with the transitions of t removed; the factor
    1 / (N_a. + N0) is the same for every k and left out. a = -1: t starts its sequence (the
    start row); c = -1: t ends it (no second factor).
    """
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
    costs,
    x,
    a,
    c,
    k_alone,
    stats,
    cache,
    nk,
    trans,
    start,
    rows,
    kappa,
    ku,
    lmw,
    scratch,
    empty_s,
    empty_c,
    n_slots,
    spec,
    prior,
    alpha,
    gamma,
    log_ag,
    gibbs,
    w,
):
    """q_{t,k} (``sweep``) of x for every slot k < n_slots and, last, for a new state, into
    ``costs``; +inf for a free slot except ``k_alone``, the state x was alone in (the MAP sweep
    may restore it), and for a new state in its place."""
    if w != 1.0:
        lp0 = tempered_log_predictive(x, empty_s, 0.0, scratch, spec, prior, w)
    else:
        lp0 = product.log_predictive(x, empty_s, empty_c, spec, prior)
    for k in range(n_slots):
        if nk[k] > 0.0:
            if w != 1.0:
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
def _free_slot(nk, n_fixed, n_slots, k_alone):
    """The first free slot from ``n_fixed`` on but ``k_alone``; -1: none."""
    for k in range(n_fixed, n_slots):
        if nk[k] == 0.0 and k != k_alone:
            return k
    return -1


@njit(cache=True, nogil=True, inline="always")
def _choose(costs, k0, n_slots, gibbs, state):
    """The slot of x (n_slots: a new state): a draw from exp(-costs) or the argmin, ties kept
    with the current state (then the new one, then the lowest slot)."""
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
    """One sweep over every time step of every sequence: the argmin of eq. 6.7 (MAP-iHMM, Raykov et
    al. 2016, Section 6.2) or, with ``gibbs``, a draw from eq. 6.3 (the Gibbs sampler of 6.1); the
    costs q_{t,k} are the module docstring's. Records with z = -1 are in no state (the first,
    sequential sweep): their successor's transition is not counted until they are assigned.

    Parameters
    ----------
    X : ndarray of shape (N, D)
        Records of all sequences, one after the other; ``starts`` (n_seq + 1,) the offsets.
    z : ndarray of shape (N,), int64
        State slot of each record, -1 if none; updated in place.
    slots : tuple
        (stats, cache, nk, trans, start, rows, kappa), the slot arrays (module docstring), and
        ``ku`` (1,), kappa_{K+1}, updated in place; ``n_slots`` of them in use.
    spec, prior, empty_c : the product observation model and the cache of empty statistics
    alpha, gamma : float
        N0 (local, transition concentration) and M0 (global, top-level concentration).
    gibbs : bool, and ``state`` (1,) uint64, the RNG state of its draws (``kernels.rng``)
    n_fixed : int
        Slots below it are never reused for a new state even when empty (a chunk's copy of
        the global states keeps their numbers).
    w : float in (0, 1]
        Each record's emission counts w (``tempered_log_predictive``); 1 is eq. 6.4's
        predictive, through the caches.

    Returns
    -------
    stats, cache, nk, trans, start, rows, kappa : ndarrays, reallocated when slots ran out
    n_slots, n_changed : int
        Slots in use, and records whose state changed.
    """
    stats, cache, nk, trans, start, rows, kappa = slots
    costs = np.empty(stats.shape[0] + 2)
    empty_s = np.zeros(stats.shape[1])
    scratch = np.empty(stats.shape[1])
    # log p(w S_k) of every slot, kept up to date as records move (tempered sweeps only)
    lmw = np.zeros(stats.shape[0])
    for k in range(n_slots if w != 1.0 else 0):
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
                _move(x, k0, a, c, stats, cache, nk, trans, start, rows, spec, prior, -1.0)
                if nk[k0] == 0.0:
                    stats[k0, :] = 0.0
                    copy_vector(cache[k0], empty_c)
                    alone = True
                    if gibbs:
                        ku[0] += kappa[k0]
                        kappa[k0] = 0.0
                if w != 1.0:
                    lmw[k0] = tempered_log_marginal(stats[k0], scratch, spec, prior, w)
            if costs.shape[0] < n_slots + 2:
                costs = np.empty(2 * n_slots + 2)
            k_alone = k0 if alone and not gibbs else -1
            _costs(
                costs, x, a, c, k_alone, stats, cache, nk, trans, start, rows, kappa, ku, lmw,
                scratch, empty_s, empty_c, n_slots, spec, prior, alpha, gamma, log_ag, gibbs, w,
            )  # fmt: skip
            best = _choose(costs, k0, n_slots, gibbs, state)
            if best == n_slots:
                free = _free_slot(nk, n_fixed, n_slots, k_alone)
                if free < 0:
                    if n_slots == stats.shape[0]:
                        stats, cache, nk, trans, start, rows, kappa, lmw = _grow(
                            stats, cache, nk, trans, start, rows, kappa, lmw
                        )
                    free = n_slots
                    n_slots += 1
                # b ~ Beta(1, M0) by inversion for the Gibbs sweep
                b = 1.0 - uniform(state) ** (1.0 / gamma) if gibbs else b_new
                kappa[free] = b * ku[0]
                ku[0] *= 1.0 - b
                stats[free, :] = 0.0
                copy_vector(cache[free], empty_c)
                best = free
            if k_alone >= 0 and best != k0:
                ku[0] += kappa[k0]
                kappa[k0] = 0.0
            _move(x, best, a, c, stats, cache, nk, trans, start, rows, spec, prior, 1.0)
            if w != 1.0:
                lmw[best] = tempered_log_marginal(stats[best], scratch, spec, prior, w)
            if best != k0:
                n_changed += 1
            z[t] = best
    return stats, cache, nk, trans, start, rows, kappa, n_slots, n_changed


@njit(cache=True, nogil=True)
def log_transitions(trans, start, rows, kappa, ku, nk, alpha, gamma):
    """log p(z | kappa) + log p(kappa, K): the transition and kappa terms of the MAP-iHMM
    objective (module docstring), for the states with nk > 0.

    Parameters
    ----------
    trans : ndarray of shape (K, K)
    start, rows, kappa, nk : ndarrays of shape (K,)
    ku : float
    alpha, gamma : float

    Returns
    -------
    float
    """
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
    """E(z, kappa) = -log p(X, z, kappa) of MAP-iHMM (module docstring; Raykov et al. 2016, Section
    6.2).

    Parameters
    ----------
    stats : ndarray of shape (K, S)
    nk, start, rows, kappa : ndarrays of shape (K,)
    trans : ndarray of shape (K, K)
    ku : float
    spec, prior : the observation model
    alpha, gamma : float

    Returns
    -------
    float
    """
    out = 0.0
    for k in range(stats.shape[0]):
        if nk[k] > 0.0:
            out -= product.log_marginal(stats[k], spec, prior)
    return out - log_transitions(trans, start, rows, kappa, ku, nk, alpha, gamma)


@njit(cache=True, nogil=True)
def count_transitions(z, starts, K):
    """Transition counts of labelled sequences.

    Parameters
    ----------
    z : ndarray of shape (N,), int64
        States 0..K-1; -1 (no state) counts no transition in or out.
    starts : ndarray of shape (n_seq + 1,), int64
    K : int

    Returns
    -------
    trans : ndarray of shape (K, K)
    start : ndarray of shape (K,)
    rows : ndarray of shape (K,)
    """
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
    """log p(x_t | X_k) for every record and state, and the prior predictive log p(x_t) as the
    last column (eq. 6.4's posterior predictive: the emission of the MAP model).

    Parameters
    ----------
    X : ndarray of shape (N, D)
    stats : ndarray of shape (K, S)
    cache : ndarray of shape (K, C)

    Returns
    -------
    ndarray of shape (N, K + 1)
    """
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
    """log p_w(x | X_k) = log p(w (S_k + g(x))) - log p(w S_k): the change of the tempered
    emission marginal when x joins the state with statistics s (w = ``temper``; each record's
    sufficient statistics count w, which for an exponential family is the marginal of the
    power likelihood prod_t p(x_t | theta)^w, base measure included).

    Parameters
    ----------
    x : ndarray of shape (D,)
    s : ndarray of shape (S,)
        The state's unweighted statistics.
    lm_s : float
        log p(w S_k) (``product.log_marginal`` of w s; 0 for an empty state).
    scratch : ndarray of shape (S,)
    spec, prior : the observation model
    temper : float in (0, 1]

    Returns
    -------
    float
    """
    for j in range(s.shape[0]):
        scratch[j] = temper * s[j]
    product.add_stats(x, scratch, spec, temper)
    return product.log_marginal(scratch, spec, prior) - lm_s


@njit(cache=True, nogil=True)
def tempered_log_marginal(s, scratch, spec, prior, temper):
    """log p(w S_k): ``product.log_marginal`` of the statistics s (S,) weighted by w (0 for
    an empty state's zero statistics)."""
    for j in range(s.shape[0]):
        scratch[j] = temper * s[j]
    return product.log_marginal(scratch, spec, prior)


@njit(cache=True, nogil=True)
def emission_matrix_tempered(X, stats, spec, prior, temper):
    """``emission_matrix`` under the tempered emissions of ``tempered_log_predictive``: the
    emission factor of MAP-iHMM's objective when records count w (``temper``) each.

    Parameters
    ----------
    X : ndarray of shape (N, D)
    stats : ndarray of shape (K, S)
    temper : float in (0, 1]

    Returns
    -------
    ndarray of shape (N, K + 1)
    """
    N = X.shape[0]
    K = stats.shape[0]
    S = stats.shape[1]
    out = np.empty((N, K + 1))
    scratch = np.empty(S)
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
    """log p(x_t | x_1..x_{t-1}) of every step by the forward algorithm (filtering): the chain
    rule's terms, summing to log p(x_1..x_T) over each sequence.

    alpha_1(k) = pi_k b_k(x_1), alpha_t(k) = b_k(x_t) sum_j alpha_{t-1}(j) A_jk, in logs, each
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

    Returns
    -------
    ndarray of shape (N,)
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
    """M_k, the number of tables serving state k over all rows (Raykov et al. 2016, Section 6.1; Van
    Gael 2012), given the counts: with ``urn``, drawn by the Polya urn of eq. 6.2 (the N_pk
    transitions of row p replayed, the j-th drawn new from the global DP with probability N0 kappa_k
    / (N0 kappa_k + j)); otherwise its expectation, sum_p sum_{j < N_pk} N0 kappa_k / (N0 kappa_k +
    j) (Antoniak's distribution's mean), exact below 1000 customers and the digamma form a (psi(a +
    N) - psi(a)) above.

    Parameters
    ----------
    trans : ndarray of shape (K, K)
    start, kappa : ndarray of shape (K,)
    alpha : float
    state : ndarray of shape (1,), uint64
        The RNG state of the urn's draws.
    urn : bool

    Returns
    -------
    ndarray of shape (K,)
    """
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
    """log Gamma(N0) - log Gamma(N0 + N_p.) + sum_k log Gamma(N0 kappa_k + N_pk)
    - log Gamma(N0 kappa_k): one row's Dirichlet-multinomial term of ``log_transitions``."""
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
    """The change of ``objective`` when states a < b merge (statistics, counts and weights add),
    for every pair: O(K) per pair from the rows and columns the merge touches, instead of a
    full O(K^2) objective.

    Parameters
    ----------
    stats : ndarray of shape (K, S)
    trans : ndarray of shape (K, K)
    start, kappa : ndarray of shape (K,)
    spec, prior : the observation model
    alpha, gamma : float

    Returns
    -------
    ndarray of shape (K, K)
        [a, b] for a < b: E after the merge minus E now; +inf elsewhere.
    """
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
