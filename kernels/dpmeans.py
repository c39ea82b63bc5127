"""DP-means (Kulis and Jordan 2012), the small-variance limit reviewed in Raykov et al. 2016,
Section 4."""

import numpy as np
from numba import njit

from kernels.arrays import copy_rows, copy_vector


@njit(cache=True, nogil=True)
def _sqdist(x, c):
    acc = 0.0
    for j in range(x.shape[0]):
        t = x[j] - c[j]
        acc += t * t
    return acc


@njit(cache=True, nogil=True)
def dpmeans(X, lam, max_iter):
    """Batch DP-means: hard assignment with a new cluster whenever min_k |x - mu_k|^2 > lambda.

    Minimises sum_i |x_i - mu_{z_i}|^2 + lambda K (Raykov et al. 2016, Section 4; the squared
    Euclidean distance that Appendix D's lambda search refers to).

    Parameters
    ----------
    X : ndarray of shape (N, D)
    lam : float
        Penalty for a new cluster, lambda > 0.
    max_iter : int

    Returns
    -------
    labels : ndarray of shape (N,), int64
    centers : ndarray of shape (K, D)
    n_iter : int
    objective : float
    """
    N, D = X.shape
    cap = 16
    centers = np.zeros((cap, D))
    copy_vector(centers[0], X[0])
    K = 1
    z = np.zeros(N, dtype=np.int64)
    n_iter = 0
    for it in range(max_iter):
        n_iter = it + 1
        changed = 0
        for i in range(N):
            best = 0
            bd = _sqdist(X[i], centers[0])
            for k in range(1, K):
                d = _sqdist(X[i], centers[k])
                if d < bd:
                    bd = d
                    best = k
            if bd > lam:
                if K == cap:
                    c2 = np.zeros((2 * cap, D))
                    copy_rows(c2, centers)
                    centers = c2
                    cap *= 2
                copy_vector(centers[K], X[i])
                best = K
                K += 1
            if z[i] != best or it == 0:
                changed += 1
            z[i] = best
        # means of the non-empty clusters, renumbered in order
        sums = np.zeros((K, D))
        counts = np.zeros(K)
        for i in range(N):
            counts[z[i]] += 1.0
            for j in range(D):
                sums[z[i], j] += X[i, j]
        remap = np.full(K, -1, dtype=np.int64)
        K2 = 0
        for k in range(K):
            if counts[k] > 0:
                remap[k] = K2
                for j in range(D):
                    centers[K2, j] = sums[k, j] / counts[k]
                K2 += 1
        for i in range(N):
            z[i] = remap[z[i]]
        K = K2
        if changed == 0:
            break
    obj = lam * K
    for i in range(N):
        obj += _sqdist(X[i], centers[z[i]])
    return z, centers[:K].copy(), n_iter, obj
