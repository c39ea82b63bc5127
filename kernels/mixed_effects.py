"""The semiparametric mixed-effects model of Raykov et al. 2016, Section 7, fitted by iterated
conditional modes (ICM) without collapsing the cluster parameters.

Model (eq. 7.1): y_i = X_i beta_i + eps_i, eps_i ~ N(0, tau^-1 I), beta_i ~ a DP mixture of
N(mu_k, R_k^-1) with the Normal-Wishart prior of Appendix B; tau ~ Gamma(a_tau, b_tau) (shape,
rate); z ~ CRP(N0) (eq. 2.3). The objective, beta_i integrated out (constants left out):

    E = sum_i -log N(y_i | X_i mu_{z_i}, X_i R_{z_i}^-1 X_i^T + tau^-1 I)
        - sum_k log NW(mu_k, R_k) - log p(z | N0) (eq. 2.3) - log Gamma(tau; a_tau, b_tau)

A pass lowers it in two steps: each subject's z_i to its conditional mode (``sweep``), then an
EM step for (mu, R, tau) from eq. 7.2's conditionals (``estep_sums``): the Normal-Wishart modes
(``nw_mode``) and eq. 7.3's (``tau_mode``). beta_i is integrated out because the joint mode over
(z, beta, mu, R, tau) is degenerate (beta_i shrinks to mu_k, which tightens R_k: tau ended at
half the truth); the reported random effects are eq. 7.2's modes. Held-out subjects are scored
by the same integral (``log_predictive``, eq. 3.4's analogue) from their moments.
"""

import math

import numpy as np
from numba import njit

from kernels.arrays import copy_rows, copy_vector
from kernels.obs.gaussian_nw import cholesky_inplace
from kernels.special import lmvgamma

LOG_2PI = math.log(2.0 * math.pi)


# -- small dense linear algebra ----------------------------------------------------------------


@njit(cache=True, nogil=True)
def cholesky(A, L):
    """Lower Cholesky factor of A (p, p) into L (p, p), A kept; False if not positive definite."""
    p = A.shape[0]
    for i in range(p):
        for j in range(p):
            L[i, j] = A[i, j]
    return cholesky_inplace(L)


@njit(cache=True, nogil=True)
def chol_solve(L, b, out):
    """Solve (L L^T) out = b for out (p,), given the Cholesky factor L (p, p)."""
    p = L.shape[0]
    for i in range(p):
        t = b[i]
        for k in range(i):
            t -= L[i, k] * out[k]
        out[i] = t / L[i, i]
    for i in range(p - 1, -1, -1):
        t = out[i]
        for k in range(i + 1, p):
            t -= L[k, i] * out[k]
        out[i] = t / L[i, i]


@njit(cache=True, nogil=True)
def chol_inverse(L, out, e, col):
    """out (p, p) = A^-1 from A's Cholesky factor L (e, col: scratch (p,))."""
    p = L.shape[0]
    for j in range(p):
        e[:] = 0.0
        e[j] = 1.0
        chol_solve(L, e, col)
        for a in range(p):
            out[a, j] = col[a]


@njit(cache=True, nogil=True)
def chol_logdet(L):
    """log|A| from the Cholesky factor L of A."""
    s = 0.0
    for i in range(L.shape[0]):
        s += 2.0 * math.log(L[i, i])
    return s


# -- per-subject moments -------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def subject_moments(X, y, codes, n_groups):
    """Each subject's moments from the covariates X (n, p), responses y (n,) and subject codes
    (n,) int64 in 0..n_groups - 1: XtX (G, p, p), Xty (G, p), yty (G,), n_obs (G,)."""
    n, p = X.shape
    XtX = np.zeros((n_groups, p, p))
    Xty = np.zeros((n_groups, p))
    yty = np.zeros(n_groups)
    n_obs = np.zeros(n_groups)
    for r in range(n):
        g = codes[r]
        yr = y[r]
        for a in range(p):
            xa = X[r, a]
            Xty[g, a] += xa * yr
            for b in range(p):
                XtX[g, a, b] += xa * X[r, b]
        yty[g] += yr * yr
        n_obs[g] += 1.0
    return XtX, Xty, yty, n_obs


# -- the conditional modes ----------------------------------------------------------------------


