"""Diagonal Gaussian with an independent Normal-Gamma prior per column (Raykov et al. 2016, Appendix
B).

The diagonal case of ``gaussian_nw``: independent columns, a product of univariate Student-t
predictives (Murphy 2007, "Conjugate Bayesian analysis of the Gaussian distribution", section
3). Per column j,

    tau ~ Gamma(a0, rate b0),   mu | tau ~ N(m0, 1 / (c0 tau)),   x | mu, tau ~ N(mu, 1 / tau).

Posterior after n records with sum x = u and sum x^2 = v:

    c_n = c0 + n,  m_n = (c0 m0 + u) / c_n,  a_n = a0 + n / 2,
    b_n = b0 + 1/2 [sum (x - m0)^2 - (u - n m0)^2 / c_n]
        = b0 + 1/2 [S + c0 n / (c0 + n) (xbar - m0)^2]          (S: scatter about xbar)

Predictive: Student-t with 2 a_n degrees of freedom, location m_n and
scale^2 = b_n (c_n + 1) / (a_n c_n). Marginal likelihood:

    log p(X) = sum_j [lgamma(a_n) - lgamma(a0) + a0 log b0 - a_n log b_n
                      + 1/2 (log c0 - log c_n)] - n d / 2 log(2 pi)

Recorded values (Sheppard's correction, as ``gaussian_nw``): b_n += n h / 2, h = q^2 / 12; the
predictive is then a Student-t on b' = b_n + h / 2 times (b_n / b')^{a_n}.

Layouts for d columns
---------------------
stats ``s`` (1 + 2 d): n, sum x (d), sum x^2 (d).
prior ``p`` (5 d): m0 (d), c0 (d), a0 (d), b0 (d), h (d).
cache ``c`` (3 d + 1): m_n (d), q = c_n / (2 b' (c_n + 1)) (d), a_n + 1/2 (d), and the summed
Student-t normalising constant sum_j [lgamma(a_n + 1/2) - lgamma(a_n)
- 1/2 log(2 pi b' (c_n + 1) / c_n) + a_n log(b_n / b')], so that

    log p(x | X) = const - sum_j (a_n + 1/2) log(1 + q_j (x_j - m_j)^2).
"""

import math

import numpy as np
from numba import njit

from kernels.obs._common import add_count_sum, count_sum_moments

LOG_2PI = math.log(2.0 * math.pi)


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, x, x^2)."""
    add_count_sum(x, s, w)
    d = x.shape[0]
    for j in range(d):
        s[1 + d + j] += w * x[j] * x[j]


@njit(cache=True, nogil=True)
def posterior(s, p, j):
    """(m_n, c_n, a_n, b_n) of column j (module docstring, with the cells' n h / 2)."""
    d = p.shape[0] // 5
    n = s[0]
    m0 = p[j]
    c0 = p[d + j]
    a0 = p[2 * d + j]
    b0 = p[3 * d + j]
    u = s[1 + j]
    v = s[1 + d + j]
    cn = c0 + n
    mn = (c0 * m0 + u) / cn
    dev = u - n * m0
    bn = b0 + 0.5 * ((v - 2.0 * m0 * u + n * m0 * m0) - dev * dev / cn)
    # b_n >= b0 exactly (Cauchy-Schwarz); rounding in the raw moments must not undercut it
    if bn < b0:
        bn = b0
    return mn, cn, a0 + 0.5 * n, bn + 0.5 * n * p[4 * d + j]


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Per-column Student-t location, precision factor and exponent; summed constant."""
    d = p.shape[0] // 5
    const = 0.0
    for j in range(d):
        mn, cn, an, bn = posterior(s, p, j)
        h = p[4 * d + j]
        c[j] = mn
        const += math.lgamma(an + 0.5) - math.lgamma(an) - 0.5 * (LOG_2PI + math.log1p(1.0 / cn))
        if h > 0.0:
            b1 = bn + 0.5 * h
            c[d + j] = cn / (2.0 * b1 * (cn + 1.0))
            const += an * math.log(bn) - (an + 0.5) * math.log(b1)
        else:
            c[d + j] = cn / (2.0 * bn * (cn + 1.0))
            const -= 0.5 * math.log(bn)
        c[2 * d + j] = an + 0.5
    c[3 * d] = const


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """log p(x | X): product of Student-t densities. O(d)."""
    d = x.shape[0]
    out = c[3 * d]
    for j in range(d):
        r = x[j] - c[j]
        out -= c[2 * d + j] * math.log1p(c[d + j] * r * r)
    return out


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """log p(X) with every column's (mu, tau) integrated out (module docstring)."""
    n = s[0]
    if n == 0.0:
        return 0.0
    d = p.shape[0] // 5
    out = -0.5 * n * d * LOG_2PI
    for j in range(d):
        c0 = p[d + j]
        a0 = p[2 * d + j]
        b0 = p[3 * d + j]
        _mn, cn, an, bn = posterior(s, p, j)
        out += (
            math.lgamma(an)
            - math.lgamma(a0)
            + a0 * math.log(b0)
            - an * math.log(bn)
            + 0.5 * (math.log(c0) - math.log(cn))
        )
    return out


@njit(cache=True, nogil=True)
def moments(s, p, mean, cov):
    """mean (d,) and cov's diagonal (d, d) of s's records (off-diagonal NaN; all NaN for n = 0;
    s (1 + 2 d,), p unused)."""
    count_sum_moments(s, p, mean, cov)
    d = mean.shape[0]
    n = s[0]
    for j in range(d):
        cov[j, j] = s[1 + d + j] / n - mean[j] * mean[j] if n > 0.0 else np.nan
