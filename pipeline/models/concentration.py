"""The DP concentration N0: MAP estimate under a Gamma prior (Raykov et al. 2016, Appendix A, eq.
A.1)."""

from __future__ import annotations

import math

from scipy.special import digamma, gammaln, polygamma


def log_posterior(alpha: float, n: int, k: int, a: float, b: float) -> float:
    """log p(N0 | N, K) up to a constant, eq. A.1:
    log Gamma(N0) - log Gamma(N0 + N) + (K + a - 1) log N0 - b N0."""
    return float(gammaln(alpha) - gammaln(alpha + n) + (k + a - 1.0) * math.log(alpha) - b * alpha)


def map_concentration(
    n: int, k: int, a: float = 1.0, b: float = 1.0, start: float = 1.0, tol: float = 1e-10
) -> float:
    """The mode of eq. A.1 in N0 for N = ``n`` records and K = ``k`` clusters under a Gamma(a,
    rate b) prior, by Newton's method on t = log N0 from ``start`` (Appendix A, after Rasmussen
    1999), each step halved until the log posterior does not decrease.
    """
    if n <= 0:
        return start
    t = math.log(max(start, 1e-8))
    f = log_posterior(math.exp(t), n, k, a, b)
    c = k + a - 1.0
    for _ in range(100):
        al = math.exp(t)
        # derivatives of g(t) = log Gamma(e^t) - log Gamma(e^t + N) + c t - b e^t
        d1 = al * (digamma(al) - digamma(al + n)) + c - b * al
        d2 = (
            al * (digamma(al) - digamma(al + n))
            + al * al * (polygamma(1, al) - polygamma(1, al + n))
            - b * al
        )
        step = -d1 / d2 if d2 < 0 else math.copysign(1.0, d1)
        while True:
            t_new = min(max(t + step, -30.0), 30.0)
            f_new = log_posterior(math.exp(t_new), n, k, a, b)
            if f_new >= f - 1e-12 or abs(step) < 1e-12:
                break
            step *= 0.5
        if abs(t_new - t) < tol:
            t, f = t_new, f_new
            break
        t, f = t_new, f_new
    return math.exp(t)


def log_gamma_prior(alpha: float, a: float, b: float) -> float:
    """log Gamma(alpha; shape a, rate b)."""
    return float(a * math.log(b) - gammaln(a) + (a - 1.0) * math.log(alpha) - b * alpha)
