"""``MixedEffectsDP``: the scikit-learn style estimator of the semiparametric mixed-effects model of
Raykov et al. 2016, Section 7 (the model and the driver step shared with the distributed engine are
in ``pipeline.models.mixed_effects``, its start in ``pipeline.models.mixed_effects_start``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from kernels import mixed_effects as kme
from pipeline.core.config import (
    ALPHA,
    ALPHA_PRIOR,
    MAX_PASSES,
    MIN_CHANGE,
    TOL,
    check_alpha,
    check_alpha_prior,
    check_choice,
    check_fraction,
    check_int,
    check_positive,
    check_tol,
    keep_params,
)
from pipeline.core.errors import InputError
from pipeline.core.persist import writable
from pipeline.core.seeds import seed_entropy
from pipeline.families.schema import Schema
from pipeline.models.mixed_effects import (
    FloatArray,
    IntArray,
    MixedModel,
    MixedPrior,
    Subjects,
    _as_numeric_column,
    check_within_subject,
    fit_subjects,
    predictive_components,
)
from pipeline.models.mixed_effects_start import (
    DEFAULT_TAU_PRIOR,
    MIXED_INITS,
    SHRINK,
    check_shrink,
    start,
)


@dataclass
class _Data:
    X: FloatArray  # (n, p) design, intercept first when fitted
    y: FloatArray
    codes: IntArray
    subjects: NDArray[Any]


class MixedEffectsDP(BaseEstimator):
    """Semiparametric linear mixed-effects model with a DP mixture of Gaussians as the random
    effects' distribution (Raykov et al. 2016, Section 7), fitted by iterated conditional modes.

    Parameters
    ----------
    alpha : float or "learn"
        DP concentration N0; "learn": its MAP under Gamma(``alpha_prior``) (eq. A.1) each pass.
    alpha_prior : (float, float)
        Shape and rate of the concentration's Gamma prior.
    fit_intercept : bool
        Prepend an intercept column to X (a random intercept).
    shrink : "auto" or float > 1
        Empirical-Bayes prior: a cluster's expected covariance of beta_i is 1/shrink of the
        subjects'. "auto": 10 unless 5, 3 or 2 predicts held-out subjects clearly better
        (``pipeline.models.mixed_effects_start.choose_shrink``, the same in ``dpmm
        longitudinal``): a panel of one group is then not pulled towards a tenth of its spread.
    prior : dict, optional
        Normal-Wishart prior ``{"m0", "c0", "B0", "a0"}`` (Appendix B); missing keys take their
        empirical-Bayes value.
    tau_prior : (float, float or None)
        Shape and rate of tau's Gamma prior (eq. 7.3); rate None: 1e-3 times the noise variance.
    max_iter, tol, min_change
        Stop after ``max_iter`` passes, when a pass lowers the objective by at most
        ``tol * |objective|``, or when at most ``min_change`` of the subjects changed cluster.
    init : {"auto", "one-cluster"}
        Start from MAP-DP on the subjects' ridge-shrunk effects, or one cluster; either way on a
        hash sample of at most 20,000 subjects.
    random_state : int, optional
        Seeds the start (None: as 0) and, as an int, a random visiting order of the subjects.

    Attributes
    ----------
    labels_ : (n_subjects,) int64, subjects in the order of ``subjects_ = np.unique(groups)``
    random_effects_ : (n_subjects, p) eq. 7.2 modes
    cluster_means_ : (K, p), cluster_covariances_ : (K, p, p), cluster_sizes_ : (K,)
    fixed_effects_ : (p,) the population mean of beta, sum_k N_k mu_k / N
    noise_precision_ : float, tau
    alpha_ : float
    objective_history_ : list of float, the objective E after each pass (never increasing)
    n_iter_ : int
    coef_names_ : list of str, the names of beta's coordinates ("intercept", then X's columns)
    prior_ : MixedPrior
    shrink_ : float, the shrink the prior was set with
    shrink_evidence_ : dict, ``shrink="auto"``'s evidence (held-out log density per subject by
        shrink, subjects, folds), or the given shrink

    Notes
    -----
    Groups that overlap in their random effects are reported as one cluster, as the objective and
    the held-out density both prefer (the four diets of ``datasets::ChickWeight``); well separated
    groups are found (``tests/data/panel_bodyweight.md``).
    """

    # what a saved model keeps: the global fit; per-subject results are the training data's
    _model_attrs: ClassVar[tuple[str, ...]] = ("n_clusters_", "model_", "prior_")
    _model_extras: ClassVar[tuple[str, ...]] = ("objective_history_", "n_iter_", "gaussian_")

    def __init__(
        self,
        alpha: float | str = ALPHA,
        *,
        alpha_prior: tuple[float, float] = ALPHA_PRIOR,
        fit_intercept: bool = True,
        shrink: str | float = SHRINK,
        prior: dict[str, Any] | None = None,
        tau_prior: tuple[float, float | None] = (DEFAULT_TAU_PRIOR[0], None),
        max_iter: int = MAX_PASSES,
        tol: float = TOL,
        min_change: float = MIN_CHANGE,
        init: str = "auto",
        random_state: int | None = None,
    ) -> None:
        keep_params(self, locals())

    def _design(self, X: Any, y: Any, groups: Any, fitting: bool) -> _Data:
        if isinstance(X, pd.Series):
            X = X.to_frame()
        if isinstance(X, pd.DataFrame):
            names = [str(c) for c in X.columns]
            cols = [X[c].to_numpy() for c in X.columns]
        else:
            arr = np.asarray(X)
            if arr.ndim == 1:
                arr = arr[:, None]
            if arr.ndim != 2:
                raise InputError(f"X must be 2-D (n_observations, p), got shape {arr.shape}")
            names = [f"x{j}" for j in range(arr.shape[1])]
            cols = [arr[:, j] for j in range(arr.shape[1])]
        n = len(cols[0]) if cols else np.asarray(X).shape[0]
        if n == 0:
            raise InputError("X has no rows (0 observations); at least 1 is required")
        y_name = str(y.name) if isinstance(y, pd.Series) and y.name is not None else "y"
        if isinstance(y, pd.Series) and y.name is not None and y_name in names:
            raise InputError(
                f"column {y_name!r} is both the response and a covariate; drop it from X"
            )
        y_arr = np.asarray(y)
        if y_arr.ndim != 1 or y_arr.shape[0] != n:
            raise InputError(f"y must have shape ({n},) like X's rows, got {y_arr.shape}")
        g_arr = np.asarray(groups)
        if g_arr.ndim != 1 or g_arr.shape[0] != n:
            raise InputError(f"groups must have shape ({n},) like X's rows, got {g_arr.shape}")
        missing = np.flatnonzero(pd.isna(pd.Series(g_arr, dtype=object)).to_numpy())
        if missing.size:
            raise InputError(f"groups, row {int(missing[0])}: missing subject id")
        Xc = [_as_numeric_column(c, nm, "covariate") for c, nm in zip(cols, names, strict=True)]
        yv = _as_numeric_column(y_arr, y_name, "response")
        if fitting:
            self.feature_names_in_ = np.array(names, dtype=object)
            self.n_features_in_ = len(names)
            # the covariates' names for a saved model (numbers, of the schema's numeric kind)
            self.schema_ = Schema(
                list(names),
                dict.fromkeys(names, "gaussian"),
                from_frame=isinstance(X, pd.DataFrame),
            )
            if self.fit_intercept:
                for c, nm in zip(Xc, names, strict=True):
                    if n > 1 and np.ptp(c) == 0:
                        raise InputError(
                            f"covariate {nm!r} is constant ({c[0]:g}) over all rows: it "
                            "duplicates the intercept (drop it, or fit_intercept=False)"
                        )
        else:
            if len(names) != self.n_features_in_:
                raise InputError(
                    f"X has {len(names)} covariates, but the model was fitted on "
                    f"{self.n_features_in_}"
                )
            if isinstance(X, pd.DataFrame) and list(self.feature_names_in_) != names:
                raise InputError(
                    f"X's columns {names} are not those of the fit {list(self.feature_names_in_)}"
                )
        if fitting:
            check_within_subject(names, Xc, g_arr)
        parts = ([np.ones(n)] if self.fit_intercept else []) + Xc
        if not parts:
            raise InputError("X has no covariates and fit_intercept=False: nothing to fit")
        design = np.ascontiguousarray(np.column_stack(parts))
        try:
            subjects, codes = np.unique(g_arr, return_inverse=True)
        except TypeError as err:  # mixed types that do not sort
            raise InputError(f"groups: subject ids must be of one type ({err})") from None
        return _Data(design, yv, codes.astype(np.int64).reshape(-1), subjects)

    def _moments(self, d: _Data) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        out = kme.subject_moments(d.X, d.y, d.codes, len(d.subjects))
        return out  # type: ignore[no-any-return]

    def _check_params(self) -> tuple[float, bool]:
        start, learn = check_alpha(self.alpha)
        check_alpha_prior(self.alpha_prior)
        check_shrink(self.shrink)
        check_int(self.max_iter, "max_iter")
        check_tol(self.tol)
        check_fraction(self.min_change, "min_change")
        check_choice(self.init, MIXED_INITS, "init")
        a, b = self.tau_prior
        check_positive(a, "tau_prior shape")
        if b is not None:
            check_positive(b, "tau_prior rate")
        return start, learn

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a model unpickled through read-only memory maps gets writable arrays (``writable``)
        super().__setstate__(writable(state))

    def fit(self, X: Any, y: Any, groups: Any) -> MixedEffectsDP:
        """Fit to the observations X (n_observations, p), responses y (n_observations,) and the
        subject of each row ``groups`` (n_observations,)."""
        _, learn = self._check_params()
        d = self._design(X, y, groups, fitting=True)
        G = len(d.subjects)
        if G < 2:
            raise InputError(f"groups has {G} subject; at least 2 are required")
        XtX, Xty, yty, n_obs = self._moments(d)
        order = np.arange(G)
        if self.random_state is not None:
            order = np.random.default_rng(self.random_state).permutation(G)
        sub = Subjects(
            XtX[order],
            Xty[order],
            yty[order],
            n_obs[order],
            np.ones(G, dtype=bool),
            order.astype(np.int64),
        )

        def map_chunks(fn: Callable[..., Any], *args: Any) -> list[Any]:
            return [fn(sub, *args)]

        # the start's seed as the distributed engine's (``dpmm longitudinal --seed``, default 0)
        seed = seed_entropy(0 if self.random_state is None else self.random_state)
        st, _ = start(
            map_chunks,
            G,
            self.alpha,
            check_shrink(self.shrink),
            self.tau_prior,
            self.alpha_prior,
            self.prior,
            self.init,
            seed,
            max_iter=int(self.max_iter),
            tol=float(self.tol),
            min_change=float(self.min_change),
        )
        # the sample's fit starts the passes over all subjects, as in ``dpmm longitudinal``
        # (its passes are not theirs: the objective counts other subjects)
        st.model.history = []
        fit = fit_subjects(
            sub, st, learn, int(self.max_iter), float(self.tol), float(self.min_change)
        )
        inv = np.empty(G, dtype=np.int64)
        inv[order] = np.arange(G)
        self.subjects_ = d.subjects
        self.labels_ = fit.z[inv]
        self.random_effects_ = fit.beta[inv]
        self.gaussian_ = st.gaussian
        self.shrink_ = float(st.shrink["chosen"])
        self.shrink_evidence_ = st.shrink
        self._set_model(fit.model, st.prior)
        self.objective_history_ = [float(h["objective"]) for h in fit.model.history]
        self.n_iter_ = len(fit.model.history)
        return self

    def _set_model(self, model: MixedModel, prior: MixedPrior) -> None:
        self.model_ = model
        self.prior_ = prior
        self.n_clusters_ = model.n_clusters
        self.cluster_means_ = model.mu.copy()
        self.cluster_covariances_ = np.linalg.inv(model.R)
        self.cluster_sizes_ = model.n.astype(np.int64)
        self.fixed_effects_ = (model.n[:, None] * model.mu).sum(axis=0) / model.n.sum()
        self.noise_precision_ = float(model.tau)
        self.alpha_ = float(model.alpha)
        self.coef_names_ = (["intercept"] if self.fit_intercept else []) + [
            str(c) for c in self.feature_names_in_
        ]

    def _after_load(self) -> None:
        """The attributes derived from ``model_`` and ``prior_``, for a loaded model."""
        self.feature_names_in_ = np.asarray(self.schema_.columns, dtype=object)
        self.n_features_in_ = len(self.schema_.columns)
        self._set_model(self.model_, self.prior_)

    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Write the fitted model as the directory ``path``
        (``pipeline.estimators.model.save_model``:
        JSON plus arrays, no pickle); ``pipeline.load_model(path)`` reads it back, and its
        ``predict`` / ``score_samples`` give what this one gives.

        Returns
        -------
        Path, ``path``.
        """
        from pipeline.estimators.model import save_model

        return save_model(self, path, overwrite=overwrite)

    def fit_predict(self, X: Any, y: Any, groups: Any) -> IntArray:
        return self.fit(X, y, groups).labels_  # type: ignore[no-any-return]

    def _components(self, X: Any, y: Any, groups: Any) -> tuple[NDArray[Any], Any, Any]:
        check_is_fitted(self, "model_")
        d = self._design(X, y, groups, fitting=False)
        XtX, Xty, yty, n_obs = self._moments(d)
        mu, R, ld, log_w = predictive_components(self.model_, self.prior_)
        comp, mix = kme.mixture_log_predictive(
            XtX, Xty, yty, n_obs, self.model_.tau, mu, R, ld, log_w
        )
        return d.subjects, comp + log_w, mix

    def predict(self, X: Any, y: Any, groups: Any) -> IntArray:
        """MAP cluster of each subject of ``np.unique(groups)`` (eq. 3.5's analogue, beta_i
        integrated out); -1 where a new cluster is the most probable. A subject's responses y
        are what place it, so they are needed as in ``score_samples``."""
        _, joint, _ = self._components(X, y, groups)
        k = np.argmax(joint, axis=1)
        return np.where(k == joint.shape[1] - 1, -1, k).astype(np.int64)

    def predict_proba(self, X: Any, y: Any, groups: Any) -> FloatArray:
        """Posterior probability of each cluster and a new one per subject: (n_subjects, K + 1)."""
        _, joint, mix = self._components(X, y, groups)
        return np.exp(joint - mix[:, None])  # type: ignore[no-any-return]

    def score_samples(self, X: Any, y: Any, groups: Any) -> FloatArray:
        """Each subject's log predictive density of its responses, log p(y_i | X_i) =
        log sum_k w_k N(y_i | X_i mu_k, X_i S_k X_i^T + tau^-1 I) over the fitted clusters and a
        new one (eq. 3.4's analogue, beta_i integrated out; S_k the covariance of a new subject's
        beta under cluster k's posterior, ``predictive_components``); subjects as
        ``np.unique(groups)``."""
        return self._components(X, y, groups)[2]  # type: ignore[no-any-return]

    def score(self, X: Any, y: Any, groups: Any) -> float:
        """Mean held-out log predictive density per subject (``score_samples``)."""
        return float(np.mean(self.score_samples(X, y, groups)))


def model_from_state(
    model: MixedModel,
    prior: MixedPrior,
    gaussian: Any,
    covariates: list[str],
    params: dict[str, Any],
    history: list[dict[str, Any]],
) -> MixedEffectsDP:
    """The ``MixedEffectsDP`` of a distributed run's final model (``dpmm longitudinal``): its
    ``predict`` / ``score_samples`` of a DataFrame of the ``covariates`` (in that order, an
    intercept added) are the run's per-subject clusters and log densities. ``params``: the
    estimator's parameters; ``history``: the run's passes (each with its ``objective``)."""
    est = MixedEffectsDP(**params)
    est.schema_ = Schema(list(covariates), dict.fromkeys(covariates, "gaussian"), from_frame=True)
    est.model_ = model
    est.prior_ = prior
    est.gaussian_ = gaussian
    est.objective_history_ = [float(h["objective"]) for h in history]
    est.n_iter_ = len(history)
    est._after_load()
    return est
