"""One base class for the project's clustering estimators, after scikit-learn's ``BaseMixture``.

``MixtureEstimator.fit`` is a template: check the parameters, encode X through the schema and the
likelihood family, run the subclass's ``_fit`` on the encoded matrix. ``predict`` /
``score_samples`` / ``score`` encode new records with the fitted schema and by default use the DPM
posterior predictive given the training partition (``cluster_stats_``, ``cluster_sizes_``,
``alpha_``).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from pipeline.core.persist import writable
from pipeline.families import Family, FloatArray, ProductFamily, as_product, check_summaries
from pipeline.families.schema import Schema, as_frame
from pipeline.models.mapdp import choose_scale, dpm_predict

IntArray = NDArray[np.int64]


def numeric_schema(n_cols: int) -> Schema:
    """The schema of a numeric matrix of ``n_cols`` columns x0, x1, ... (fits on summaries)."""
    cols = [f"x{j}" for j in range(n_cols)]
    return Schema(columns=cols, kinds=dict.fromkeys(cols, "gaussian"), from_frame=False)


MISSING = ("latent", "refuse")


def check_missing(missing: Any) -> str:
    """``missing`` checked: "latent" (missing cells kept and modelled) or "refuse"."""
    if missing not in MISSING:
        raise ValueError(f"missing must be one of {MISSING}, got {missing!r}")
    return str(missing)


def _density_available(est: Any) -> bool:
    return bool(est._has_density())


class MixtureEstimator(ClusterMixin, BaseEstimator):
    """Base class of the clustering estimators: the fit template and the predict-time checks.

    Subclasses define ``__init__`` (parameters only, scikit-learn style), ``_check_params`` and
    ``_fit``; those with a ``family`` parameter get their records encoded by it.

    Attributes
    ----------
    schema_ : Schema
    family_ : ProductFamily
        Only for estimators with a ``family`` parameter.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame.
    labels_ : ndarray of shape (n_samples,)
        This and the four below: estimators with clusters (set by ``_set_clusters``).
    n_clusters_ : int
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
    cluster_sizes_ : ndarray of shape (n_clusters,)
    alpha_ : float
    """

    #: whether fit checks that there are two records and no constant column even when the prior
    #: is given (MAP-DP and the Gibbs samplers: a constant column is degenerate for them); the
    #: tree methods only need it when the prior is fitted to the data (empirical Bayes)
    _always_informative: ClassVar[bool] = True
    #: whether the kernels take ``ProductFamily.widened``'s spec (the samplers and tree
    #: methods, which have no packed Normal-Wishart paths) rather than the family's own
    _widened_spec: ClassVar[bool] = False
    #: whether a fit given no ``prior_scale`` chooses it by the objective of MAP-DP's fits on
    #: the covariance structure's sample (``Schema.choose_scale``, ``config.PRIOR_SCALES``)
    _scale_by_objective: ClassVar[bool] = False
    #: the fitted attributes a saved model keeps and needs (``pipeline.estimators.model``): those
    #: ``predict`` and ``score_samples`` use; ``_model_extras`` are kept when present
    #: (diagnostics of the fit)
    _model_attrs: ClassVar[tuple[str, ...]] = (
        "n_clusters_",
        "cluster_stats_",
        "cluster_sizes_",
        "alpha_",
    )
    _model_extras: ClassVar[tuple[str, ...]] = ()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a model unpickled through read-only memory maps gets writable arrays (``writable``)
        super().__setstate__(writable(state))

    def fit(self, X: Any, y: Any = None) -> Any:
        """Fit the estimator to X, array-like or DataFrame of shape (n_samples, n_features); y
        is ignored. Returns self."""
        params = self._check_params()
        if getattr(self, "tune", None) is not None:
            from pipeline.estimators.tuning import tune_cv

            return tune_cv(self, X)
        Xa = self._encode_fit(X)
        self._fit(Xa, params)
        return self

    def fit_predict(self, X: Any, y: Any = None, **kwargs: Any) -> IntArray:
        """Fit and return ``labels_`` (n_samples,)."""
        return np.asarray(self.fit(X).labels_)

    def _check_params(self) -> Any:
        """Validate the parameters; the result is handed to ``_fit``."""
        return None

    def _check_tuning(self) -> None:
        """``prior_scale`` and ``tune``, for the estimators that take them."""
        from pipeline.core.config import check_scale
        from pipeline.estimators.tuning import check_tune

        if getattr(self, "prior_scale", None) is not None:
            check_scale(self.prior_scale)
        check_tune(getattr(self, "tune", None))

    def _prior_scale(self) -> float | None:
        """The prior scale ``_encode_fit`` fits the empirical-Bayes prior at."""
        return getattr(self, "prior_scale", None)

    def _fit(self, Xa: FloatArray, params: Any) -> None:
        """Fit on the encoded records Xa (n_samples, n_cols), in the family's group order."""
        raise NotImplementedError

    def _encode_fit(self, X: Any) -> FloatArray:
        """Learn the schema (and the family) from X; return the records the kernels see."""
        family = getattr(self, "family", None)
        df, from_frame = as_frame(X)
        given = isinstance(family, (Family, ProductFamily))
        if given or family is None:
            # a given prior (or no family at all) models the numeric values of the columns
            schema = Schema.infer(df, "gaussian", from_frame)
            Xe = schema.encode(df, fitting=True)
            if self._always_informative:
                schema.settle(Xe)
        else:
            missing = check_missing(getattr(self, "missing", "refuse")) == "latent"
            schema = Schema.infer(df, family, from_frame, missing=missing)
            Xe = schema.encode(df, fitting=True)
            Xe = schema.settle(Xe, strict=bool(getattr(self, "strict", True)))
            schema.choose_structure(Xe, np.arange(Xe.shape[0]))
            if self._scale_by_objective and self._prior_scale() is None:
                schema.choose_scale(Xe, np.arange(Xe.shape[0]), choose_scale, Xe.shape[0])
            for line in schema.dropped_lines():
                warnings.warn(line, UserWarning, stacklevel=3)
        self.schema_ = schema
        self.n_features_in_ = len(schema.columns)
        if from_frame:
            self.feature_names_in_ = np.asarray(schema.columns, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        if family is None:
            return np.ascontiguousarray(Xe)
        if given:
            prod = as_product(family)  # type: ignore[arg-type]
            if prod.n_cols != Xe.shape[1]:
                raise ValueError(
                    f"X has {Xe.shape[1]} features, but the family given models {prod.n_cols}"
                )
            schema.check_values(prod, Xe)
        else:
            prod = schema.build_family(Xe, scale=self._prior_scale())
        self.family_ = prod.widened() if self._widened_spec else prod
        return prod.arrange(Xe)

    def _summaries_input(
        self, stats: ArrayLike, family: Family | ProductFamily | None
    ) -> tuple[FloatArray, ProductFamily]:
        """Leaf summaries ``stats`` (n_leaves, n_stats) checked against ``family`` (None: the
        ``family`` parameter, then an object), and that family as a ``ProductFamily``."""
        given = getattr(self, "family", None) if family is None else family
        if isinstance(given, (str, dict)):
            raise ValueError(
                "fit_summaries needs a Family or ProductFamily instance (the prior cannot be "
                "fitted to summaries by name)"
            )
        prod = as_product(given)  # type: ignore[arg-type]
        st = check_summaries(stats, prod)
        if self._widened_spec:
            prod = prod.widened()
        # fitted on summaries: new records are numeric rows in the family's column order
        self.family_ = prod
        self.schema_ = numeric_schema(prod.n_cols)
        self.n_features_in_ = prod.n_cols
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return st, prod

    def _record_leaves(self, Xa: FloatArray) -> FloatArray:
        """Every encoded record (n, D) a leaf of its own: statistics (n, n_stats) of ``family_``."""
        n = Xa.shape[0]
        return self.family_.stats_of(Xa, np.arange(n, dtype=np.int64), n)

    def _encode_predict(self, X: Any) -> FloatArray:
        """New records encoded as at fit time, or a ValueError naming the column and row."""
        # n_clusters_, not labels_: a loaded model has no training labels
        check_is_fitted(self, "n_clusters_")
        df, from_frame = as_frame(X)
        df = self.schema_.check_columns(df, from_frame, type(self).__name__)
        Xe = self.schema_.encode(df, fitting=False)
        if not hasattr(self, "family_"):
            return np.ascontiguousarray(Xe)
        self.schema_.check_values(self.family_, Xe)
        return self.family_.arrange(Xe)

    def _has_density(self) -> bool:
        """Whether ``score_samples`` / ``score`` exist (a subclass without a density says no)."""
        return True

    def predict(self, X: Any) -> IntArray:
        """Cluster of each record of X (n_samples, n_features): labels of shape (n_samples,)."""
        return self._predict_encoded(self._encode_predict(X))

    @available_if(_density_available)
    def score_samples(self, X: Any) -> FloatArray:
        """Log predictive density of each record of X (n_samples, n_features): (n_samples,)."""
        return self._score_encoded(self._encode_predict(X))

    @available_if(_density_available)
    def score(self, X: Any, y: Any = None) -> float:
        """Mean log predictive density of the records of X (the held-out likelihood per record)."""
        return float(np.mean(self.score_samples(X)))

    def _predict_encoded(self, Xa: FloatArray) -> IntArray:
        """MAP cluster of each encoded record (eq. 3.5); -1 where a new one is the most probable."""
        return self._dpm_predictive(Xa)[0]

    def _score_encoded(self, Xa: FloatArray) -> FloatArray:
        """log sum_k N_k / (N + alpha) p(x | X_k) + alpha / (N + alpha) p(x) (eq. 3.4)."""
        return self._dpm_predictive(Xa)[1]

    def _dpm_predictive(self, Xa: FloatArray) -> tuple[IntArray, FloatArray]:
        # records with missing cells are scored on their observed cells (``dpm_predict``)
        return dpm_predict(
            Xa,
            self.cluster_stats_,
            float(self.alpha_),
            self.family_,
            cache=self._cache,
            empty_c=self._empty_cache,
        )

    def _set_clusters(
        self,
        labels: IntArray,
        alpha: float,
        *,
        Xa: FloatArray | None = None,
        leaf_stats: FloatArray | None = None,
    ) -> None:
        """The cluster attributes of a partition 0..K-1 of the encoded records ``Xa`` (n, D) or of
        leaves ``leaf_stats`` (n, S), and the caches the predictive needs."""
        labels = np.asarray(labels, dtype=np.int64)
        K = int(labels.max()) + 1
        fam = self.family_
        if leaf_stats is not None:
            cluster_stats = np.zeros((K, fam.n_stats))
            np.add.at(cluster_stats, labels, leaf_stats)
        else:
            assert Xa is not None
            cluster_stats = fam.stats_of(Xa, labels, K)
        self.labels_ = labels
        self.n_clusters_ = K
        self.cluster_stats_ = cluster_stats
        self.cluster_sizes_ = np.rint(cluster_stats[:, 0]).astype(np.int64)
        self.alpha_ = float(alpha)
        self._cache = fam.cache_of(cluster_stats)
        self._empty_cache = fam.empty_cache()

    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Write the fitted model as the directory ``path`` (``save_model``: JSON plus arrays,
        no pickle) and return it; ``pipeline.load_model(path)`` reads it back."""
        from pipeline.estimators.model import save_model

        return save_model(self, path, overwrite=overwrite)

    def cluster_summary(self) -> pd.DataFrame:
        """One row per cluster: size, weight N_k / (N + N0), log marginal and each family's
        posterior parameters (the table a run writes to ``clusters.parquet``)."""
        from pipeline.families.schema import cluster_table

        check_is_fitted(self, "cluster_stats_")
        return cluster_table(self.cluster_stats_, self.alpha_, self.family_, self.schema_)

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        # missing cells are modelled where the estimator has missing="latent" (MAPDP)
        tags.input_tags.allow_nan = getattr(self, "missing", "refuse") == "latent"
        tags.non_deterministic = False
        return tags
