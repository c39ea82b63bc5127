"""Per-group moments of a grouped dataset store's chunk, computed once at ingest.

A subject's regression in Raykov et al. 2016, Section 7 (eq. 7.1, y_i = X_i beta_i + eps_i) reaches
the data only through X_i^T X_i, X_i^T y_i, y_i^T y_i and n_i (eqs. 7.2 and 7.3, and the marginal
likelihood with beta_i integrated out). Which stored columns are the response and which the
covariates is a fit's choice, not the store's, so the store keeps the Gram matrix of each group's
rows with a column of ones in front, W_g = [1, X_g]: every one of those moments, for any choice of
response, covariates and intercept, is a block of W_g^T W_g. It is symmetric, so only its upper
triangle is kept.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def group_gram(X, starts):
    """The upper triangle of W_g^T W_g of every group g, W_g = [1, X_g] (the moments of
    eqs. 7.1-7.3 of Raykov et al. 2016), row by row: entries (a, b), b >= a, of the (q, q) matrix,
    q = D + 1, at a q - a (a - 1) / 2 + (b - a).

    Entry (0, 0) is the group's number of rows, (0, 1 + j) the sum of column j, (1 + j, 1 + l)
    the sum of products of columns j and l. Rows are added in their stored order, with the same
    products as ``kernels.mixed_effects.subject_moments``, so each block equals that kernel's
    result on the same rows bit for bit.

    Parameters
    ----------
    X : (n, D) float64
        The chunk's rows in stored order, each group's rows contiguous.
    starts : (G + 1,) int64
        Group g's rows are ``X[starts[g]:starts[g + 1]]``.

    Returns
    -------
    (G, q (q + 1) / 2) float64
    """
    d = X.shape[1]
    G = starts.shape[0] - 1
    q = d + 1
    out = np.zeros((G, q * (q + 1) // 2))
    w = np.empty(q)
    w[0] = 1.0
    for g in range(G):
        for r in range(starts[g], starts[g + 1]):
            for a in range(d):
                w[a + 1] = X[r, a]
            t = 0
            for a in range(q):
                wa = w[a]
                for b in range(a, q):
                    out[g, t] += wa * w[b]
                    t += 1
    return out


@njit(cache=True, nogil=True)
def column_summary(X):
    """Per column of X, in one pass over the rows: missing cells (NaN), and the sum, minimum
    and maximum of the cells present (the additive moments of ``pipeline.data.store.Moments``
    besides the cross products). The sums add row by row in stored order, as NumPy's
    ``sum(axis=0)`` of a C-ordered array does, so they equal it bit for bit.

    Parameters
    ----------
    X : (n, D) float64 or float32

    Returns
    -------
    n_missing, total, lo, hi : (D,) float64
        lo = +inf and hi = -inf for a column with no cell present.
    """
    n, d = X.shape
    n_missing = np.zeros(d)
    total = np.zeros(d)
    lo = np.full(d, np.inf)
    hi = np.full(d, -np.inf)
    for i in range(n):
        for j in range(d):
            v = np.float64(X[i, j])
            if v != v:
                n_missing[j] += 1.0
                continue
            total[j] += v
            if v < lo[j]:
                lo[j] = v
            if v > hi[j]:
                hi[j] = v
    return n_missing, total, lo, hi
