"""What the per-column conjugate families (Raykov et al. 2016, Appendix B) share: statistics that
start with n and sum x (d), and the count families' tables."""

import math

import numpy as np
from numba import njit

from kernels.special import lbeta


@njit(cache=True, nogil=True)
def add_count_sum(x, s, w):
    """s[0] += w and s[1 + j] += w x_j: the count and per-column sums every family starts with."""
    d = x.shape[0]
    s[0] += w
    for j in range(d):
        s[1 + j] += w * x[j]


@njit(cache=True, nogil=True)
def any_negative(x):
    """True when some x_j < 0 (outside the support of the count and exponential families)."""
    for j in range(x.shape[0]):
        if x[j] < 0.0:
            return True
    return False


COUNT_TABLE = 32
"""Counts 0..COUNT_TABLE-1 have their predictive cached per cluster and column (Poisson and
geometric): most real count columns stay below it, and a larger count falls back to lgamma."""


@njit(cache=True, nogil=True)
def table_width(c, d):
    """T of a cache laid out as 2 d + 1 numbers then a d x T table (``COUNT_TABLE`` or 0)."""
    return (c.shape[0] - 2 * d - 1) // d


@njit(cache=True, nogil=True)
def table_index(xj, T):
    """The table column of the count xj, or -1 when it is not an integer in 0..T-1."""
    if xj >= 0.0 and xj < T and xj == math.floor(xj):
        return int(xj)
    return -1


@njit(cache=True, nogil=True)
def table_log_predictive(x, c, poisson):
    """log p(x | X) of the count families whose cache holds 2 d + 1 numbers and then the d x T
    table (Poisson, ``poisson`` True, and geometric): a table read per column for counts below
    T, lgamma beyond; -inf for a negative count."""
    if any_negative(x):
        return -np.inf
    d = x.shape[0]
    T = table_width(c, d)
    out = c[2 * d]
    for j in range(d):
        xj = x[j]
        v = table_index(xj, T)
        if v >= 0:
            out += c[2 * d + 1 + j * T + v]
        elif poisson:
            out += math.lgamma(c[j] + xj) - math.lgamma(xj + 1.0) - xj * c[d + j]
        else:
            out += math.lgamma(c[j] + xj) - math.lgamma(c[d + j] + xj)
    return out


@njit(cache=True, nogil=True)
def count_sum_posterior(s, p, j):
    """(a + n, b + sum x_j) of column j for a prior layout a (d), b (d)."""
    d = p.shape[0] // 2
    return p[j] + s[0], p[d + j] + s[1 + j]


@njit(cache=True, nogil=True)
def gamma_log_evidence(a, b, an, bn):
    """a log b - lgamma(a) + lgamma(a_n) - a_n log b_n: the Gamma prior-to-posterior normaliser
    ratio of one column (the Gamma-Poisson and Gamma-exponential marginals)."""
    return a * math.log(b) - math.lgamma(a) + math.lgamma(an) - an * math.log(bn)


@njit(cache=True, nogil=True)
def count_sum_log_marginal(s, p, beta):
    """sum_j of the Beta (``beta`` True) or Gamma prior-to-posterior ratio of column j at
    (a + n, b + sum x_j): the log marginal of the geometric and exponential columns; 0 for n = 0.
    """
    if s[0] == 0.0:
        return 0.0
    d = p.shape[0] // 2
    out = 0.0
    for j in range(d):
        an, bn = count_sum_posterior(s, p, j)
        if beta:
            out += beta_log_evidence(p[j], p[d + j], an, bn)
        else:
            out += gamma_log_evidence(p[j], p[d + j], an, bn)
    return out


@njit(cache=True, nogil=True)
def beta_log_evidence(a, b, an, bn):
    """log B(a_n, b_n) - log B(a, b): the Beta prior-to-posterior normaliser ratio of one column
    (the beta-geometric and beta-binomial marginals)."""
    return lbeta(an, bn) - lbeta(a, b)


@njit(cache=True, nogil=True)
def count_sum_moments(s, p, mean, cov):
    """mean (d,) = sum x_j / n of statistics s starting (n, sum x (d)), NaN for n = 0; cov
    (d, d) all NaN. The count families' moments, and the others' start."""
    d = mean.shape[0]
    cov[:, :] = np.nan
    n = s[0]
    for j in range(d):
        mean[j] = s[1 + j] / n if n > 0.0 else np.nan
