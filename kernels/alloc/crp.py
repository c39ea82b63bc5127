"""The Chinese restaurant process: the partition prior of the Dirichlet process.

Raykov et al. 2016, eq. 2.3 (De Bacco and Valera, the CRP): for N records in K blocks of sizes
N_1..N_K and concentration N0 = alpha,

    p(z_1..z_N) = Gamma(alpha) / Gamma(N + alpha) alpha^K prod_k Gamma(N_k)

so a block of n records carries kappa(n) = alpha Gamma(n) (Lee and Choi 2015, eq. 5 in the limit
sigma -> 0, with the partition-independent (1 + u)^(-n) dropped) and the rest is the constant
Gamma(alpha) / Gamma(N + alpha). Every MAP-DP cost (Raykov et al. 2016, eqs. 3.1-3.2), BHC's d_k and
r_k (Xu et al. 2009, eqs. 7-8) and the merge gaps of MAP-DP and Bayes K-means are built from the
four functions below. The concentration enters as ``log_alpha`` where the callers keep its log (the
hot loops) and as ``alpha`` where a Gamma function of it is needed.
"""

import math

from numba import njit


@njit(cache=True, nogil=True)
def log_kappa(n, log_alpha):
    """log kappa(n) = log alpha + log Gamma(n): the weight of one block of n records.

    BHC's alpha Gamma(n_k) (Xu et al. 2009, Section 3: d_k, pi_k) and a summary leaf's d_i.

    Parameters
    ----------
    n : float
        Block size in records (> 0).
    log_alpha : float

    Returns
    -------
    float
    """
    return log_alpha + math.lgamma(n)


@njit(cache=True, nogil=True)
def log_join(n):
    """log kappa(n + 1) / kappa(n) = log n: the weight of one record joining a block of n records
    (the log N_{k,-i} of Raykov et al. 2016, eqs. 2.7, 3.1).

    Parameters
    ----------
    n : float
        Size of the block joined (> 0).

    Returns
    -------
    float
    """
    return math.log(n)


@njit(cache=True, nogil=True)
def log_new(log_alpha):
    """log kappa(1) = log alpha: the weight of one record opening a new block (the log N0 of seed
    000 eq. 3.2).

    Parameters
    ----------
    log_alpha : float

    Returns
    -------
    float
    """
    return log_alpha


@njit(cache=True, nogil=True)
def merge_gap(na, nb, log_alpha):
    """Change of log p(z) (eq. 2.3) when blocks of na and nb records merge:
    log kappa(na + nb) - log kappa(na) - log kappa(nb)
    = log Gamma(na + nb) - log Gamma(na) - log Gamma(nb) - log alpha.

    Parameters
    ----------
    na, nb : float
        Block sizes (> 0).
    log_alpha : float

    Returns
    -------
    float
    """
    return math.lgamma(na + nb) - math.lgamma(na) - math.lgamma(nb) - log_alpha


@njit(cache=True, nogil=True)
def log_constant(n, alpha):
    """log Gamma(alpha) - log Gamma(alpha + n): the partition-independent factor of eq. 2.3 for
    n records."""
    return math.lgamma(alpha) - math.lgamma(alpha + n)


@njit(cache=True, nogil=True)
def log_eppf(sizes, K, alpha):
    """log p(z_1..z_N) of the CRP, Raykov et al. 2016, eq. 2.3: log Gamma(alpha) - log Gamma(N +
    alpha) + K' log alpha + sum_k log Gamma(N_k), over the non-empty entries among the first K.

    Parameters
    ----------
    sizes : ndarray of shape (>= K,)
        Block sizes in records; entries <= 0 (free slots) are skipped.
    K : int
    alpha : float

    Returns
    -------
    float
    """
    n = 0.0
    n_blocks = 0
    out = 0.0
    for k in range(K):
        if sizes[k] > 0.0:
            n += sizes[k]
            n_blocks += 1
            out += math.lgamma(sizes[k])
    return out + math.lgamma(alpha) - math.lgamma(n + alpha) + n_blocks * math.log(alpha)
