"""One categorical column with a Dirichlet prior (Raykov et al. 2016, Appendix B, "Categorical"
row).

x[0] is the category code 0..C-1 stored as a float; theta ~ Dirichlet(alpha_1..alpha_C). With
counts n_c of the n records and A = sum_c alpha_c:

    predictive (Dirichlet-multinomial, one draw): p(x = c | X) = (alpha_c + n_c) / (A + n)
    marginal: log p(X) = lgamma(A) - lgamma(A + n) + sum_c [lgamma(alpha_c + n_c) - lgamma(alpha_c)]

(the probability of the sequence of codes, without the multinomial coefficient).

Layouts for C categories
------------------------
stats ``s`` (1 + C): n, counts n_c (C).
prior ``p`` (C + 2): alpha (C), A = sum alpha, lgamma(A) - sum_c lgamma(alpha_c).
cache ``c`` (C + 1): log(alpha_c + n_c) (C), log(A + n). ``update`` touches two entries: O(1).

A code outside 0..C-1 has probability 0 and cannot be added (``Categorical.check_values``).
"""

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _code(x, C):
    v = x[0]
    if not (v >= 0.0 and v < C):
        return -1
    return int(v)


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, one_hot(x))."""
    C = s.shape[0] - 1
    k = _code(x, C)
    if k < 0:
        raise ValueError("categorical code outside 0..C-1")
    s[0] += w
    s[1 + k] += w


@njit(cache=True, nogil=True)
def refresh(s, c, p):
    """c = log(alpha + counts), log(A + n)."""
    C = s.shape[0] - 1
    for k in range(C):
        c[k] = math.log(p[k] + s[1 + k])
    c[C] = math.log(p[C] + s[0])


@njit(cache=True, nogil=True)
def update(x, s, c, p, w):
    """Add / remove one record: only the record's category and the total change. O(1)."""
    C = s.shape[0] - 1
    add_stats(x, s, w)
    k = _code(x, C)
    c[k] = math.log(p[k] + s[1 + k])
    c[C] = math.log(p[C] + s[0])


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """log (alpha_x + n_x) / (A + n)."""
    C = s.shape[0] - 1
    k = _code(x, C)
    if k < 0:
        return -np.inf
    return c[k] - c[C]


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """Dirichlet-multinomial log probability of the sequence of codes."""
    n = s[0]
    if n == 0.0:
        return 0.0
    C = s.shape[0] - 1
    out = p[C + 1] - math.lgamma(p[C] + n)
    for k in range(C):
        out += math.lgamma(p[k] + s[1 + k])
    return out


@njit(cache=True, nogil=True)
def moments(s, p, mean, cov):
    """mean (1,) and variance cov (1, 1) of s's codes (NaN for n = 0; p unused)."""
    n = s[0]
    if not n > 0.0:
        mean[0] = np.nan
        cov[0, 0] = np.nan
        return
    m1 = 0.0
    m2 = 0.0
    for k in range(s.shape[0] - 1):
        m1 += k * s[1 + k]
        m2 += k * k * s[1 + k]
    mean[0] = m1 / n
    cov[0, 0] = m2 / n - mean[0] * mean[0]
