"""Allocation models: the partition priors of normalized random measure (NRM) mixtures.

The observation model (``kernels.obs``) scores the records of a block, the allocation model the
partition; every clustering score in ``kernels`` is the sum of the two: the MAP-DP costs and
objective (Raykov et al. 2016, eqs. 2.3, 3.1-3.3), BHC's d_k and r_k (Xu et al. 2009, eqs. 7-8),
IBHC's potentials and dissimilarities (Lee and Choi 2015, eqs. 8-9), the samplers' ratios.

``crp``
    The Dirichlet process's Chinese restaurant process (Raykov et al. 2016, eq. 2.3).
``nggp``
    The normalized generalized gamma process (Lee and Choi 2015, Section 2.1, Theorem 1).

The functions here dispatch on a prior ``pp``, float64 ndarray of shape (3,): ``(kind, alpha,
sigma)``, for the kernels that serve both (IBHC, tgMCMC, the reference samplers). For the DP,
kappa(n, u) = alpha Gamma(n) (u + 1)^(-n), whose factor (u + 1)^(-n) is the same for every
partition: the DP functions drop it and ignore u.
"""

import math

from numba import njit

from kernels.alloc import crp, nggp

DP = 0
NGGP = 1

# columns of pp
KIND, ALPHA, SIGMA = 0, 1, 2


@njit(cache=True, nogil=True)
def log_kappa(n, u, pp):
    """log kappa(n, u) (Lee and Choi 2015, eq. 5) of a block of n > 0 records under pp (3,)."""
    if pp[KIND] == DP:
        return crp.log_kappa(n, math.log(pp[ALPHA]))
    return nggp.log_kappa(n, u, pp[ALPHA], pp[SIGMA])


@njit(cache=True, nogil=True)
def merge_gap(na, nb, u, pp):
    """The prior's change when blocks of na and nb records merge."""
    if pp[KIND] == DP:
        return crp.merge_gap(na, nb, math.log(pp[ALPHA]))
    return nggp.merge_gap(na, nb, u, pp[ALPHA], pp[SIGMA])


@njit(cache=True, nogil=True)
def log_prior_constant(n, u, pp):
    """log P(Pi[, u]) - sum_c log_kappa(|c|, u): ``nggp.log_u_factor`` (eq. 4, a density in u)
    or the CRP's ``crp.log_constant``."""
    if pp[KIND] == DP:
        return crp.log_constant(n, pp[ALPHA])
    return nggp.log_u_factor(n, u, pp[ALPHA], pp[SIGMA])


@njit(cache=True, nogil=True)
def sample_u(state, u, n, K, pp, n_steps):
    """``nggp.sample_u``; u unchanged for the DP."""
    if pp[KIND] == DP:
        return u
    return nggp.sample_u(state, u, n, K, pp[ALPHA], pp[SIGMA], n_steps)
