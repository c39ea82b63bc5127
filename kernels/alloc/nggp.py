"""The normalized generalized gamma process (NGGP) partition prior (Lee and Choi 2015, Section 2.1).

Levy intensity rho(dw) = alpha / Gamma(1 - sigma) w^(-1-sigma) e^(-w) dw, 0 < sigma < 1. From
Theorem 1 (eqs. 4-5):

    kappa(n, u) = int_0^inf w^n e^(-u w) rho(dw) = alpha Gamma(n - sigma) / Gamma(1 - sigma)
                  (u + 1)^(sigma - n)
    psi(u)      = int_0^inf (1 - e^(-u w)) rho(dw) = alpha / sigma ((u + 1)^sigma - 1)
    P(Pi, du)   = u^(n-1) e^(-psi(u)) / Gamma(n) prod_c kappa(|c|, u) du                (eq. 4)

Given u the blocks are independent with weights kappa(|c|, u): a record joins a block of n
records with weight kappa(n + 1, u) / kappa(n, u) and opens a new one with kappa(1, u) (eq. 6).
The EPPF integrates u out of eq. 4 numerically (``log_u_integral``); samplers keep u as an
auxiliary variable and resample it (``sample_u``).

Block sizes are numbers of *records*: a leaf summarising n records is an atomic block of size n.
"""

import math

from numba import njit

from kernels.rng import uniform
from kernels.special import log1pexp


@njit(cache=True, nogil=True)
def log_kappa(n, u, alpha, sigma):
    """log kappa(n, u) (eq. 5) = log alpha + log Gamma(n - sigma) - log Gamma(1 - sigma)
    + (sigma - n) log(1 + u), a block of n > 0 records at u >= 0, 0 < sigma < 1."""
    s = sigma
    return math.log(alpha) + math.lgamma(n - s) - math.lgamma(1.0 - s) + (s - n) * math.log1p(u)


@njit(cache=True, nogil=True)
def merge_gap(na, nb, u, alpha, sigma):
    """log kappa(na + nb, u) - log kappa(na, u) - log kappa(nb, u): the change of the log of
    eq. 4 (at fixed u) when blocks of na and nb records merge."""
    return (
        log_kappa(na + nb, u, alpha, sigma)
        - log_kappa(na, u, alpha, sigma)
        - log_kappa(nb, u, alpha, sigma)
    )


@njit(cache=True, nogil=True)
def psi(u, alpha, sigma):
    """psi_rho(u) of Lee and Choi 2015, eq. 5: alpha / sigma ((1 + u)^sigma - 1)."""
    return alpha / sigma * math.expm1(sigma * math.log1p(u))


@njit(cache=True, nogil=True)
def log_u_factor(n, u, alpha, sigma):
    """log of u^(n-1) e^(-psi(u)) / Gamma(n), the factor of eq. 4 (and eq. 7) outside the product
    over blocks; n is the total number of records."""
    return (n - 1.0) * math.log(u) - math.lgamma(n) - psi(u, alpha, sigma)


@njit(cache=True, nogil=True)
def log_u_conditional(t, n, K, alpha, sigma):
    """n t - log Gamma(n) - psi(e^t) + (K sigma - n) log(1 + e^t): eq. 4's integrand over
    t = log u with the blocks' (1 + u) factors, log p(t | Pi) up to a constant."""
    s = sigma
    L = log1pexp(t)
    return n * t - math.lgamma(n) - alpha / s * math.expm1(s * L) + (K * s - n) * L


@njit(cache=True, nogil=True)
def _dlog_u_conditional(t, n, K, alpha, sigma):
    s = sigma
    L = log1pexp(t)
    lg = 1.0 / (1.0 + math.exp(-t)) if t > -700.0 else 0.0
    return n - alpha * lg * math.exp(s * L) + (K * s - n) * lg


@njit(cache=True, nogil=True)
def log_u_integral(n, K, alpha, sigma):
    """log int_0^inf u^(n-1) e^(-psi(u)) / Gamma(n) (1 + u)^(K sigma - n) du, the EPPF's factor
    besides prod_c kappa(|c|, 0): the trapezoid rule on t = log u (log-concave) around its mode,
    out to 45 nats below it."""
    lo = -60.0
    hi = 60.0
    while _dlog_u_conditional(hi, n, K, alpha, sigma) > 0.0 and hi < 1e6:
        hi *= 2.0
    while _dlog_u_conditional(lo, n, K, alpha, sigma) < 0.0 and lo > -1e6:
        lo *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _dlog_u_conditional(mid, n, K, alpha, sigma) > 0.0:
            lo = mid
        else:
            hi = mid
    t0 = 0.5 * (lo + hi)
    g0 = log_u_conditional(t0, n, K, alpha, sigma)
    eps = 1e-4 * max(1.0, abs(t0))
    d2 = (
        _dlog_u_conditional(t0 + eps, n, K, alpha, sigma)
        - _dlog_u_conditional(t0 - eps, n, K, alpha, sigma)
    ) / (2.0 * eps)
    scale = 1.0 / math.sqrt(-d2) if d2 < 0.0 else 1.0
    h = scale / 16.0
    acc = 1.0
    for direction in (-1.0, 1.0):
        k = 1
        while k < 1000000:
            g = log_u_conditional(t0 + direction * k * h, n, K, alpha, sigma)
            if g < g0 - 45.0:
                break
            acc += math.exp(g - g0)
            k += 1
    return g0 + math.log(acc * h)


@njit(cache=True, nogil=True)
def sample_u(state, u, n, K, alpha, sigma, n_steps):
    """The new u after ``n_steps`` slice-sampling updates (Neal 2003) of t = log u under
    ``log_u_conditional`` for n records in K blocks (floats); state (1,) uint64."""
    t = math.log(u)
    w = 1.0
    for _ in range(n_steps):
        g = log_u_conditional(t, n, K, alpha, sigma)
        level = g + math.log(1.0 - uniform(state))
        left = t - w * uniform(state)
        right = left + w
        j = 0
        while log_u_conditional(left, n, K, alpha, sigma) > level and j < 60:
            left -= w
            j += 1
        j = 0
        while log_u_conditional(right, n, K, alpha, sigma) > level and j < 60:
            right += w
            j += 1
        for _shrink in range(200):
            t1 = left + (right - left) * uniform(state)
            if log_u_conditional(t1, n, K, alpha, sigma) > level:
                t = t1
                break
            if t1 < t:
                left = t1
            else:
                right = t1
    return math.exp(t)
