"""What each cluster holds, read off its statistics row: the mean of every numeric column and the
shares of every categorical column's categories (the report's cluster profile).

Every family's statistics row starts with the count n followed by the per-column sums of x
(Gaussian and diagonal Gaussian: sum x; Poisson, exponential, geometric: sum x; binomial: sum of
successes; categorical: the count of each category), so the means need no knowledge of the
posterior: they are the clusters' sample means, whatever the prior.
"""

from __future__ import annotations

import numpy as np

from pipeline.families.base import FloatArray, ProductFamily
from pipeline.families.counts import Categorical


def column_means(stats: FloatArray, family: ProductFamily) -> FloatArray:
    """The sample mean of each column in each cluster from its statistics ``stats`` (K, S) of
    ``family``: shape (K, n_cols) in arranged order, NaN for categorical columns and empty
    clusters."""
    stats = np.atleast_2d(np.asarray(stats, dtype=np.float64))
    out = np.full((stats.shape[0], family.n_cols), np.nan)
    col = 0
    for (fam, _cols), sl in zip(family.groups, family.stat_slices(), strict=True):
        d = fam.n_cols
        if not isinstance(fam, Categorical):
            s = stats[:, sl]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, col : col + d] = s[:, 1 : 1 + d] / s[:, :1]
        col += d
    return out


def category_shares(stats: FloatArray, family: ProductFamily) -> dict[int, FloatArray]:
    """The share of each category of each categorical column in each cluster of ``stats``
    (K, S): arranged column index -> (K, C) (0 for an empty cluster)."""
    stats = np.atleast_2d(np.asarray(stats, dtype=np.float64))
    out: dict[int, FloatArray] = {}
    col = 0
    for (fam, _cols), sl in zip(family.groups, family.stat_slices(), strict=True):
        if isinstance(fam, Categorical):
            s = stats[:, sl]
            counts = s[:, 1 : 1 + fam.n_categories]
            out[col] = counts / np.maximum(s[:, :1], 1e-300)
        col += fam.n_cols
    return out