@njit(cache=True, nogil=True)
def subject_cost(XtX, Xty, yty, n_obs, tau, mu, R, logdet_R, beta, A, L, h):
    """-log N(y_i | X_i mu, X_i R^-1 X_i^T + tau^-1 I) of a subject in a cluster (inf if A is
    not positive definite), its eq. 7.2 mode into beta (p,).

    Eq. 7.2 is N(A^-1 h, A^-1), A = tau X^T X + R, h = tau X^T y + R mu; its mode minimises
    g = tau/2 ||y - X beta||^2 + 1/2 (beta - mu)^T R (beta - mu), and the integral is
    n/2 log 2pi - n/2 log tau + 1/2 log|A| - 1/2 log|R| + min g.

    Parameters
    ----------
    XtX, Xty, yty, n_obs : the subject's moments, (p, p), (p,), float, float
    tau : float
    mu, R, logdet_R : the cluster's mean (p,), precision (p, p) and log|R|
    beta : (p,), output
    A, L, h : scratch (p, p), (p, p), (p,); L returns the Cholesky factor of A
    """
    Rmu = np.empty(XtX.shape[0])
    muRmu = _rmu(R, mu, Rmu)
    return subject_cost_pre(
        XtX, Xty, yty, n_obs, tau, math.log(tau), Rmu, muRmu, R, logdet_R, beta, A, L, h
    )


@njit(cache=True, nogil=True)
def subject_cost_pre(XtX, Xty, yty, n_obs, tau, log_tau, Rmu, muRmu, R, logdet_R, beta, A, L, h):
    """``subject_cost`` with the cluster's R mu (p,), mu^T R mu and log tau precomputed."""
    p = XtX.shape[0]
    for a in range(p):
        for b in range(p):
            A[a, b] = tau * XtX[a, b] + R[a, b]
        h[a] = tau * Xty[a] + Rmu[a]
    if not cholesky(A, L):
        return np.inf
    chol_solve(L, h, beta)
    hb = 0.0
    for a in range(p):
        hb += h[a] * beta[a]
    g = 0.5 * tau * yty + 0.5 * muRmu - 0.5 * hb
    return 0.5 * n_obs * (LOG_2PI - log_tau) + 0.5 * chol_logdet(L) - 0.5 * logdet_R + g


@njit(cache=True, nogil=True)
def _rmu(R, mu, out):
    """out = R mu; returns mu^T R mu."""
    p = mu.shape[0]
    q = 0.0
    for a in range(p):
        t = 0.0
        for b in range(p):
            t += R[a, b] * mu[b]
        out[a] = t
        q += mu[a] * t
    return q


@njit(cache=True, nogil=True)
def nw_mode(n, s, ss, m0, c0, T0, a0, mu, R, L):
    """The joint Normal-Wishart posterior mode mu = m, R = (a - p) B (eq. B.1, the n random
    effects as records: sums s (p,), ss (p, p)) into mu (p,), R (p, p); returns log|R| (NaN if
    B^-1 is not positive definite). Prior m0, c0, T0 = B0^-1 (p, p), a0 > p; L (p, p) scratch."""
    p = m0.shape[0]
    return nw_mode_into(
        n, s, ss, m0, c0, T0, a0, mu, R, L, np.empty((p, p)), np.empty(p), np.empty(p)
    )


@njit(cache=True, nogil=True)
def nw_mode_into(n, s, ss, m0, c0, T0, a0, mu, R, L, Binv, e, col):
    """``nw_mode`` with the scratch Binv (p, p), e and col (p,)."""
    p = m0.shape[0]
    c = c0 + n
    for a in range(p):
        mu[a] = (c0 * m0[a] + s[a]) / c
    # R = (a - p) (B^-1)^-1, through the Cholesky factor of B^-1
    for a in range(p):
        for b in range(p):
            Binv[a, b] = T0[a, b] + ss[a, b] + c0 * m0[a] * m0[b] - c * mu[a] * mu[b]
    if not cholesky(Binv, L):
        return np.nan
    chol_inverse(L, R, e, col)
    R *= a0 + n - p
    return p * math.log(a0 + n - p) - chol_logdet(L)


