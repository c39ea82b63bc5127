"""Cross-validated hyperparameter search on Dask, in scikit-learn's ``GridSearchCV`` conventions.

Raykov et al. 2016, Appendix A, option 4: fit one clone per (candidate, fold) as a Dask task and
score each by the estimator's ``score``, the mean held-out log predictive density (eq. 3.4). No
label is ever used.

``select="best"`` takes the largest mean; ``"one-se"`` the candidate with the fewest clusters
within one standard error of the best (Hastie et al. 2009, 7.10); ``"given"`` keeps the
estimator's own parameters unless the best beats them by more than the paired standard error of
their fold-by-fold difference (``tune="cv"`` uses it). An empty grid, an unknown or refused
value, an estimator without a density and more folds than records raise before any fit.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from pipeline.core.config import SEARCH_SELECT, keep_params
from pipeline.core.diagnose import clearly_better
from pipeline.estimators.grid import (
    CV_SEED,
    SearchError,
    check_candidates,
    check_grid,
    make_splits,
    run_grid,
    same_candidate,
    search_client,
    show_candidate,
)


def select_index(
    mean: NDArray[np.float64],
    se: NDArray[np.float64],
    clusters: Any,
    rule: str,
    scores: NDArray[np.float64] | None = None,
    given: int | None = None,
) -> int:
    """The chosen candidate: the largest mean (``"best"``), the one-standard-error rule
    (``"one-se"``) with the fewest mean clusters as the simplest, or candidate ``given`` unless
    the best beats it by more than one paired standard error (``"given"``; ``scores`` of shape
    (n_candidates, n_folds) are the fold scores). Module docstring."""
    finite = np.where(np.isfinite(mean), mean, -np.inf)
    best = int(np.argmax(finite))
    if rule == "best":
        return best
    if rule == "given":
        if scores is None or given is None:
            raise ValueError("select='given' needs the fold scores and the given candidate")
        if best == given or not np.isfinite(finite[given]):
            return best
        diff = np.asarray(scores[best], dtype=np.float64) - scores[given]
        return best if clearly_better(diff) else given
    within = np.flatnonzero(finite >= finite[best] - (se[best] if np.isfinite(se[best]) else 0.0))
    k = np.asarray(clusters, dtype=np.float64)[within]
    k = np.where(np.isfinite(k), k, np.inf)
    # fewest clusters first, then the larger mean
    order = np.lexsort((-finite[within], k))
    return int(within[order[0]])


def results_table(
    candidates: list[dict[str, Any]], results: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """``cv_results_`` in scikit-learn's layout, plus standard errors and clusters per fold."""
    n_c = len(candidates)
    failed = [j for j in range(len(results[0])) if all(row[j]["error"] for row in results)]
    if failed:
        # a fold on which every candidate fails says nothing about them: left out of every mean
        warnings.warn(
            f"cv: every candidate failed on fold(s) {failed} ({results[0][failed[0]]['error']}); "
            "those folds are left out",
            UserWarning,
            stacklevel=3,
        )
        results = [[r for j, r in enumerate(row) if j not in failed] for row in results]
        if not results[0]:
            raise SearchError(f"every fit failed: {results and failed}")
    n_s = len(results[0]) if results else 0
    table: dict[str, Any] = {"params": candidates}
    names = sorted({k for c in candidates for k in c})
    for name in names:
        col = np.ma.MaskedArray(np.empty(n_c, dtype=object), mask=True)
        for i, c in enumerate(candidates):
            if name in c:
                col[i] = c[name]
        table[f"param_{name}"] = col
    for key, out in (("score", "test_score"), ("n_clusters", "n_clusters")):
        arr = np.array([[r[key] for r in row] for row in results], dtype=np.float64)
        for j in range(n_s):
            table[f"split{j}_{out}"] = arr[:, j]
        table[f"mean_{out}"] = arr.mean(axis=1)
        table[f"std_{out}"] = arr.std(axis=1)
        if key == "score":
            table["se_test_score"] = (
                arr.std(axis=1, ddof=1) / math.sqrt(n_s) if n_s > 1 else (np.full(n_c, np.nan))
            )
    for key in ("fit_time", "score_time"):
        arr = np.array([[r[key] for r in row] for row in results], dtype=np.float64)
        table[f"mean_{key}"] = arr.mean(axis=1)
        table[f"std_{key}"] = arr.std(axis=1)
        table[f"total_{key}"] = arr.sum(axis=1)
    table["n_folds_used"] = np.full(n_c, n_s)
    table["rank_test_score"] = rank_scores(table["mean_test_score"])
    return table


