"""The exact DPM marginal likelihood by enumeration of set partitions (Xu et al. 2009, eq. 5).

For a handful of records (or of leaf summaries) the sum over every partition is small enough to
do outright: Bell(10) = 115975 partitions of 10 leaves. It is the reference against which the BHC
lower bounds (eq. 9, Theorem 1) are checked.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln, logsumexp

from pipeline.families import Family, GaussianNW, ProductFamily, as_product, check_summaries

MAX_LEAVES = 12


def restricted_growth_strings(m: int) -> NDArray[np.int8]:
    """Every set partition of m items once, as a restricted growth string (a_0 = 0,
    a_i <= 1 + max(a_0..a_{i-1})): an int8 array of shape (Bell(m), m), row p column i the block
    of item i in partition p."""
    if m < 1:
        raise ValueError(f"need at least one item, got {m}")
    rgs = np.zeros((1, 1), dtype=np.int8)
    top = np.zeros(1, dtype=np.int8)  # max of each string so far
    for _ in range(1, m):
        choices = top.astype(np.int64) + 2
        rows = np.repeat(np.arange(rgs.shape[0]), choices)
        starts = np.repeat(np.cumsum(choices) - choices, choices)
        vals = (np.arange(rows.shape[0]) - starts).astype(np.int8)
        rgs = np.concatenate([rgs[rows], vals[:, None]], axis=1)
        top = np.maximum(top[rows], vals)
    return rgs


def _leaf_stats(
    X: ArrayLike | None, stats: ArrayLike | None, family: str | Family | ProductFamily
) -> tuple[NDArray[np.float64], ProductFamily]:
    if (X is None) == (stats is None):
        raise ValueError("give exactly one of X (records) and stats (leaf summaries)")
    if X is not None:
        Xr = np.asarray(X, dtype=np.float64)
        if Xr.ndim == 1:
            Xr = Xr[:, None]
        if Xr.ndim != 2 or Xr.shape[0] < 1:
            raise ValueError(f"X must have shape (n_samples, n_features); got {np.shape(X)}")
        if not np.all(np.isfinite(Xr)):
            raise ValueError("X contains NaN or infinity")
        if isinstance(family, str):
            if family != "gaussian":
                raise ValueError(f"unknown family {family!r}; use 'gaussian' or a Family")
            fam = GaussianNW.empirical_bayes(Xr).as_product()
        else:
            fam = as_product(family)
        if Xr.shape[1] != fam.n_cols:
            raise ValueError(f"X has {Xr.shape[1]} columns, the family models {fam.n_cols}")
        Xa = fam.arrange(Xr)
        m = Xa.shape[0]
        return fam.stats_of(Xa, np.arange(m, dtype=np.int64), m), fam
    if isinstance(family, str):
        raise ValueError("leaf summaries need a Family or ProductFamily instance with its prior")
    fam = as_product(family)
    assert stats is not None  # exactly one of X and stats, checked above
    return check_summaries(stats, fam), fam


def exact_log_marginal(
    X: ArrayLike | None = None,
    alpha: float = 1.0,
    family: str | Family | ProductFamily = "gaussian",
    *,
    stats: ArrayLike | None = None,
) -> float:
    """log p(D | alpha, beta) of a Dirichlet process mixture, summed over every partition.

    Eq. 5 of Xu et al. 2009 over the set partitions of the leaves (restricted growth strings),
    each block's term computed once per subset of leaves (2^M, by bitmask).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features), optional
        Records; each is its own leaf.
    alpha : float
        DP concentration, > 0.
    family : 'gaussian', Family or ProductFamily
        'gaussian' means ``GaussianNW.empirical_bayes(X)`` (records only).
    stats : array-like of shape (n_leaves, S), optional
        Leaf summaries of ``family``, each kept whole.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        On bad input, or more than ``MAX_LEAVES`` (12) leaves.
    """
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    S, fam = _leaf_stats(X, stats, family)
    m = S.shape[0]
    if m > MAX_LEAVES:
        raise ValueError(f"exact enumeration is limited to {MAX_LEAVES} leaves, got {m}")
    n_sub = 1 << m
    sub_stats = np.zeros((n_sub, S.shape[1]))
    for mask in range(1, n_sub):
        low = (mask & -mask).bit_length() - 1
        sub_stats[mask] = sub_stats[mask & (mask - 1)] + S[low]
    block = np.zeros(n_sub)
    log_alpha = math.log(alpha)
    for mask in range(1, n_sub):
        s = sub_stats[mask]
        block[mask] = log_alpha + math.lgamma(s[0]) + fam.log_marginal_stats(s)
    rgs = restricted_growth_strings(m)
    bits = np.int64(1) << np.arange(m, dtype=np.int64)
    total = np.zeros(rgs.shape[0])
    for b in range(m):
        masks = ((rgs == b) * bits).sum(axis=1)
        total += block[masks]  # block[0] = 0: label b unused
    n_records = float(S[:, 0].sum())
    return float(logsumexp(total) - gammaln(n_records + alpha) + gammaln(alpha))