@njit(cache=True, nogil=True)
def nw_log_density(mu, R, logdet_R, m0, c0, T0, a0, logdet_T0):
    """log NW(mu, R | m0, c0, B0, a0) = log N(mu | m0, (c0 R)^-1) + log W(R | B0, a0)."""
    p = m0.shape[0]
    qd = 0.0
    for a in range(p):
        t = 0.0
        for b in range(p):
            t += R[a, b] * (mu[b] - m0[b])
        qd += (mu[a] - m0[a]) * t
    out = 0.5 * p * math.log(c0) - 0.5 * p * LOG_2PI + 0.5 * logdet_R - 0.5 * c0 * qd
    tr = 0.0
    for a in range(p):
        for b in range(p):
            tr += T0[a, b] * R[b, a]
    # log W = (a0 - p - 1)/2 log|R| - tr(B0^-1 R)/2 - a0 p/2 log 2 - a0/2 log|B0| - log Gamma_p
    out += (
        0.5 * (a0 - p - 1.0) * logdet_R
        - 0.5 * tr
        - 0.5 * a0 * p * math.log(2.0)
        + 0.5 * a0 * logdet_T0
        - lmvgamma(0.5 * a0, p)
    )
    return out


@njit(cache=True, nogil=True)
def nw_log_prior(mu, R, logdet_R, m0, c0, T0, a0, logdet_T0):
    """The objective's log NW(mu, R): ``nw_log_density`` in units where |T0| = 1 (minus
    p/2 log|T0|). A density of (mu, R) gains p log|D| when beta -> D beta, which shifts the
    cost of a cluster as a change of N0 would (grams: a cluster per rat, kilograms: two)."""
    return (
        nw_log_density(mu, R, logdet_R, m0, c0, T0, a0, logdet_T0) - 0.5 * m0.shape[0] * logdet_T0
    )


@njit(cache=True, nogil=True)
def tau_mode(rss, n_obs, a_tau, b_tau):
    """The mode (a + n/2 - 1) / (b + rss/2) of eq. 7.3's Gamma(a + n/2, b + rss/2), n_obs
    observations of residual sum of squares rss."""
    return max(a_tau + 0.5 * n_obs - 1.0, 0.0) / (b_tau + 0.5 * rss)


@njit(cache=True, nogil=True)
def cluster_energy(n, s, ss, mu, R, logdet_R):
    """sum over the cluster's subjects of -log N(beta_i | mu, R^-1), from n, s = sum beta_i and
    ss = sum beta_i beta_i^T: n p/2 log 2pi - n/2 log|R| + 1/2 tr(R S) with
    S = ss - mu s^T - s mu^T + n mu mu^T."""
    p = mu.shape[0]
    tr = 0.0
    for a in range(p):
        for b in range(p):
            S = ss[a, b] - mu[a] * s[b] - s[a] * mu[b] + n * mu[a] * mu[b]
            tr += R[b, a] * S
    return 0.5 * n * p * LOG_2PI - 0.5 * n * logdet_R + 0.5 * tr


# -- the sweep over subjects ----------------------------------------------------------------------


