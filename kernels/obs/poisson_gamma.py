"""Independent Poisson count columns with Gamma priors (Raykov et al. 2016, Appendix B, "Poisson"
row).

Per column j: lambda ~ Gamma(a, rate b), x | lambda ~ Poisson(lambda). After n records with
sum x = u: a_n = a + u, b_n = b + n.

    predictive (negative binomial with a_n successes and success probability b_n / (b_n + 1)):
        log p(x | X) = lgamma(a_n + x) - lgamma(a_n) - lgamma(x + 1)
                       + a_n log(b_n / (b_n + 1)) - x log(b_n + 1)
    marginal:
        log p(X) = sum_j [a log b - lgamma(a) + lgamma(a_n) - a_n log b_n - sum_i log x_ij!]

The statistics carry sum log x! so the marginal is the exact probability of the counts.

Layouts for d columns
---------------------
stats ``s`` (1 + 2 d): n, sum x (d), sum lgamma(x + 1) (d).
prior ``p`` (2 d): a (d), b (d).
cache ``c`` (2 d + 1 + d T): a_n (d), log(b_n + 1) (d),
sum_j [a_n log(b_n / (b_n + 1)) - lgamma(a_n)], and each column's lgamma(a_n + v)
- lgamma(v + 1) - v log(b_n + 1) over v = 0..T-1 (T = ``COUNT_TABLE``; filled by the ratios of
consecutive terms): counts below T are d table reads, others lgamma.
"""

import math

from numba import njit

from kernels.obs._common import (
    add_count_sum,
    count_sum_moments,
    gamma_log_evidence,
    table_log_predictive,
    table_width,
)


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, x, log x!)."""
    add_count_sum(x, s, w)
    d = x.shape[0]
    for j in range(d):
        s[1 + d + j] += w * math.lgamma(x[j] + 1.0)


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Posterior shape, log(rate + 1), the summed constant and the predictive table."""
    d = p.shape[0] // 2
    T = table_width(c, d)
    n = s[0]
    const = 0.0
    for j in range(d):
        an = p[j] + s[1 + j]
        bn = p[d + j] + n
        l1 = math.log1p(bn)
        c[j] = an
        c[d + j] = l1
        lg = math.lgamma(an)
        const += an * (math.log(bn) - l1) - lg
        row = 2 * d + 1 + j * T
        t = lg
        for v in range(T):
            c[row + v] = t
            t += math.log((an + v) / (v + 1.0)) - l1
    c[2 * d] = const


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """Negative binomial log probability of the counts x (-inf for a negative count): a table
    read per column for counts below T, lgamma beyond."""
    return table_log_predictive(x, c, True)


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """Gamma-Poisson log marginal likelihood of the counts."""
    n = s[0]
    if n == 0.0:
        return 0.0
    d = p.shape[0] // 2
    out = 0.0
    for j in range(d):
        a = p[j]
        b = p[d + j]
        an = a + s[1 + j]
        bn = b + n
        out += gamma_log_evidence(a, b, an, bn) - s[1 + d + j]
    return out


moments = count_sum_moments
"""Mean sum x_j / n of each column; the covariance is not determined (NaN)."""
