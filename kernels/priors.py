"""Partition priors of normalized random measure (NRM) mixtures (seed 004, Section 2.1).

One interface for the Dirichlet process (DP) and the normalized generalized gamma process (NGGP):
the log EPPF of block sizes, the log weight of joining a block of size n, the log weight of a new
block, all through kappa_rho(n, u) of Theorem 1 (seed 004, eq. 5). Every score in ``ibhc`` and
``tgmcmc`` (potentials phi of eq. 8, dissimilarities d of eq. 9, Metropolis-Hastings ratios) is a
sum of ``log_kappa`` terms and log marginal likelihoods of statistics rows.

A prior is described by ``pp``, a float64 array of shape (3,): ``(kind, alpha, sigma)``.

NGGP (``kind == NGGP``), Levy intensity rho(dw) = alpha / Gamma(1 - sigma) w^(-1-sigma) e^(-w) dw,
0 < sigma < 1. From Theorem 1 (eqs. 4-5):

    kappa(n, u) = int_0^inf w^n e^(-u w) rho(dw) = alpha Gamma(n - sigma) / Gamma(1 - sigma)
                  (u + 1)^(sigma - n)
    psi(u)      = int_0^inf (1 - e^(-u w)) rho(dw) = alpha / sigma ((u + 1)^sigma - 1)
    P(Pi, du)   = u^(n-1) e^(-psi(u)) / Gamma(n) prod_c kappa(|c|, u) du                (eq. 4)

DP (``kind == DP``, the limit sigma -> 0): kappa(n, u) = alpha Gamma(n) (u + 1)^(-n). The factor
(u + 1)^(-n) is the same for every partition, so u integrates out in closed form and the EPPF is
the Chinese restaurant process (seed 003; seed 000 eq. 2.3). ``log_kappa`` of the DP therefore
omits it: log kappa(n) = log alpha + log Gamma(n), and u plays no part for the DP.

Block sizes are numbers of *records*: a leaf summarising n records is an atomic block of size n.
"""

import math

import numpy as np
from numba import njit

from kernels.rng import uniform

DP = 0
NGGP = 1

# columns of pp
KIND, ALPHA, SIGMA = 0, 1, 2


@njit(cache=True, nogil=True)
def log1pexp(t):
    """log(1 + e^t) without overflow."""
    if t > 0.0:
        return t + math.log1p(math.exp(-t))
    return math.log1p(math.exp(t))


@njit(cache=True, nogil=True)
def logaddexp(a, b):
    """log(e^a + e^b)."""
    if a == -np.inf:
        return b
    if b == -np.inf:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True, nogil=True)
def log_kappa(n, u, pp):
    """log kappa_rho(n, u), seed 004 eq. 5: the weight of one block of n records.

    Parameters
    ----------
    n : float
        Block size in records (> 0).
    u : float
        The auxiliary variable of Theorem 1 (ignored by the DP).
    pp : ndarray of shape (3,)
        (kind, alpha, sigma).

    Returns
    -------
    float
        NGGP: log alpha + log Gamma(n - sigma) - log Gamma(1 - sigma) + (sigma - n) log(1 + u).
        DP: log alpha + log Gamma(n) (the partition-independent (1 + u)^(-n) dropped).
    """
    if pp[KIND] == DP:
        return math.log(pp[ALPHA]) + math.lgamma(n)
    s = pp[SIGMA]
    return math.log(pp[ALPHA]) + math.lgamma(n - s) - math.lgamma(1.0 - s) + (s - n) * math.log1p(u)


@njit(cache=True, nogil=True)
def log_join(n, u, pp):
    """log kappa(n + 1, u) / kappa(n, u): the weight of one record joining a block of size n
    (seed 004 eq. 6). DP: log n; NGGP: log(n - sigma) - log(1 + u)."""
    if pp[KIND] == DP:
        return math.log(n)
    return math.log(n - pp[SIGMA]) - math.log1p(u)


@njit(cache=True, nogil=True)
def log_new(u, pp):
    """log kappa(1, u): the weight of a new block of one record (seed 004 eq. 6).
    DP: log alpha; NGGP: log alpha + (sigma - 1) log(1 + u)."""
    return log_kappa(1.0, u, pp)


@njit(cache=True, nogil=True)
def psi(u, pp):
    """psi_rho(u) of seed 004 eq. 5.

    NGGP: alpha / sigma ((1 + u)^sigma - 1); DP: alpha log(1 + u)."""
    if pp[KIND] == DP:
        return pp[ALPHA] * math.log1p(u)
    s = pp[SIGMA]
    return pp[ALPHA] / s * math.expm1(s * math.log1p(u))


@njit(cache=True, nogil=True)
def log_u_factor(n, u, pp):
    """log of u^(n-1) e^(-psi(u)) / Gamma(n), the factor of eq. 4 (and eq. 7) outside the product
    over blocks; n is the total number of records."""
    return (n - 1.0) * math.log(u) - math.lgamma(n) - psi(u, pp)


@njit(cache=True, nogil=True)
def log_prior_constant(n, u, pp):
    """The partition-independent term of log P(Pi[, u]) next to sum_c log_kappa(|c|, u).

    NGGP: ``log_u_factor`` (the joint of eq. 4 with u, a density in u). DP: log Gamma(alpha) -
    log Gamma(alpha + n), so that the sum is the log CRP EPPF with u integrated out.
    """
    if pp[KIND] == DP:
        return math.lgamma(pp[ALPHA]) - math.lgamma(pp[ALPHA] + n)
    return log_u_factor(n, u, pp)