@njit(cache=True, nogil=True)
def sweep(
    XtX, Xty, yty, n_obs, train, z, mu, R, logdet_R, log_nw, nk, n_slots, m0, c0, T0, a0,
    logdet_T0, mu0, R0, tau, log_alpha, n_st, s_st, ss_st, beta,
):  # fmt: skip
    """One ICM pass over a chunk's subjects: each training subject's z_i to its conditional
    mode, beta_i integrated out, and in the same loop ``estep_sums``' statistics (exact: a
    slot's parameters change only when a subject opens it, alone).

    Cluster k costs ``subject_cost`` - log N_{k,-i}; a new one the same at a candidate (mu*, R*),
    the NW mode given the eq. 7.2 mode under the prior's mode (mu0, R0), minus log N0 and
    ``nw_log_prior``, which a subject alone in its cluster pays too for staying.

    Parameters
    ----------
    XtX, Xty, yty, n_obs : the subjects' moments, (G, p, p), (G, p), (G,), (G,)
    train : (G,) bool
        Fitted subjects (held-out ones keep z = -1).
    z : (G,) int64
        Each subject's cluster slot (-1: none), updated.
    mu, R, logdet_R, log_nw : (K_cap, p), (K_cap, p, p), (K_cap,), (K_cap,)
        Cluster parameters by slot (log_nw: ``nw_log_prior``); new clusters fill free slots.
    nk : (K_cap,) float64
        Subjects per slot, updated; n_slots in use, K_cap >= n_slots + G.
    m0, c0, T0, a0, logdet_T0, mu0, R0 : the prior (T0 = B0^-1) and its mode
    tau, log_alpha : float
    n_st, s_st, ss_st : (K_cap,), (K_cap, p), (K_cap, p, p)
        Zeros in; out ``estep_sums``' per-slot sums.
    beta : (G, p)
        Out: each training subject's eq. 7.2 mode.

    Returns
    -------
    n_slots, n_changed : int
    rss, n_obs_total, nll : float
        ``estep_sums``' sums.
    """
    G, p = Xty.shape
    A = np.empty((p, p))
    L = np.empty((p, p))
    L_best = np.empty((p, p))
    h = np.empty(p)
    b_try = np.empty(p)
    b_best = np.empty(p)
    b_new = np.empty(p)
    mu_new = np.empty(p)
    R_new = np.empty((p, p))
    Rmu_new = np.empty(p)
    u = np.empty(p)
    e = np.zeros(p)
    col = np.empty(p)
    log_tau = math.log(tau)
    # per slot R_k mu_k and mu_k^T R_k mu_k (a new cluster's are set where it opens)
    Rmu = np.empty((mu.shape[0], p))
    muRmu = np.empty(mu.shape[0])
    for k in range(n_slots):
        muRmu[k] = _rmu(R[k], mu[k], Rmu[k])
    Rmu0 = np.empty(p)
    muRmu0 = _rmu(R0, mu0, Rmu0)
    ld0 = 0.0
    if cholesky(R0, L):
        ld0 = chol_logdet(L)
    T0inv = np.empty((p, p))
    if not cholesky(T0, L):
        return -1, 0, np.nan, np.nan, np.nan
    chol_inverse(L, T0inv, e, col)
    # nw_log_prior's terms that do not depend on (mu, R)
    lnw_const = (
        0.5 * p * math.log(c0) - 0.5 * p * LOG_2PI - 0.5 * a0 * p * math.log(2.0)
        + 0.5 * a0 * logdet_T0 - lmvgamma(0.5 * a0, p) - 0.5 * p * logdet_T0
    )  # fmt: skip
    changed = 0
    rss = 0.0
    nob = 0.0
    nll = 0.0
    for i in range(G):
        if not train[i]:
            continue
        k0 = z[i]
        if k0 >= 0:
            nk[k0] -= 1.0
        best, raw_best, kbest = _best_slot(
            XtX[i], Xty[i], yty[i], n_obs[i], tau, log_tau, Rmu, muRmu, R, logdet_R, nk, log_nw,
            log_alpha, n_slots, k0, b_try, b_best, A, L, L_best, h,
        )  # fmt: skip
        # a new cluster's candidate: the NW mode given the eq. 7.2 mode under the prior's mode
        subject_cost_pre(
            XtX[i], Xty[i], yty[i], n_obs[i], tau, log_tau, Rmu0, muRmu0, R0, ld0, b_new, A, L, h
        )
        ld_new, lnw = _candidate(b_new, m0, c0, a0, T0inv, logdet_T0, lnw_const, u, mu_new, R_new)
        muRmu_new = _rmu(R_new, mu_new, Rmu_new)
        raw = subject_cost_pre(
            XtX[i], Xty[i], yty[i], n_obs[i], tau, log_tau, Rmu_new, muRmu_new, R_new, ld_new,
            b_try, A, L, h,
        )  # fmt: skip
        c = raw - (log_alpha + lnw)
        if c < best:
            best = c
            raw_best = raw
            copy_vector(b_best, b_try)
            copy_rows(L_best, L)
            # reuse the subject's own slot when it was alone there
            if k0 >= 0 and nk[k0] <= 0.0:
                kbest = k0
            else:
                kbest = n_slots
                n_slots += 1
            copy_vector(mu[kbest], mu_new)
            copy_rows(R[kbest], R_new)
            copy_vector(Rmu[kbest], Rmu_new)
            muRmu[kbest] = muRmu_new
            logdet_R[kbest] = ld_new
            log_nw[kbest] = lnw
        nk[kbest] += 1.0
        if kbest != k0:
            changed += 1
        z[i] = kbest
        # the E-step in the chosen cluster, as ``estep_sums``
        nll += raw_best
        copy_vector(beta[i], b_best)
        rss += _add_estep(XtX[i], Xty[i], yty[i], b_best, L_best, kbest, n_st, s_st, ss_st, e, col)
        nob += n_obs[i]
    return n_slots, changed, rss, nob, nll


