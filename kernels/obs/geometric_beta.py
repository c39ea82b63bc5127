"""Independent geometric columns with Beta priors (Raykov et al. 2016, Appendix B, "Geometric" row).

Per column j: theta ~ Beta(a, b), x | theta ~ Geometric(theta) on {0, 1, 2, ...} (failures before
the first success), p(x | theta) = theta (1 - theta)^x. After n records with sum x = u:
a_n = a + n, b_n = b + u.

    predictive ("ratio of beta functions"):
        p(x | X) = B(a_n + 1, b_n + x) / B(a_n, b_n)
                 = a_n Gamma(b_n + x) Gamma(a_n + b_n) / (Gamma(b_n) Gamma(a_n + b_n + x + 1))
    marginal:
        log p(X) = sum_j [log B(a_n, b_n) - log B(a, b)]

Layouts for d columns
---------------------
stats ``s`` (1 + d): n, sum x (d).
prior ``p`` (2 d): a (d), b (d).
cache ``c`` (2 d + 1 + d T): b_n (d), a_n + b_n + 1 (d),
sum_j [log a_n + lgamma(a_n + b_n) - lgamma(b_n)], and each column's lgamma(b_n + v)
- lgamma(a_n + b_n + 1 + v) over v = 0..T-1 (T = ``COUNT_TABLE``; filled by the ratios of
consecutive terms): counts below T are d table reads, others lgamma.
"""

import math

from numba import njit

from kernels.obs._common import (
    add_count_sum,
    count_sum_log_marginal,
    count_sum_moments,
    count_sum_posterior,
    table_log_predictive,
    table_width,
)

add_stats = add_count_sum
"""s += w * (1, x)."""


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Posterior b_n, a_n + b_n + 1, the summed constant and the predictive table."""
    d = p.shape[0] // 2
    T = table_width(c, d)
    const = 0.0
    for j in range(d):
        an, bn = count_sum_posterior(s, p, j)
        c[j] = bn
        c[d + j] = an + bn + 1.0
        lg_b = math.lgamma(bn)
        const += math.log(an) + math.lgamma(an + bn) - lg_b
        row = 2 * d + 1 + j * T
        t = lg_b - math.lgamma(an + bn + 1.0)
        for v in range(T):
            c[row + v] = t
            t += math.log((bn + v) / (an + bn + 1.0 + v))
    c[2 * d] = const


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """log B(a_n + 1, b_n + x) - log B(a_n, b_n) summed over columns (-inf for x < 0): a table
    read per column for counts below T, lgamma beyond."""
    return table_log_predictive(x, c, False)


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """Beta-geometric log marginal likelihood."""
    return count_sum_log_marginal(s, p, True)


moments = count_sum_moments
"""Mean sum x_j / n of each column; the covariance is not determined (NaN)."""
