"""Reference methods that share the project's kernels: DP-means with the lambda binary search of
Raykov et al. 2016, Appendix D, the collapsed Gibbs sampler (Raykov et al. 2016, eq. 2.7; De Bacco
and Valera, Algorithm 3) and the uncollapsed one (De Bacco and Valera, Algorithm 2). Later stages
compare against them."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from kernels import dpmeans as kdpmeans
from kernels import mapdp as kmapdp
from kernels import partition as kpartition
from kernels import uncollapsed as kunc
from pipeline.core import config
from pipeline.core.seeds import as_seed_sequence, seed_state
from pipeline.estimators.base import IntArray, MixtureEstimator
from pipeline.families import FloatArray


class DPMeans(MixtureEstimator):
    """DP-means (Kulis and Jordan 2012; Raykov et al. 2016, Section 4).

    Parameters
    ----------
    lam : float or None
        The new-cluster penalty; None with ``n_clusters``: found by binary search (Appendix D).
    n_clusters : int or None
        Target number of clusters for the lambda search.
    max_iter : int, default=100
    max_search : int, default=60
        Binary-search steps before the closest K found is kept.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
    n_clusters_, n_iter_ : int
    lam_ : float
    objective_ : float
    search_path_ : list of (lambda, K)
    """

    # a constant column adds the same distance to every centre: harmless for DP-means
    _always_informative = False
    _model_attrs: ClassVar[tuple[str, ...]] = ("n_clusters_", "cluster_centers_", "lam_")
    _model_extras: ClassVar[tuple[str, ...]] = ("n_iter_", "objective_", "search_path_")

    def __init__(
        self,
        lam: float | None = None,
        n_clusters: int | None = None,
        max_iter: int = 100,
        max_search: int = 60,
    ):
        config.keep_params(self, locals())

    def _check_params(self) -> tuple[float | None, int | None]:
        lam = None if self.lam is None else config.check_tol(self.lam, "lam")
        target = (
            None if self.n_clusters is None else config.check_int(self.n_clusters, "n_clusters")
        )
        if lam is None and target is None:
            raise ValueError("set lam, or n_clusters for the lambda search of Appendix D")
        config.check_int(self.max_iter, "max_iter")
        config.check_int(self.max_search, "max_search")
        return lam, target

    def _fit(self, Xa: FloatArray, params: tuple[float | None, int | None]) -> None:
        lam, target = params
        X = Xa
        max_iter = int(self.max_iter)
        if lam is not None:
            z, centers, n_iter, obj = kdpmeans.dpmeans(X, lam, max_iter)
            self.search_path_: list[tuple[float, int]] = [(lam, centers.shape[0])]
        else:
            assert target is not None
            # Appendix D, step 1: [L, U] = [0, M^2], M^2 the maximal squared distance
            lo, hi = 0.0, float(np.sum((X.max(axis=0) - X.min(axis=0)) ** 2))
            self.search_path_ = []
            best = None
            for _ in range(int(self.max_search)):
                lam = 0.5 * (lo + hi)
                z, centers, n_iter, obj = kdpmeans.dpmeans(X, lam, max_iter)
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

    def _has_density(self) -> bool:
        return False

    def _predict_encoded(self, Xa: FloatArray) -> IntArray:
        """The nearest centre (squared Euclidean distance, DP-means' assignment rule)."""
        d2 = ((Xa[:, None, :] - self.cluster_centers_[None, :, :]) ** 2).sum(axis=2)
        return np.argmin(d2, axis=1).astype(np.int64)


class _GibbsBase(MixtureEstimator):
    """Parameters and fitted attributes the two Gibbs samplers share."""

    _model_extras: ClassVar[tuple[str, ...]] = ("objective_", "log_joint_", "n_clusters_trace_")
    _widened_spec = True

    def __init__(
        self,
        alpha: float = 1.0,
        family: Any = "auto",
        n_iter: int = 200,
        burn_in: int = 50,
        random_state: Any = None,
        prior_scale: float | None = None,
        tune: str | None = None,
    ):
        config.keep_params(self, locals())

    def _check_params(self) -> float:
        alpha = config.check_positive(self.alpha, "alpha")
        config.check_int(self.n_iter, "n_iter")
        config.check_int(self.burn_in, "burn_in", minimum=0)
        self._check_tuning()
        return alpha

    def _finish(
        self,
        Xa: FloatArray,
        alpha: float,
        log_joint: FloatArray,
        ks: IntArray,
        labels: IntArray,
        best_lj: float,
    ) -> None:
        self._set_clusters(labels, alpha, Xa=Xa)
        self.log_joint_ = log_joint
        self.n_clusters_trace_ = ks
        self.objective_ = -float(best_lj)


class CollapsedGibbs(_GibbsBase):
    """Collapsed Gibbs sampler for the DPM (Raykov et al. 2016, eq. 2.7; De Bacco and Valera,
    Algorithm 3; Neal 2000 Algorithm 3), with the concentration fixed.

    Parameters
    ----------
    alpha : float, default=1.0
    family, prior_scale, tune : as ``MAPDP``
    n_iter : int, default=200
        Gibbs scans.
    burn_in : int, default=50
    random_state : int or None

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        The sample with the highest log p(X, z) after burn-in ("Gibbs-MAP").
    log_joint_ : ndarray of shape (n_iter,)
        log p(X, z | N0) after each scan.
    n_clusters_trace_ : ndarray of shape (n_iter,)
    objective_ : float
        -log p(X, labels_ | N0).
    cluster_stats_, cluster_sizes_, n_clusters_, alpha_ : as MAPDP
    """

    def _fit(self, Xa: FloatArray, alpha: float) -> None:
        fam = self.family_
        N = Xa.shape[0]
        n_iter = int(self.n_iter)
        state = seed_state(as_seed_sequence(self.random_state))
        order = np.arange(N, dtype=np.int64)
        z = np.full(N, -1, dtype=np.int64)
        stats = np.zeros((8, fam.n_stats))
        cache = fam.cache_of(stats)
        nk = np.zeros(8)
        n_slots = 0
        empty_c = fam.empty_cache()
        log_joint = np.empty(n_iter)
        ks = np.empty(n_iter, dtype=np.int64)
        best = (-math.inf, z.copy())
        for t in range(n_iter):
            stats, cache, nk, n_slots, _ = kmapdp.gibbs_sweep(
                Xa, order, z, stats, cache, nk, n_slots, fam.spec, fam.prior, empty_c,
                math.log(alpha), state,
            )  # fmt: skip
            stats, cache, nk = kmapdp.compact(z, stats, cache, nk, n_slots)
            n_slots = stats.shape[0]
            lj = -float(kmapdp.objective(stats, nk, n_slots, fam.spec, fam.prior, alpha))
            log_joint[t] = lj
            ks[t] = n_slots
            if t >= self.burn_in and lj > best[0]:
                best = (lj, z.copy())
        if best[0] == -math.inf:
            best = (float(log_joint[-1]), z.copy())
        self._finish(Xa, alpha, log_joint, ks, best[1], best[0])


class UncollapsedGibbs(_GibbsBase):
    """Uncollapsed Gibbs sampler for the DPM (De Bacco and Valera, Algorithm 2; Neal 2000, Algorithm
    2), a slowly mixing reference.

    The cluster parameters are part of the state: each scan draws every record's cluster (eqs.
    5-6), then every theta_k from its conjugate posterior (``kernels.uncollapsed``); the chain is
    not truncated and starts with one cluster.

    Parameters
    ----------
    alpha, family, burn_in, random_state, prior_scale, tune : as ``CollapsedGibbs``
    n_iter : int, default=200
        Scans (assignments, then parameters).

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        The sample with the highest log p(X, z) after burn-in.
    samples_ : ndarray of shape (n_iter - burn_in, n_samples)
        The partition after each kept scan.
    cluster_params_ : ndarray of shape (n_clusters, T)
        The sampled theta of each cluster of ``labels_``, in ``kernels.uncollapsed``'s layout.
    log_joint_ : ndarray of shape (n_iter,)
        log p(X, z | alpha) after each scan, parameters integrated out.
    n_clusters_trace_ : ndarray of shape (n_iter,)
    objective_ : float
        -log p(X, labels_ | alpha).
    cluster_stats_, cluster_sizes_, n_clusters_, alpha_ : as MAPDP
    """

    _model_extras: ClassVar[tuple[str, ...]] = (*_GibbsBase._model_extras, "cluster_params_")

    def _fit(self, Xa: FloatArray, alpha: float) -> None:
        fam = self.family_
        N = Xa.shape[0]
        n_iter = int(self.n_iter)
        burn_in = min(int(self.burn_in), n_iter)
        spec, prior = fam.spec, fam.prior
        state = seed_state(as_seed_sequence(self.random_state))
        toff = kunc.theta_offsets(spec)
        lp0 = kunc.prior_predictive(Xa, spec, prior, fam.n_stats, fam.n_cache)
        # N slots: a scan never holds more than N clusters
        z = np.zeros(N, dtype=np.int64)
        stats = np.zeros((N, fam.n_stats))
        stats[0] = fam.stats_of(Xa)[0]
        nk = np.zeros(N)
        nk[0] = N
        theta = np.zeros((N, int(toff[-1])))
        kunc.draw_params(stats[0], theta[0], spec, prior, toff, state)
        order = np.arange(N, dtype=np.int64)
        log_alpha = math.log(alpha)
        log_joint = np.empty(n_iter)
        ks = np.empty(n_iter, dtype=np.int64)
        samples = np.empty((n_iter - burn_in, N), dtype=np.int64)
        best_lj = -math.inf
        best_z = np.zeros(N, dtype=np.int64)
        best_theta = theta[:1].copy()
        for t in range(n_iter):
            kunc.assignment_scan(
                Xa, order, z, stats, theta, nk, lp0, spec, prior, toff, log_alpha, state
            )
            kunc.parameter_scan(stats, theta, nk, spec, prior, toff, state)
            lj = float(kunc.log_joint(stats, nk, spec, prior, alpha))
            log_joint[t] = lj
            ks[t] = int(np.count_nonzero(nk))
            if t >= burn_in:
                kpartition.canonical_labels(z, samples[t - burn_in])
                if lj > best_lj:
                    best_lj = lj
                    best_z = samples[t - burn_in].copy()
                    # slots in order of first record, as the canonical labels number them
                    _, first = np.unique(z, return_index=True)
                    best_theta = theta[z[np.sort(first)]].copy()
        if best_lj == -math.inf:
            best_lj = float(log_joint[-1])
            kpartition.canonical_labels(z, best_z)
            _, first = np.unique(z, return_index=True)
            best_theta = theta[z[np.sort(first)]].copy()
        self.samples_ = samples
        self.cluster_params_ = best_theta
        self._finish(Xa, alpha, log_joint, ks, best_z, best_lj)