@njit(cache=True, nogil=True, inline="always")
def _best_slot(
    XtX_i, Xty_i, yty_i, n_obs_i, tau, log_tau, Rmu, muRmu, R, logdet_R, nk, log_nw, log_alpha,
    n_slots, k0, b_try, b_best, A, L, L_best, h,
):  # fmt: skip
    """``sweep``'s least (cost, ``subject_cost`` part, slot) over the clusters in use (k0: the
    subject's, left in nk), the winner's mode in b_best and A factor in L_best."""
    best = np.inf
    raw_best = np.inf
    kbest = -1
    for k in range(n_slots):
        if nk[k] <= 0.0 and k != k0:
            continue
        raw = subject_cost_pre(
            XtX_i, Xty_i, yty_i, n_obs_i, tau, log_tau, Rmu[k], muRmu[k], R[k], logdet_R[k],
            b_try, A, L, h,
        )  # fmt: skip
        c = raw
        if nk[k] > 0.0:
            c -= math.log(nk[k])
        else:  # i alone in k0: staying keeps the cluster, its NW prior and N0
            c -= log_alpha + log_nw[k]
        # ties keep the current cluster (the first one scored wins otherwise)
        if c < best or (c == best and k == k0):
            best = c
            raw_best = raw
            kbest = k
            copy_vector(b_best, b_try)
            copy_rows(L_best, L)
    return best, raw_best, kbest


@njit(cache=True, nogil=True, inline="always")
def _candidate(b, m0, c0, a0, T0inv, logdet_T0, lnw_const, u, mu, R):
    """``nw_mode`` given one point b in closed form into mu (p,), R (p, p): mu* = (c0 m0 + b) /
    (c0 + 1), R* = (a0 + 1 - p) (T0 + w d d^T)^-1, d = b - m0, w = c0 / (c0 + 1) (Sherman-
    Morrison); returns log|R*| and ``nw_log_prior`` (lnw_const: its constant; u (p,) scratch)."""
    p = b.shape[0]
    w = c0 / (c0 + 1.0)
    a1 = a0 + 1.0 - p
    q = 0.0
    for a in range(p):
        t = 0.0
        for j in range(p):
            t += T0inv[a, j] * (b[j] - m0[j])
        u[a] = t
        q += (b[a] - m0[a]) * t
    den = 1.0 + w * q
    for a in range(p):
        mu[a] = (c0 * m0[a] + b[a]) / (c0 + 1.0)
        for j in range(p):
            R[a, j] = a1 * (T0inv[a, j] - w * u[a] * u[j] / den)
    ld = p * math.log(a1) - logdet_T0 - math.log(den)
    # nw_log_prior at (mu*, R*): (mu* - m0)^T R* (mu* - m0) = a1 q / (den (c0 + 1)^2),
    # tr(T0 R*) = a1 (p - w q / den)
    lnw = (
        lnw_const + 0.5 * (a0 - p) * ld - 0.5 * c0 * a1 * q / (den * (c0 + 1.0) ** 2)
        - 0.5 * a1 * (p - w * q / den)
    )  # fmt: skip
    return ld, lnw


@njit(cache=True, nogil=True, inline="always")
def _add_estep(XtX_i, Xty_i, yty_i, b, L, k, n, s, ss, e, col):
    """A subject's E-step sums into slot k: the count, b (p,), b b^T + V (V = A^-1 from its
    factor L; e, col scratch (p,)); returns ||y - X b||^2 + tr(X^T X V) (eq. 7.3's)."""
    p = b.shape[0]
    r = yty_i - 2.0 * (b @ Xty_i) + _rmu(XtX_i, b, col)
    n[k] += 1.0
    for c in range(p):
        s[k, c] += b[c]
        for d in range(p):
            ss[k, c, d] += b[c] * b[d]
    for d in range(p):
        e[:] = 0.0
        e[d] = 1.0
        chol_solve(L, e, col)
        for c in range(p):
            ss[k, c, d] += col[c]
            r += XtX_i[d, c] * col[c]
    return r


