"""Multivariate Gaussian with a Normal-Wishart prior (seed 000, Appendix B, eqs. B.1-B.2).

Parameterisation exactly as Appendix B: theta_0 = (m0, c0, B0, a0), the precision matrix is
Wishart with scale matrix B0 and a0 degrees of freedom, the mean is Normal with precision c0 times
it. We work with the *inverse* scale T = B^{-1} because B.1 updates it additively:

    T_k = B0^{-1} + S_k + c0 N_k / (c0 + N_k) (xbar_k - m0)(xbar_k - m0)^T          (B.1)
        = B0^{-1} + sum_j x_j x_j^T + c0 m0 m0^T - c_k m_k m_k^T

Layouts for d columns
---------------------
stats ``s`` (1 + d + d^2): n, sum x (d), sum x x^T (d * d, row major).
prior ``p`` (d + 3 + d^2): m0 (d), c0, a0, log|T0|, T0 = B0^{-1} (d * d).
cache ``c`` (d^2 + 2 d + 4): L (d * d, lower Cholesky factor of T_k), m_k (d), 1 / diag(L) (d),
c_k, a_k, log|T_k|, the Student-t normalising constant.

The predictive (Appendix B, below B.2) is a Student-t with mu = m, nu = a - d + 1 and precision
Lambda = c nu / (c + 1) B, so (x - mu)^T Lambda (x - mu) / nu = c / (c + 1) |L^{-1} (x - m)|^2.
"""

import math

import numpy as np
from numba import njit

from kernels.special import LOG_PI, lmvgamma


@njit(cache=True, nogil=True)
def dim_of_stats(s):
    """d from len(s) = 1 + d + d^2."""
    return int(round((math.sqrt(4.0 * s.shape[0] - 3.0) - 1.0) / 2.0))


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, x, x x^T)."""
    d = x.shape[0]
    s[0] += w
    for i in range(d):
        s[1 + i] += w * x[i]
    base = 1 + d
    for i in range(d):
        wxi = w * x[i]
        for j in range(d):
            s[base + i * d + j] += wxi * x[j]


@njit(cache=True, nogil=True)
def posterior_inverse_scale(s, p, T, m):
    """Fill T (d, d) with T_k and m (d,) with m_k of eq. B.1; return (c_k, a_k).

    Parameters
    ----------
    s : ndarray of shape (1 + d + d^2,)
    p : ndarray of shape (d + 3 + d^2,)
    T : ndarray of shape (d, d), output
    m : ndarray of shape (d,), output
    """
    d = m.shape[0]
    n = s[0]
    c0 = p[d]
    a0 = p[d + 1]
    ck = c0 + n
    for i in range(d):
        m[i] = (c0 * p[i] + s[1 + i]) / ck
    base_s = 1 + d
    base_p = d + 3
    for i in range(d):
        for j in range(d):
            T[i, j] = (
                p[base_p + i * d + j]
                + s[base_s + i * d + j]
                + c0 * p[i] * p[j]
                - ck * m[i] * m[j]
            )
    # symmetrise: the two triangles were computed by the same formula but rounding differs
    for i in range(d):
        for j in range(i):
            v = 0.5 * (T[i, j] + T[j, i])
            T[i, j] = v
            T[j, i] = v
    return ck, a0 + n


@njit(cache=True, nogil=True)
def cholesky_inplace(A):
    """Lower Cholesky factor of A (d, d) written over A's lower triangle; upper set to 0.

    Returns False if A is not numerically positive definite.
    """
    d = A.shape[0]
    for j in range(d):
        acc = A[j, j]
        for k in range(j):
            acc -= A[j, k] * A[j, k]
        if not acc > 0.0:
            return False
        ljj = math.sqrt(acc)
        A[j, j] = ljj
        for i in range(j + 1, d):
            acc = A[i, j]
            for k in range(j):
                acc -= A[i, k] * A[j, k]
            A[i, j] = acc / ljj
        for i in range(j):
            A[i, j] = 0.0
    return True


@njit(cache=True, nogil=True)
def _finish_cache(c, d, ck, ak, logdet):
    """Fill the scalar tail of the cache from (c_k, a_k, log|T_k|)."""
    o = d * d + 2 * d
    c[o] = ck
    c[o + 1] = ak
    c[o + 2] = logdet
    nu = ak - d + 1.0
    c[o + 3] = (
        math.lgamma(0.5 * (nu + d))
        - math.lgamma(0.5 * nu)
        - 0.5 * d * (math.log(nu) + LOG_PI)
        + 0.5 * (d * math.log(ck * nu / (ck + 1.0)) - logdet)
    )


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Recompute the cache (Cholesky factor of T_k, m_k, constants) from the statistics."""
    d = dim_of_stats(s)
    T = np.empty((d, d))
    m = np.empty(d)
    ck, ak = posterior_inverse_scale(s, p, T, m)
    if not cholesky_inplace(T):
        raise ValueError("Normal-Wishart posterior inverse scale is not positive definite")
    logdet = 0.0
    for i in range(d):
        logdet += 2.0 * math.log(T[i, i])
        for j in range(d):
            c[i * d + j] = T[i, j]
        c[d * d + i] = m[i]
        c[d * d + d + i] = 1.0 / T[i, i]
    _finish_cache(c, d, ck, ak, logdet)


