"""Special functions and log-space arithmetic the kernels share, as numba scalars."""

import math

import numpy as np
from numba import njit

LOG_PI = math.log(math.pi)


@njit(cache=True, nogil=True)
def lmvgamma(a, d):
    """log Gamma_d(a) = d (d - 1) / 4 log(pi) + sum_{j=1..d} log Gamma(a + (1 - j) / 2), for
    a > (d - 1) / 2."""
    out = 0.25 * d * (d - 1) * LOG_PI
    for j in range(d):
        out += math.lgamma(a - 0.5 * j)
    return out


@njit(cache=True, nogil=True)
def log_gamma_ratio(a, d, r):
    """log [Gamma(a + d / 2) / Gamma(a) r^(d / 2)] (a, r > 0, d >= 0), the Student-t constant's
    ratio (Raykov et al. 2016, Appendix B): the product of the factors (a + j) r, a logarithm
    every eight (odd d starts with lgamma(a + 1/2) - lgamma(a)), which keeps the digits a
    difference of large lgamma loses."""
    out = 0.0
    if d % 2 == 1:
        out = math.lgamma(a + 0.5) - math.lgamma(a) + 0.5 * math.log(r)
        a += 0.5
    m = d // 2
    j = 0
    while j < m:
        prod = (a + j) * r
        stop = min(m, j + 8)
        j += 1
        while j < stop:
            prod *= (a + j) * r
            j += 1
        out += math.log(prod)
    return out


@njit(cache=True, nogil=True)
def lbeta(a, b):
    """log B(a, b) = log Gamma(a) + log Gamma(b) - log Gamma(a + b)."""
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


@njit(cache=True, nogil=True)
def digamma(x):
    """Digamma function psi(x) for x > 0 (recurrence to x >= 6, then the asymptotic series)."""
    out = 0.0
    while x < 6.0:
        out -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    out += (
        math.log(x)
        - 0.5 / x
        - f * (1.0 / 12 - f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f / 132))))
    )
    return out


@njit(cache=True, nogil=True)
def log1pexp(t):
    """log(1 + e^t) without overflow."""
    if t > 0.0:
        return t + math.log1p(math.exp(-t))
    return math.log1p(math.exp(t))


@njit(cache=True, nogil=True)
def logaddexp(a, b):
    """log(e^a + e^b), exact when either is -inf."""
    if a == -np.inf:
        return b
    if b == -np.inf:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True, nogil=True)
def logsumexp(a, n):
    """log sum_i exp(a[i]) over the first n entries of a (ndarray of shape (>= n,)); -inf when
    every term is -inf."""
    m = -np.inf
    for i in range(n):
        if a[i] > m:
            m = a[i]
    if m == -np.inf:
        return m
    s = 0.0
    for i in range(n):
        s += math.exp(a[i] - m)
    return m + math.log(s)
