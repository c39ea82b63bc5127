"""``MAPDP``: the scikit-learn-style estimator around the MAP-DP kernels (seed 000)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, ClusterMixin, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from kernels import mapdp as kmapdp
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.mapdp_core import (
    MapdpResult,
    as_seed_sequence,
    run_mapdp,
)
from pipeline.schema import Schema, as_frame

IntArray = NDArray[np.int64]

AUTO_RESTARTS_MAX_N = 20_000


class MAPDP(ClusterMixin, DensityMixin, BaseEstimator):
    """MAP-DP: approximate MAP inference for Dirichlet process mixtures (seed 000, Algorithm 1).

    Iterated conditional modes on the collapsed DPM: every record in turn goes to the cluster, or
    a new one, that maximises the complete-data likelihood (eq. 3.3); cluster parameters are
    integrated out and sufficient statistics are updated incrementally.

    Parameters
    ----------
    alpha : float or "learn", default="learn"
        DP concentration N0. A float keeps it fixed; "learn" sets it after every iteration to
        the MAP value under a Gamma(``alpha_prior``) prior (eq. A.1), starting from 1.
    family : "auto", str, dict, Family or ProductFamily, default="auto"
        Likelihood family per column (``pipeline.schema`` documents the "auto" rules). A
        ``Family``/``ProductFamily`` instance fixes the prior instead of the empirical-Bayes
        default and applies to numeric arrays.
    n_restarts : int or "auto", default="auto"
        Runs over random permutations of the records; the lowest objective wins. "auto" is 3
        up to ``AUTO_RESTARTS_MAX_N`` (20,000) records and 1 above: on large data the split and
        merge moves already took every restart we measured to the same optimum, and each
        restart costs a full fit.
    max_iter : int, default=100
        Maximum iterations (sweeps) per run.
    tol : float, default=1e-6
        A run stops when an iteration lowers the objective by less than ``tol * |objective|``
        (relative, as the distributed passes) or moves no record.
    init : {"sequential", "one-cluster"}, default="sequential"
        "sequential" starts with no cluster and assigns records in visiting order (the first
        iteration is then a sequential MAP pass); "one-cluster" starts with every record in one
        cluster, as Algorithm 1 writes it. Iterated conditional modes rarely leaves that start:
        a single record never gains by leaving a cluster that holds all the data.
    alpha_prior : (float, float), default=(2.0, 1.0)
        Shape and rate of the Gamma prior on N0 when ``alpha="learn"``. A shape above 1 keeps
        the mode of eq. A.1 away from 0 when K = 1, which would otherwise be absorbing.
    random_state : int, SeedSequence, Generator or None
        Seeds the permutations; a fixed value makes ``fit`` reproducible.
    verbose : int, default=0
        1 prints one line per iteration.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training record, 0..K-1.
    n_clusters_ : int
    n_iter_ : int
        Iterations of the winning run.
    objective_ : float
        -log p(X, z | N0) of the winning run (plus -log p(N0) when learned).
    objective_history_ : list of float
        Objective after each iteration of the winning run; never increases.
    restart_objectives_ : list of float
    alpha_ : float
        Concentration used (the learned one with ``alpha="learn"``).
    cluster_sizes_ : ndarray of shape (n_clusters,)
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
        Additive sufficient statistics of each cluster.
    family_ : ProductFamily
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame.
    """

    def __init__(
        self,
        alpha: float | str = "learn",
        family: Any = "auto",
        n_restarts: int | str = "auto",
        max_iter: int = 100,
        tol: float = 1e-6,
        init: str = "sequential",
        alpha_prior: tuple[float, float] = (2.0, 1.0),
        random_state: Any = None,
        verbose: int = 0,
    ):
        self.alpha = alpha
        self.family = family
        self.n_restarts = n_restarts
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.alpha_prior = alpha_prior
        self.random_state = random_state
        self.verbose = verbose

    # -- input -------------------------------------------------------------------------------
    def _check_params(self) -> tuple[float, bool]:
        if isinstance(self.alpha, str):
            if self.alpha != "learn":
                raise ValueError(f"alpha must be a positive float or 'learn', got {self.alpha!r}")
            alpha, learn = 1.0, True
        else:
            alpha, learn = float(self.alpha), False
            if not (alpha > 0 and math.isfinite(alpha)):
                raise ValueError(f"alpha must be a positive finite float, got {self.alpha!r}")
        if self.n_restarts != "auto" and (
            isinstance(self.n_restarts, str) or int(self.n_restarts) < 1
        ):
            raise ValueError(f"n_restarts must be 'auto' or >= 1, got {self.n_restarts!r}")
        if int(self.max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        a, b = self.alpha_prior
        if not (a > 0 and b > 0):
            raise ValueError(f"alpha_prior must be two positive numbers, got {self.alpha_prior}")
        return alpha, learn

    def _encode_fit(self, X: Any) -> FloatArray:
        family = self.family
        if isinstance(family, (Family, ProductFamily)):
            df, from_frame = as_frame(X)
            schema = Schema.infer(df, "gaussian", from_frame)
            Xe = schema.encode(df, fitting=True)
            prod = family.as_product() if isinstance(family, Family) else family
            if prod.n_cols != Xe.shape[1]:
                raise ValueError(
                    f"X has {Xe.shape[1]} features, but the family given models {prod.n_cols}"
                )
            schema.check_informative(Xe)
            schema.check_values(prod, Xe)
        else:
            df, from_frame = as_frame(X)
            schema = Schema.infer(df, family, from_frame)
            Xe = schema.encode(df, fitting=True)
            schema.check_informative(Xe)
            prod = schema.build_family(Xe)
        self.schema_ = schema
        self.family_ = prod
        self.n_features_in_ = Xe.shape[1]
        if from_frame:
            self.feature_names_in_ = np.asarray(schema.columns, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return prod.arrange(Xe)

    def _encode_predict(self, X: Any) -> FloatArray:
        check_is_fitted(self, "family_")
        df, from_frame = as_frame(X)
        df = self.schema_.check_columns(df, from_frame, type(self).__name__)
        Xe = self.schema_.encode(df, fitting=False)
        self.schema_.check_values(self.family_, Xe)
        return self.family_.arrange(Xe)

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> MAPDP:
        """Fit MAP-DP to X.

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        import dask

        if dask.is_dask_collection(X):
            # the distributed code path: one Dask task per chunk per pass (pipeline.distributed)
            from pipeline.distributed import fit_estimator

            return fit_estimator(self, X)
        alpha0, learn = self._check_params()
        Xa = self._encode_fit(X)
        N = Xa.shape[0]
        seq = as_seed_sequence(self.random_state)
        best: MapdpResult | None = None
        objectives = []
        n_restarts = (
            (3 if N <= AUTO_RESTARTS_MAX_N else 1)
            if self.n_restarts == "auto"
            else int(self.n_restarts)
        )
        for r, child in enumerate(seq.spawn(n_restarts)):
            order = np.random.default_rng(child).permutation(N).astype(np.int64)
            cb = None
            if self.verbose:

                def cb(it: int, e: float, k: int, r: int = r) -> None:
                    print(f"restart {r} iteration {it}: objective {e:.6g}, {k} clusters")

            res = run_mapdp(
                Xa,
                self.family_,
                order,
                alpha0,
                learn,
                tuple(self.alpha_prior),  # type: ignore[arg-type]
                int(self.max_iter),
                float(self.tol),
                self.init,
                cb,
            )
            objectives.append(res.objective)
            if best is None or res.objective < best.objective:
                best = res
        assert best is not None
        if not best.converged:
            warnings.warn(
                f"MAP-DP did not converge in max_iter={self.max_iter} iterations; "
                "increase max_iter or tol",
                ConvergenceWarning,
                stacklevel=2,
            )
        self.labels_ = best.labels
        self.cluster_stats_ = best.stats
        self.cluster_sizes_ = best.nk.astype(np.int64)
        self.n_clusters_ = int(best.stats.shape[0])
        self.n_iter_ = best.n_iter
        self.objective_ = best.objective
        self.objective_history_ = best.history
        self.restart_objectives_ = objectives
        self.alpha_ = best.alpha
        self._cache = self.family_.cache_of(best.stats)
        self._empty_cache = self.family_.empty_cache()
        return self

    def fit_predict(self, X: Any, y: Any = None, **kwargs: Any) -> IntArray:
        """Fit and return ``labels_``."""
        return self.fit(X).labels_

    # -- prediction --------------------------------------------------------------------------
    def _predict_both(self, X: Any) -> tuple[IntArray, FloatArray]:
        Xa = self._encode_predict(X)
        labels, logdens = kmapdp.predict(
            Xa,
            self.cluster_stats_,
            self._cache,
            self.cluster_sizes_.astype(np.float64),
            self.family_.spec,
            self.family_.prior,
            self._empty_cache,
            float(self.alpha_),
        )
        return labels, logdens

    def predict(self, X: Any) -> IntArray:
        """MAP cluster of each record of X (eq. 3.5); -1 where a new cluster is most probable.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self._predict_both(X)[0]

    def score_samples(self, X: Any) -> FloatArray:
        """Log mixture predictive density of each record of X (eq. 3.4).

        Returns
        -------
        log_density : ndarray of shape (n_samples,)
        """
        return self._predict_both(X)[1]

    def score(self, X: Any, y: Any = None) -> float:
        """Mean log predictive density of X (eq. 3.4): the held-out likelihood per record."""
        return float(np.mean(self.score_samples(X)))

    # -- summaries ---------------------------------------------------------------------------
    def cluster_summary(self) -> pd.DataFrame:
        """One row per cluster: size, weight, and each family's posterior parameters."""
        check_is_fitted(self, "family_")
        names = self.schema_.names_of(self.family_)
        rows = []
        for k in range(self.n_clusters_):
            row: dict[str, Any] = {"cluster": k, "size": int(self.cluster_sizes_[k])}
            row["weight"] = self.cluster_sizes_[k] / (self.cluster_sizes_.sum() + self.alpha_)
            for (fam, _cols), nm, sl in zip(self.family_.groups, names, self._stat_slices()):
                row.update(fam.posterior_summary(self.cluster_stats_[k, sl], nm))
            rows.append(row)
        return pd.DataFrame(rows)

    def _stat_slices(self) -> list[slice]:
        spec = self.family_.spec
        return [slice(int(r[3]), int(r[3] + r[4])) for r in spec]

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.non_deterministic = False
        return tags
