"""Independent binomial columns with Beta priors (Raykov et al. 2016, Appendix B, "Binomial" row).

Per column j with a known number of trials N_j (Bernoulli: N_j = 1): theta ~ Beta(a, b),
x | theta ~ Binomial(N_j, theta) on {0..N_j}. After n records with sum x = u:
a_n = a + u, b_n = b + n N_j - u.

    predictive (beta-binomial):
        log p(x | X) = log C(N, x) + log B(a_n + x, b_n + N - x) - log B(a_n, b_n)
    marginal:
        log p(X) = sum_j [sum_i log C(N_j, x_ij) + log B(a_n, b_n) - log B(a, b)]

the exact probability of the counts: ``add_stats`` sees no N_j, so the statistics keep each
column's histogram over 0..H-1, H = max_j N_j + 1, and the prior the log C table.

Layouts for d columns, H = max_j N_j + 1
----------------------------------------
stats ``s`` (1 + d + d H): n, sum x (d), hist (d * H, row j = the counts of x_j = 0..H-1).
prior ``p`` (3 d + d H): N (d), a (d), b (d), log C(N_j, v) (d * H, row major; 0 for v > N_j).
cache ``c`` (2 d + 1 + d H): a_n (d), b_n (d), the summed constant
sum_j [lgamma(a_n + b_n) - lgamma(a_n + b_n + N_j) - lgamma(a_n) - lgamma(b_n)], and each
column's predictive log p(x_j = v | X) over v = 0..H-1 (-inf for v > N_j): d table reads.
d = (len(p) - len(s) + 1) / 2, H = (len(s) - 1 - d) / d.
"""

import math

import numpy as np
from numba import njit

from kernels.obs._common import beta_log_evidence, count_sum_moments


@njit(cache=True, nogil=True)
def _dims(s, p):
    d = (p.shape[0] - s.shape[0] + 1) // 2
    return d, (s.shape[0] - 1 - d) // d


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, x, one_hot(x_j) per column). Raises for a count outside 0..H-1 or not an
    integer (the public ``Binomial.check_values`` reports the row)."""
    d = x.shape[0]
    H = (s.shape[0] - 1 - d) // d
    s[0] += w
    for j in range(d):
        xj = x[j]
        if not (xj >= 0.0 and xj < H) or xj != math.floor(xj):
            raise ValueError("binomial count must be an integer in 0..n_trials")
        s[1 + j] += w * xj
        s[1 + d + j * H + int(xj)] += w


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """Posterior (a_n, b_n) per column and the summed beta-binomial constant."""
    d, H = _dims(s, p)
    n = s[0]
    const = 0.0
    for j in range(d):
        N = p[j]
        an = p[d + j] + s[1 + j]
        bn = p[2 * d + j] + n * N - s[1 + j]
        c[j] = an
        c[d + j] = bn
        cj = math.lgamma(an + bn) - math.lgamma(an + bn + N) - math.lgamma(an) - math.lgamma(bn)
        const += cj
        row = 2 * d + 1 + j * H
        for v in range(H):
            if v <= N:
                log_c = p[3 * d + j * H + v]
                c[row + v] = cj + log_c + math.lgamma(an + v) + math.lgamma(bn + N - v)
            else:
                c[row + v] = -np.inf
    c[2 * d] = const


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """Beta-binomial log probability of the counts x (-inf outside 0..N_j or non-integer), read
    from the cached table: O(d)."""
    d, H = _dims(s, p)
    out = 0.0
    for j in range(d):
        xj = x[j]
        if not (xj >= 0.0 and xj < H) or xj != math.floor(xj):
            return -np.inf
        out += c[2 * d + 1 + j * H + int(xj)]
    return out


@njit(cache=True, nogil=True)
def log_predictive_loo(x, s, c, p):
    """log p(x | X without x) of a member x of (s, c), O(d N) from the cache:
    sum_j [log C(N_j, x_j) + sum_{i=1..x_j} log(a_n - i) + sum_{i=1..N_j-x_j} log(b_n - i)
    - sum_{i=1..N_j} log(a_n + b_n - i)]."""
    d, H = _dims(s, p)
    out = 0.0
    for j in range(d):
        N = int(p[j])
        xj = x[j]
        if not (xj >= 0.0 and xj <= N) or xj != math.floor(xj):
            return -np.inf
        xi = int(xj)
        an = c[j]
        bn = c[d + j]
        out += p[3 * d + j * H + xi]
        for i in range(1, xi + 1):
            out += math.log(an - i)
        for i in range(1, N - xi + 1):
            out += math.log(bn - i)
        for i in range(1, N + 1):
            out -= math.log(an + bn - i)
    return out


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """Beta-binomial log marginal likelihood of the counts."""
    n = s[0]
    if n == 0.0:
        return 0.0
    d, H = _dims(s, p)
    out = 0.0
    for j in range(d):
        N = p[j]
        a = p[d + j]
        b = p[2 * d + j]
        an = a + s[1 + j]
        bn = b + n * N - s[1 + j]
        out += beta_log_evidence(a, b, an, bn)
        row_s = 1 + d + j * H
        row_p = 3 * d + j * H
        for v in range(H):
            hv = s[row_s + v]
            if hv != 0.0:
                out += hv * p[row_p + v]
    return out


@njit(cache=True, nogil=True)
def moments(s, p, mean, cov):
    """mean (d,) and cov's diagonal (d, d) of s's counts from the histograms (off-diagonal NaN,
    all NaN for n = 0)."""
    count_sum_moments(s, p, mean, cov)
    d, H = _dims(s, p)
    n = s[0]
    for j in range(d):
        if not n > 0.0:
            continue
        m2 = 0.0
        for v in range(H):
            m2 += v * v * s[1 + d + j * H + v]
        cov[j, j] = m2 / n - mean[j] * mean[j]