@njit(cache=True, nogil=True)
def _rank_one(L, v, sign):
    """L L^T + sign v v^T -> L L^T in place (L lower, flat d * d); v is overwritten.

    Returns False when a downdate loses positive definiteness.
    """
    d = v.shape[0]
    for k in range(d):
        lkk = L[k * d + k]
        r2 = lkk * lkk + sign * v[k] * v[k]
        if not r2 > 0.0:
            return False
        r = math.sqrt(r2)
        cs = r / lkk
        sn = v[k] / lkk
        L[k * d + k] = r
        for i in range(k + 1, d):
            lik = (L[i * d + k] + sign * sn * v[i]) / cs
            L[i * d + k] = lik
            v[i] = cs * v[i] - sn * lik
    return True


@njit(cache=True, nogil=True)
def update(x, s, c, p, w):
    """Add (w = +1) or remove (w = -1) record x: statistics and a rank-one Cholesky update.

    Adding x to a cluster with (c_k, m_k) changes T_k by c_k / (c_k + 1) (x - m_k)(x - m_k)^T;
    removing it changes T_k by -c_k' / c_k (x - m_k')(x - m_k')^T with c_k' = c_k - 1 and m_k'
    the mean without x. Cost O(d^2).
    """
    d = x.shape[0]
    add_stats(x, s, w)
    o = d * d
    ck = c[o + 2 * d]
    v = np.empty(d)
    if w > 0:
        coef = math.sqrt(ck / (ck + 1.0))
        for i in range(d):
            v[i] = coef * (x[i] - c[o + i])
            c[o + i] = (ck * c[o + i] + x[i]) / (ck + 1.0)
        ok = _rank_one(c, v, 1.0)
        ck_new = ck + 1.0
    else:
        ck_new = ck - 1.0
        coef = math.sqrt(ck_new / ck)
        for i in range(d):
            mi = (ck * c[o + i] - x[i]) / ck_new
            c[o + i] = mi
            v[i] = coef * (x[i] - mi)
        ok = _rank_one(c, v, -1.0)
    if not ok:
        # rounding made the downdate indefinite: rebuild from the statistics
        refresh(s, c, p)
        return
    logdet = 0.0
    for i in range(d):
        lii = c[i * d + i]
        logdet += 2.0 * math.log(lii)
        c[o + d + i] = 1.0 / lii
    _finish_cache(c, d, ck_new, c[o + 2 * d + 1] + w, logdet)


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """log p(x | X): the multivariate Student-t of Appendix B. O(d^2): one forward solve."""
    d = x.shape[0]
    o = d * d
    ck = c[o + 2 * d]
    ak = c[o + 2 * d + 1]
    nu = ak - d + 1.0
    # forward substitution y = L^{-1} (x - m), accumulating |y|^2
    y = np.empty(d)
    q = 0.0
    for i in range(d):
        acc = x[i] - c[o + i]
        row = i * d
        for j in range(i):
            acc -= c[row + j] * y[j]
        yi = acc * c[o + d + i]
        y[i] = yi
        q += yi * yi
    return c[o + 2 * d + 3] - 0.5 * (nu + d) * math.log1p(q * ck / (ck + 1.0))


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """log p(X) with the Normal-Wishart parameters integrated out.

    log p(X) = -n d / 2 log pi + log Gamma_d(a_n / 2) - log Gamma_d(a0 / 2)
               + a0 / 2 log|T0| - a_n / 2 log|T_n| + d / 2 (log c0 - log c_n)
    """
    n = s[0]
    if n == 0.0:
        return 0.0
    d = dim_of_stats(s)
    T = np.empty((d, d))
    m = np.empty(d)
    ck, ak = posterior_inverse_scale(s, p, T, m)
    if not cholesky_inplace(T):
        raise ValueError("Normal-Wishart posterior inverse scale is not positive definite")
    logdet = 0.0
    for i in range(d):
        logdet += 2.0 * math.log(T[i, i])
    c0 = p[d]
    a0 = p[d + 1]
    return (
        -0.5 * n * d * LOG_PI
        + lmvgamma(0.5 * ak, d)
        - lmvgamma(0.5 * a0, d)
        + 0.5 * a0 * p[d + 2]
        - 0.5 * ak * logdet
        + 0.5 * d * (math.log(c0) - math.log(ck))
    )
