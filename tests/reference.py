"""Slow pure-NumPy / SciPy re-implementations used as test oracles.

Nothing here shares code with ``kernels/``: cluster posteriors are recomputed from the member
records every time (Raykov et al. 2016, eqs. B.1-B.2) and densities come from SciPy.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.special import gammaln, multigammaln
from scipy.stats import multivariate_t
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from kernels.alloc import crp
from kernels.obs import product as kproduct
from pipeline.families import Family, ProductFamily, as_product


def nw_posterior(X: np.ndarray, m0, c0, B0, a0):
    """(m, c, B, a) of eq. B.1 from the records X (n, d) directly."""
    n, _d = X.shape
    if n == 0:
        return np.asarray(m0, float), c0, np.asarray(B0, float), a0
    xbar = X.mean(axis=0)
    S = (X - xbar).T @ (X - xbar)
    m = (c0 * np.asarray(m0) + n * xbar) / (c0 + n)
    Binv = np.linalg.inv(B0) + S + c0 * n / (c0 + n) * np.outer(xbar - m0, xbar - m0)
    return m, c0 + n, np.linalg.inv(Binv), a0 + n


def nw_log_predictive(x: np.ndarray, X: np.ndarray, m0, c0, B0, a0) -> float:
    """log p(x | X) as the Student-t of Appendix B, evaluated by SciPy."""
    d = x.shape[0]
    m, c, B, a = nw_posterior(X, m0, c0, B0, a0)
    nu = a - d + 1
    Lam = c * nu / (c + 1) * B
    return float(multivariate_t(loc=m, shape=np.linalg.inv(Lam), df=nu).logpdf(x))


def nw_log_marginal(X: np.ndarray, m0, c0, B0, a0) -> float:
    """log p(X) under the Normal-Wishart prior, closed form from the records."""
    n, d = X.shape
    if n == 0:
        return 0.0
    _m, c, B, a = nw_posterior(X, m0, c0, B0, a0)
    return float(
        -0.5 * n * d * math.log(math.pi)
        + multigammaln(0.5 * a, d)
        - multigammaln(0.5 * a0, d)
        - 0.5 * a0 * np.linalg.slogdet(B0)[1]
        + 0.5 * a * np.linalg.slogdet(B)[1]
        + 0.5 * d * (math.log(c0) - math.log(c))
    )


def log_crp(sizes, alpha: float) -> float:
    """log of eq. 2.3."""
    sizes = np.asarray(sizes, float)
    n = sizes.sum()
    return float(
        gammaln(alpha) - gammaln(n + alpha) + len(sizes) * math.log(alpha) + gammaln(sizes).sum()
    )


def mapdp_reference(X, order, alpha, prior, max_iter=100, tol=1e-6, init="one-cluster"):
    """Algorithm 1 of Raykov et al. 2016 with every cluster posterior recomputed from its records.

    Same conventions as ``kernels.mapdp.sweep``: clusters in slots, ties to the lowest slot, a
    new cluster reuses the lowest free slot, a record alone in its cluster that would open a new
    one stays, empty slots compacted after each iteration in slot order.

    Returns
    -------
    labels : ndarray (N,)
    history : list of float, the objective -log p(X, z | N0) after each iteration
    """
    m0, c0, B0, a0 = prior
    N = X.shape[0]
    if init == "one-cluster":
        slots = [list(range(N))]
        z = np.zeros(N, dtype=int)
    else:
        slots = []
        z = np.full(N, -1)
    history = []
    e_old = math.inf
    for _ in range(max_iter):
        changed = 0
        for i in order:
            k0 = z[i]
            costs = []
            for _k, members in enumerate(slots):
                others = [j for j in members if j != i]
                if not others:
                    costs.append(math.inf)
                    continue
                q = -nw_log_predictive(X[i], X[others], m0, c0, B0, a0)
                costs.append(q - math.log(len(others)))
            costs.append(-nw_log_predictive(X[i], X[:0], m0, c0, B0, a0) - math.log(alpha))
            best = int(np.argmin(costs))
            alone = k0 >= 0 and len(slots[k0]) == 1
            if best == k0 or (best == len(slots) and alone):
                continue
            if k0 >= 0:
                slots[k0].remove(i)
            if best == len(slots):
                free = [k for k, s in enumerate(slots) if not s]
                if free:
                    best = free[0]
                else:
                    slots.append([])
            slots[best].append(i)
            z[i] = best
            changed += 1
        # compact
        keep = [k for k, s in enumerate(slots) if s]
        remap = {k: r for r, k in enumerate(keep)}
        slots = [slots[k] for k in keep]
        z = np.array([remap[k] for k in z])
        e = -sum(nw_log_marginal(X[s], m0, c0, B0, a0) for s in slots) - log_crp(
            [len(s) for s in slots], alpha
        )
        history.append(e)
        if changed == 0 or e_old - e < tol * abs(e):
            break
        e_old = e
    return z, history


def dpm_log_joint(stats: ArrayLike, family: Family | ProductFamily, alpha: float) -> float:
    """log of eq. 5's summand for one partition: log p(v | alpha) + sum_l log p(D_l^v), the
    CRP's ``kernels.alloc.crp.log_eppf`` plus ``kernels.obs.product.log_marginals``.

    Parameters
    ----------
    stats : array-like of shape (K, S)
        One statistics row per block.
    family : Family or ProductFamily
    alpha : float

    Returns
    -------
    float
    """
    fam = as_product(family)
    S = np.ascontiguousarray(np.atleast_2d(np.asarray(stats, dtype=np.float64)))
    lm = float(kproduct.log_marginals(S, fam.spec, fam.prior).sum())
    return float(crp.log_eppf(np.ascontiguousarray(S[:, 0]), S.shape[0], float(alpha))) + lm


def dpm_observed_log_density(fam, stats: np.ndarray, alpha: float, x: np.ndarray) -> float:
    """log of the DP mixture's predictive density of x (d,) on its observed (non-NaN) cells: each
    cluster's Normal-Wishart Student-t (from ``fam.posterior`` of its statistics row; a zero row
    is the new cluster, weighted alpha) marginalised onto the observed dimensions by SciPy."""
    d = x.shape[0]
    o = np.flatnonzero(~np.isnan(x))
    N = float(stats[:, 0].sum())
    rows = [*stats, np.zeros_like(stats[0])]
    weights = [*stats[:, 0], alpha]
    terms = []
    for s, w in zip(rows, weights, strict=True):
        mk, T, ck, ak = fam.posterior(s)
        nu = ak - d + 1
        shape = T * (ck + 1) / (ck * nu)
        t = multivariate_t(loc=mk[o], shape=shape[np.ix_(o, o)], df=nu)
        terms.append(np.log(w / (N + alpha)) + t.logpdf(x[o]))
    return float(np.logaddexp.reduce(terms))


def two_stage_baseline(
    df: pd.DataFrame, response: str, time: pd.Series
) -> tuple[float, np.ndarray]:
    """The panels' baseline (``shared/data/real/README.md``): k-means told the true number of
    groups on each subject's least-squares intercept and slope, its NMI averaged over 5 seeds
    (n_init=10); and the group of each subject (subjects sorted, as ``subjects_``)."""
    coef, truth = [], []
    for _, g in df.assign(t=time).groupby("subject", sort=True):
        A = np.column_stack([np.ones(len(g)), g["t"]])
        coef.append(np.linalg.lstsq(A, g[response].to_numpy(float), rcond=None)[0])
        truth.append(g["group"].iloc[0])
    k = len(set(truth))
    nmis = [
        normalized_mutual_info_score(truth, KMeans(k, n_init=10, random_state=r).fit_predict(coef))
        for r in range(5)
    ]
    return float(np.mean(nmis)), np.asarray(truth)
