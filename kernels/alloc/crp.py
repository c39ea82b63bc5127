"""The Chinese restaurant process, the Dirichlet process's partition prior (Raykov et al. 2016,
eq. 2.3): for N records in blocks of sizes N_1..N_K and concentration N0 = alpha,

    p(z_1..z_N) = Gamma(alpha) / Gamma(N + alpha) alpha^K prod_k Gamma(N_k)

a block of n records carries kappa(n) = alpha Gamma(n) (Lee and Choi 2015, eq. 5 as sigma -> 0,
without (1 + u)^(-n)), the rest is a constant. Block sizes and alpha are floats; ``log_alpha``
where the hot loops keep the log.
"""

import math

from numba import njit


@njit(cache=True, nogil=True)
def log_kappa(n, log_alpha):
    """log kappa(n) = log alpha + log Gamma(n), the weight of a block of n > 0 records (BHC's
    alpha Gamma(n_k), Xu et al. 2009, Section 3)."""
    return log_alpha + math.lgamma(n)


@njit(cache=True, nogil=True)
def log_join(n):
    """log kappa(n + 1) / kappa(n) = log n, a record joining a block of n > 0 (the log N_{k,-i}
    of eqs. 2.7, 3.1)."""
    return math.log(n)


@njit(cache=True, nogil=True)
def log_new(log_alpha):
    """log kappa(1) = log alpha, a record opening a block (the log N0 of eq. 3.2)."""
    return log_alpha


@njit(cache=True, nogil=True)
def merge_gap(na, nb, log_alpha):
    """The change of log p(z) when blocks of na, nb > 0 records merge: log Gamma(na + nb)
    - log Gamma(na) - log Gamma(nb) - log alpha."""
    return math.lgamma(na + nb) - math.lgamma(na) - math.lgamma(nb) - log_alpha


@njit(cache=True, nogil=True)
def log_constant(n, alpha):
    """log Gamma(alpha) - log Gamma(alpha + n): the partition-independent factor of eq. 2.3 for
    n records."""
    return math.lgamma(alpha) - math.lgamma(alpha + n)


@njit(cache=True, nogil=True)
def log_eppf(sizes, K, alpha):
    """log p(z_1..z_N), eq. 2.3, of the block sizes sizes[:K] (ndarray (>= K,); entries <= 0,
    free slots, skipped)."""
    n = 0.0
    n_blocks = 0
    out = 0.0
    for k in range(K):
        if sizes[k] > 0.0:
            n += sizes[k]
            n_blocks += 1
            out += math.lgamma(sizes[k])
    return out + math.lgamma(alpha) - math.lgamma(n + alpha) + n_blocks * math.log(alpha)