@njit(cache=True, nogil=True)
def _log_u_integrand(t, n, K, pp):
    """log of the eq. 4 integrand over t = log u (Jacobian u included), with the
    (1 + u)^(K sigma - n) of the product over K blocks:
    n t - log Gamma(n) - psi(e^t) + (K sigma - n) log(1 + e^t)."""
    s = pp[SIGMA]
    L = log1pexp(t)
    return n * t - math.lgamma(n) - pp[ALPHA] / s * math.expm1(s * L) + (K * s - n) * L


@njit(cache=True, nogil=True)
def _dlog_u_integrand(t, n, K, pp):
    s = pp[SIGMA]
    L = log1pexp(t)
    lg = 1.0 / (1.0 + math.exp(-t)) if t > -700.0 else 0.0
    return n - pp[ALPHA] * lg * math.exp(s * L) + (K * s - n) * lg


@njit(cache=True, nogil=True)
def log_nggp_u_integral(n, K, pp):
    """log int_0^inf u^(n-1) e^(-psi(u)) / Gamma(n) (1 + u)^(K sigma - n) du for the NGGP.

    This is eq. 4 integrated over u with the block terms that depend on u: the NGGP EPPF is
    prod_c alpha Gamma(|c| - sigma) / Gamma(1 - sigma) times this integral. The integrand over
    t = log u is log-concave, so the trapezoid rule on t around its mode (found by bisection on
    the derivative), run out to 45 nats below the mode, is accurate to machine precision.
    """
    lo = -60.0
    hi = 60.0
    while _dlog_u_integrand(hi, n, K, pp) > 0.0 and hi < 1e6:
        hi *= 2.0
    while _dlog_u_integrand(lo, n, K, pp) < 0.0 and lo > -1e6:
        lo *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _dlog_u_integrand(mid, n, K, pp) > 0.0:
            lo = mid
        else:
            hi = mid
    t0 = 0.5 * (lo + hi)
    g0 = _log_u_integrand(t0, n, K, pp)
    eps = 1e-4 * max(1.0, abs(t0))
    d2 = (_dlog_u_integrand(t0 + eps, n, K, pp) - _dlog_u_integrand(t0 - eps, n, K, pp)) / (
        2.0 * eps
    )
    scale = 1.0 / math.sqrt(-d2) if d2 < 0.0 else 1.0
    h = scale / 16.0
    acc = 1.0
    for direction in (-1.0, 1.0):
        k = 1
        while k < 1000000:
            g = _log_u_integrand(t0 + direction * k * h, n, K, pp)
            if g < g0 - 45.0:
                break
            acc += math.exp(g - g0)
            k += 1
    return g0 + math.log(acc * h)


@njit(cache=True, nogil=True)
def log_eppf(sizes, K, pp):
    """log EPPF p(|c_1|, ..., |c_K|): the prior probability of one partition with these block sizes.

    Parameters
    ----------
    sizes : ndarray of shape (>= K,)
        Block sizes in records.
    K : int
        Number of blocks (leading entries of ``sizes`` used).
    pp : ndarray of shape (3,)

    Returns
    -------
    float
        DP: the CRP, log Gamma(alpha) - log Gamma(alpha + n) + sum_c (log alpha + log Gamma(|c|)).
        NGGP: sum_c log kappa(|c|, 0) + ``log_nggp_u_integral(n, K)``, i.e. eq. 4 integrated over u.
    """
    n = 0.0
    out = 0.0
    for k in range(K):
        n += sizes[k]
        out += log_kappa(sizes[k], 0.0, pp)
    if pp[KIND] == DP:
        return out + math.lgamma(pp[ALPHA]) - math.lgamma(pp[ALPHA] + n)
    return out + log_nggp_u_integral(n, float(K), pp)


@njit(cache=True, nogil=True)
def log_u_conditional(t, n, K, pp):
    """log p(t | Pi) + const for t = log u given a partition of n records into K blocks
    (eq. 4 as a function of u, times the Jacobian u)."""
    return _log_u_integrand(t, n, K, pp)


@njit(cache=True, nogil=True)
def sample_u(state, u, n, K, pp, n_steps):
    """Resample the auxiliary u of Theorem 1 given a partition: ``n_steps`` slice-sampling updates
    (stepping out and shrinkage, Neal 2003) of t = log u under ``log_u_conditional``.

    The conditional depends on the partition only through n and K. The DP returns u unchanged.

    Parameters
    ----------
    state : ndarray of shape (1,), uint64
    u : float
    n : float
        Total number of records.
    K : float
        Number of blocks.
    pp : ndarray of shape (3,)
    n_steps : int

    Returns
    -------
    float
        The new u.
    """
    if pp[KIND] == DP:
        return u
    t = math.log(u)
    w = 1.0
    for _ in range(n_steps):
        g = log_u_conditional(t, n, K, pp)
        level = g + math.log(1.0 - uniform(state))
        left = t - w * uniform(state)
        right = left + w
        j = 0
        while log_u_conditional(left, n, K, pp) > level and j < 60:
            left -= w
            j += 1
        j = 0
        while log_u_conditional(right, n, K, pp) > level and j < 60:
            right += w
            j += 1
        for _shrink in range(200):
            t1 = left + (right - left) * uniform(state)
            if log_u_conditional(t1, n, K, pp) > level:
                t = t1
                break
            if t1 < t:
                left = t1
            else:
                right = t1
    return math.exp(t)