def rank_scores(mean: NDArray[np.float64]) -> NDArray[np.int32]:
    """scikit-learn's ``rank_test_score``: 1 for the largest mean, ties share the smallest
    rank, a candidate without a finite mean last."""
    m = np.where(np.isfinite(mean), mean, -np.inf)
    return np.searchsorted(np.sort(-m), -m, side="left").astype(np.int32) + 1


def _estimator_has(attr: str) -> Any:
    def check(self: GridSearch) -> bool:
        if hasattr(self, "best_estimator_"):
            return hasattr(self.best_estimator_, attr)
        return hasattr(self.estimator, attr)

    return check


class GridSearch(MetaEstimatorMixin, BaseEstimator):
    """Exhaustive search over a parameter grid by K-fold held-out log predictive density, each
    (candidate, fold) fit a Dask task (module docstring).

    Parameters
    ----------
    estimator : a clustering estimator of the project with ``score``
    param_grid : dict of lists, or list of such dicts
        As ``sklearn.model_selection.GridSearchCV``'s.
    cv : int, cross-validation splitter or iterable of (train, test), default=5
        An int K is a shuffled ``KFold(K, random_state=random_state)``, or ``GroupKFold(K)``
        when ``fit`` is given groups.
    select : {"best", "one-se", "given"}, default="best"
        The rule of the module docstring.
    refit : bool, default=True
        Refit the chosen candidate on all of X as ``best_estimator_``.
    client : distributed.Client, optional
        Default the current client, else a LocalCluster; ``False`` fits serially in this process.
    random_state : int, default=0
        Shuffles the folds of an int ``cv``.
    error_score : "raise" or float, default="raise"
        What a failed fit scores; a fold on which every candidate fails is left out with a warning.

    Attributes
    ----------
    cv_results_ : dict of arrays
        scikit-learn's keys plus ``se_test_score``, ``split<j>_n_clusters``, ``mean_n_clusters``,
        ``std_n_clusters`` and ``total_fit_time``.
    best_index_ : int
    best_params_ : dict
    best_score_ : float
    best_estimator_ : estimator
    refit_time_ : float
    n_splits_ : int
    fold_results_ : list of lists of dict
        ``fold_results_[i][j]``: candidate i on fold j (``fit_and_score``'s dict).
    wall_time_ : float
        Seconds from the first submitted fit to the last result.
    """

    def __init__(
        self,
        estimator: Any,
        param_grid: Any,
        *,
        cv: Any = 5,
        select: str = "best",
        refit: bool = True,
        client: Any = None,
        random_state: Any = CV_SEED,
        error_score: Any = "raise",
    ):
        keep_params(self, locals())

    def _check(self, X: Any, groups: Any) -> tuple[list[dict[str, Any]], list[Any]]:
        if self.select not in SEARCH_SELECT:
            raise SearchError(f"select must be one of {SEARCH_SELECT}, got {self.select!r}")
        est = self.estimator
        if not hasattr(est, "score") or not callable(getattr(type(est), "score", None)):
            raise SearchError(f"{type(est).__name__} has no held-out density (score)")
        if hasattr(est, "_has_density") and not est._has_density():
            raise SearchError(
                f"{type(est).__name__} with these parameters has no held-out density (score)"
            )
        candidates = check_grid(self.param_grid)
        check_candidates(est, candidates)
        if self.select == "given":
            self._given_index(candidates)
        n = len(X) if not hasattr(X, "shape") else int(X.shape[0])
        splits = make_splits(n, self.cv, groups, self.random_state)
        return candidates, splits

    def fit(
        self,
        X: Any,
        y: Any = None,
        groups: Any = None,
        known: Sequence[tuple[Mapping[str, Any], list[dict[str, Any]]]] = (),
    ) -> GridSearch:
        """Run the search on X (y is ignored: no label is ever used).

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features)
        y : ignored
        groups : array-like of shape (n_samples,), optional
            Group of each record: the folds of an int ``cv`` then hold out whole groups.
        known : sequence of (candidate, fold results)
            Rows of an earlier search's ``fold_results_`` on the same X and folds; a candidate
            equal to one takes its results instead of being fitted again.

        Returns
        -------
        self
        """
        if not hasattr(X, "iloc"):
            X = np.asarray(X)
        candidates, splits = self._check(X, groups)
        reuse = {
            i: list(res)
            for i, cand in enumerate(candidates)
            for done, res in known
            if len(res) == len(splits) and set(cand) == set(done) and same_candidate(cand, done)
        }
        t0 = time.perf_counter()
        if self.client is False:
            results = run_grid(self.estimator, candidates, X, splits, None, self.error_score, reuse)
        else:
            with search_client(self.client) as client:
                results = run_grid(
                    self.estimator, candidates, X, splits, client, self.error_score, reuse
                )
        self.wall_time_ = time.perf_counter() - t0
        self.fold_results_ = results
        table = results_table(candidates, results)
        self.cv_results_ = table
        self.n_splits_ = len(splits)
        n_s = int(table["n_folds_used"][0]) if candidates else 0
        self.best_index_ = select_index(
            table["mean_test_score"],
            table["se_test_score"],
            table["mean_n_clusters"],
            self.select,
            np.array([table[f"split{j}_test_score"] for j in range(n_s)]).T,
            self._given_index(candidates) if self.select == "given" else None,
        )
        self.best_params_ = dict(candidates[self.best_index_])
        self.best_score_ = float(table["mean_test_score"][self.best_index_])
        self.scorer_ = "score"
        self.multimetric_ = False
        if self.refit:
            t1 = time.perf_counter()
            self.best_estimator_ = clone(self.estimator).set_params(**self.best_params_).fit(X)
            self.refit_time_ = time.perf_counter() - t1
        return self

    def _given_index(self, candidates: list[dict[str, Any]]) -> int:
        """The candidate equal to the estimator's own parameters (``select="given"``)."""
        own = self.estimator.get_params(deep=False)
        for i, cand in enumerate(candidates):
            if same_candidate(cand, own):
                return i
        keys = sorted({k for c in candidates for k in c})
        raise SearchError(
            "select='given' needs the estimator's own parameters among the candidates: "
            + show_candidate({k: own.get(k) for k in keys})
            + " is not one of them"
        )

    def to_frame(self) -> Any:
        """``cv_results_`` as a DataFrame, one row per candidate (parameters as columns)."""
        import pandas as pd

        check_is_fitted(self, "cv_results_")
        res = self.cv_results_
        cols: dict[str, Any] = {}
        for k, v in res.items():
            if k == "params":
                continue
            if k.startswith("param_"):
                cols[k[len("param_") :]] = [
                    None if np.ma.is_masked(x) else x for x in np.ma.asarray(v).tolist()
                ]
            else:
                cols[k] = v
        return pd.DataFrame(cols)

    def _best(self) -> Any:
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_

    @property
    def labels_(self) -> Any:
        """The refitted estimator's labels of the training records."""
        return self._best().labels_

    @available_if(_estimator_has("predict"))
    def predict(self, X: Any) -> Any:
        """``best_estimator_.predict``."""
        return self._best().predict(X)

    @available_if(_estimator_has("score_samples"))
    def score_samples(self, X: Any) -> Any:
        """``best_estimator_.score_samples``: log predictive density per record."""
        return self._best().score_samples(X)

    def score(self, X: Any, y: Any = None) -> float:
        """``best_estimator_.score``: mean log predictive density per record."""
        return float(self._best().score(X))
