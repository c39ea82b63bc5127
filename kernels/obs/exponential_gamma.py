"""Independent exponential columns with Gamma priors (Raykov et al. 2016, Appendix B, "Exponential"
row).

Per column j: lambda ~ Gamma(a, rate b), x | lambda ~ Exponential(rate lambda) on x >= 0. After n
records with sum x = u: a_n = a + n, b_n = b + u.

    predictive (Lomax, shape a_n, scale b_n):
        p(x | X) = a_n b_n^a_n / (b_n + x)^(a_n + 1)
    marginal:
        log p(X) = sum_j [a log b - lgamma(a) + lgamma(a_n) - a_n log b_n]

Layouts for d columns
---------------------
stats ``s`` (1 + d): n, sum x (d).
prior ``p`` (2 d): a (d), b (d).
cache ``c`` (2 d + 1): b_n (d), a_n + 1 (d), sum_j [log a_n + a_n log b_n].
"""

import math

import numpy as np
from numba import njit

from kernels.obs._common import (
    add_count_sum,
    any_negative,
    count_sum_log_marginal,
    count_sum_moments,
    count_sum_posterior,
)

add_stats = add_count_sum
"""s += w * (1, x)."""


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Posterior scale b_n, exponent a_n + 1 and the summed Lomax constant."""
    d = p.shape[0] // 2
    const = 0.0
    for j in range(d):
        an, bn = count_sum_posterior(s, p, j)
        c[j] = bn
        c[d + j] = an + 1.0
        const += math.log(an) + an * math.log(bn)
    c[2 * d] = const


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """Lomax log density of x (-inf for x < 0)."""
    if any_negative(x):
        return -np.inf
    d = x.shape[0]
    out = c[2 * d]
    for j in range(d):
        out -= c[d + j] * math.log(c[j] + x[j])
    return out


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """Gamma-exponential log marginal likelihood."""
    return count_sum_log_marginal(s, p, False)


moments = count_sum_moments
"""Mean sum x_j / n of each column; the covariance is not determined (NaN)."""
