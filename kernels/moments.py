"""Per-group moments of a grouped store's chunk, computed once at ingest.

A subject's regression (Raykov et al. 2016, eqs. 7.1-7.3) reads X_i^T X_i, X_i^T y_i, y_i^T y_i
and n_i, blocks of W_g^T W_g, W_g = [1, X_g], for any choice of response and covariates: the
store keeps its upper triangle.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def group_gram(X, starts):
    """(G, q (q + 1) / 2): the upper triangle of each group's W_g^T W_g (q = D + 1), entry
    (a, b) at a q - a (a - 1) / 2 + (b - a), of the rows of X (n, D), group g's
    ``X[starts[g]:starts[g + 1]]`` (starts (G + 1,) int64); the same products in the same order
    as ``kernels.mixed_effects.subject_moments``, the same bits."""
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
    """(n_missing, total, lo, hi), each (D,), of X's (n, D) columns in one pass: NaN cells, and
    the sum (row by row, as NumPy's ``sum(axis=0)``), minimum and maximum of the others (inf,
    -inf when none)."""
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