@njit(cache=True, nogil=True)
def estep_sums(XtX, Xty, yty, n_obs, train, z, mu, R, logdet_R, tau, n_slots, beta):
    """The E-step under eq. 7.2 (mean m_i, into beta, and V_i = (tau X_i^T X_i + R_k)^-1):
    per slot the count n (S,), sum m_i s (S, p) and sum m_i m_i^T + V_i ss (S, p, p); the
    expected residual sum of squares rss, n_obs_total (eq. 7.3) and the objective's nll."""
    G, p = Xty.shape
    n = np.zeros(n_slots)
    s = np.zeros((n_slots, p))
    ss = np.zeros((n_slots, p, p))
    A = np.empty((p, p))
    L = np.empty((p, p))
    h = np.empty(p)
    b = np.empty(p)
    e = np.zeros(p)
    col = np.empty(p)
    rss = 0.0
    nob = 0.0
    nll = 0.0
    for i in range(G):
        if not train[i]:
            continue
        k = z[i]
        nll += subject_cost(XtX[i], Xty[i], yty[i], n_obs[i], tau, mu[k], R[k], logdet_R[k],
                            b, A, L, h)  # fmt: skip
        beta[i] = b
        rss += _add_estep(XtX[i], Xty[i], yty[i], b, L, k, n, s, ss, e, col)
        nob += n_obs[i]
    return n, s, ss, rss, nob, nll


@njit(cache=True, nogil=True)
def log_predictive(XtX, Xty, yty, n_obs, tau, mu, R, logdet_R):
    """(G,): log N(y_i | X_i mu, X_i R^-1 X_i^T + tau^-1 I) of every subject."""
    G, p = Xty.shape
    out = np.empty(G)
    A = np.empty((p, p))
    L = np.empty((p, p))
    h = np.empty(p)
    b = np.empty(p)
    for i in range(G):
        out[i] = -subject_cost(XtX[i], Xty[i], yty[i], n_obs[i], tau, mu, R, logdet_R, b, A, L, h)
    return out


@njit(cache=True, nogil=True)
def mixture_log_predictive(XtX, Xty, yty, n_obs, tau, mu, R, logdet_R, log_w):
    """Per subject the log density under each component (G, K) and eq. 3.4's analogue (G,)
    with the log weights log_w (K,) (the new cluster, at the prior's mode, among them)."""
    G = Xty.shape[0]
    K = mu.shape[0]
    comp = np.empty((G, K))
    for k in range(K):
        copy_vector(comp[:, k], log_predictive(XtX, Xty, yty, n_obs, tau, mu[k], R[k], logdet_R[k]))
    out = np.empty(G)
    for i in range(G):
        m = -np.inf
        for k in range(K):
            v = comp[i, k] + log_w[k]
            if v > m:
                m = v
        if m == -np.inf:
            out[i] = m
            continue
        s = 0.0
        for k in range(K):
            s += math.exp(comp[i, k] + log_w[k] - m)
        out[i] = m + math.log(s)
    return comp, out


@njit(cache=True, nogil=True)
def ols_moments(XtX, Xty, yty, n_obs, train):
    """The empirical-Bayes prior's moments: over training subjects with a non-singular
    X_i^T X_i and n_i > p, the least-squares beta_i's count, sum s (p,), outer products ss and
    (X_i^T X_i)^-1 sum inv_sum (p, p), rss and dof; over all, the pooled XtX (p, p), Xty (p,),
    yty and n_pooled. Returns (count, rss, dof, n_pooled, s, ss, inv_sum, XtX, Xty, yty)."""
    G, p = Xty.shape
    s = np.zeros(p)
    ss = np.zeros((p, p))
    inv_sum = np.zeros((p, p))
    XtXp = np.zeros((p, p))
    Xtyp = np.zeros(p)
    ytyp = 0.0
    n_pooled = 0.0
    count = 0.0
    rss = 0.0
    dof = 0.0
    L = np.empty((p, p))
    b = np.empty(p)
    e = np.zeros(p)
    col = np.empty(p)
    for i in range(G):
        if not train[i]:
            continue
        XtXp += XtX[i]
        Xtyp += Xty[i]
        ytyp += yty[i]
        n_pooled += n_obs[i]
        if n_obs[i] <= p:
            continue
        if not cholesky(XtX[i], L):
            continue
        # a nearly singular X_i^T X_i (a covariate constant within the subject) is left out
        if L[p - 1, p - 1] ** 2 < 1e-10 * (XtX[i, 0, 0] + 1e-300):
            continue
        chol_solve(L, Xty[i], b)
        r = yty[i] - b @ Xty[i]
        count += 1.0
        rss += max(r, 0.0)
        dof += n_obs[i] - p
        for a in range(p):
            s[a] += b[a]
            for c in range(p):
                ss[a, c] += b[a] * b[c]
        for c in range(p):
            e[:] = 0.0
            e[c] = 1.0
            chol_solve(L, e, col)
            for a in range(p):
                inv_sum[a, c] += col[a]
    return count, rss, dof, n_pooled, s, ss, inv_sum, XtXp, Xtyp, ytyp
