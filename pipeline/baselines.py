"""Reference methods that share the project's kernels: DP-means with the lambda binary search of
seed 000 Appendix D, and the collapsed Gibbs sampler (seed 000 eq. 2.7; seed 003 Algorithm 3).
Later stages compare against them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from kernels import dpmeans as kdpmeans
from kernels import mapdp as kmapdp
from pipeline.mapdp import MAPDP
from pipeline.mapdp_core import as_seed_sequence, seed_state


class DPMeans(ClusterMixin, BaseEstimator):
    """DP-means (Kulis and Jordan 2012; seed 000, Section 4).

    Parameters
    ----------
    lam : float or None
        The new-cluster penalty lambda. None with ``n_clusters`` set: found by the binary search
        of seed 000, Appendix D.
    n_clusters : int or None
        Target number of clusters for the lambda search.
    max_iter : int, default=100
    max_search : int, default=60
        Binary-search steps before giving up on hitting ``n_clusters`` exactly (the closest K
        found is kept).
    """

    def __init__(
        self,
        lam: float | None = None,
        n_clusters: int | None = None,
        max_iter: int = 100,
        max_search: int = 60,
    ):
        self.lam = lam
        self.n_clusters = n_clusters
        self.max_iter = max_iter
        self.max_search = max_search

    def fit(self, X: Any, y: Any = None) -> DPMeans:
        X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"X must be a non-empty 2-D array, got shape {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError("X contains NaN or inf")
        if self.lam is not None:
            lam = float(self.lam)
            z, centers, n_iter, obj = kdpmeans.dpmeans(X, lam, self.max_iter)
            self.search_path_: list[tuple[float, int]] = [(lam, centers.shape[0])]
        else:
            if self.n_clusters is None:
                raise ValueError("set lam, or n_clusters for the lambda search of Appendix D")
            target = int(self.n_clusters)
            # Appendix D, step 1: [L, U] = [0, M^2], M^2 the maximal squared distance
            lo, hi = 0.0, float(np.sum((X.max(axis=0) - X.min(axis=0)) ** 2))
            self.search_path_ = []
            best = None
            for _ in range(self.max_search):
                lam = 0.5 * (lo + hi)
                z, centers, n_iter, obj = kdpmeans.dpmeans(X, lam, self.max_iter)
                k = centers.shape[0]
                self.search_path_.append((lam, k))
                if best is None or abs(k - target) < abs(best[1].shape[0] - target):
                    best = (z, centers, n_iter, obj, lam)
                if k > target:
                    lo = lam  # too many clusters: increase lambda (step 2b)
                elif k < target:
                    hi = lam  # too few: decrease lambda (step 2c)
                else:
                    break  # step 2d
            assert best is not None
            z, centers, n_iter, obj, lam = best
        self.lam_ = lam
        self.labels_ = z
        self.cluster_centers_ = centers
        self.n_clusters_ = centers.shape[0]
        self.n_iter_ = n_iter
        self.objective_ = obj
        return self


class CollapsedGibbs(MAPDP):
    """Collapsed Gibbs sampler for the DPM (seed 000 eq. 2.7; Neal 2000 Algorithm 3).

    Same families, schema and validation as ``MAPDP``; the concentration is fixed.

    Parameters
    ----------
    alpha : float, default=1.0
    family : as MAPDP
    n_iter : int, default=200
        Gibbs scans.
    burn_in : int, default=50
    random_state : int or None

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        The sample with the highest log p(X, z) after burn-in (the paper's "Gibbs-MAP").
    log_joint_ : ndarray of shape (n_iter,)
        log p(X, z | N0) after each scan.
    n_clusters_trace_ : ndarray of shape (n_iter,)
    """

    def __init__(
        self,
        alpha: float = 1.0,
        family: Any = "auto",
        n_iter: int = 200,
        burn_in: int = 50,
        random_state: Any = None,
    ):
        self.alpha = alpha
        self.family = family
        self.n_iter = n_iter
        self.burn_in = burn_in
        self.random_state = random_state

    def fit(self, X: Any, y: Any = None) -> CollapsedGibbs:
        alpha = float(self.alpha)
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        Xa = self._encode_fit(X)
        fam = self.family_
        N = Xa.shape[0]
        seq = as_seed_sequence(self.random_state)
        state = seed_state(seq)
        order = np.arange(N, dtype=np.int64)
        z = np.full(N, -1, dtype=np.int64)
        stats = np.zeros((8, fam.n_stats))
        cache = fam.cache_of(stats)
        nk = np.zeros(8)
        n_slots = 0
        empty_c = fam.empty_cache()
        log_joint = np.empty(self.n_iter)
        ks = np.empty(self.n_iter, dtype=np.int64)
        best = (-math.inf, z.copy())
        for t in range(self.n_iter):
            stats, cache, nk, n_slots, _ = kmapdp.gibbs_sweep(
                Xa,
                order,
                z,
                stats,
                cache,
                nk,
                n_slots,
                fam.spec,
                fam.prior,
                empty_c,
                math.log(alpha),
                state,
            )
            stats, cache, nk = kmapdp.compact(z, stats, cache, nk, n_slots)
            n_slots = stats.shape[0]
            lj = -float(kmapdp.objective(stats, nk, n_slots, fam.spec, fam.prior, alpha))
            log_joint[t] = lj
            ks[t] = n_slots
            if t >= self.burn_in and lj > best[0]:
                best = (lj, z.copy())
        if best[0] == -math.inf:
            best = (float(log_joint[-1]), z.copy())
        zb = best[1]
        K = int(zb.max()) + 1
        self.labels_ = zb
        self.cluster_stats_ = fam.stats_of(Xa, zb, K)
        self.cluster_sizes_ = self.cluster_stats_[:, 0].astype(np.int64)
        self.n_clusters_ = K
        self.alpha_ = alpha
        self.log_joint_ = log_joint
        self.n_clusters_trace_ = ks
        self.objective_ = -best[0]
        self._cache = fam.cache_of(self.cluster_stats_)
        self._empty_cache = fam.empty_cache()
        return self
