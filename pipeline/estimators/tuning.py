"""``tune="cv"``: an estimator's hyperparameters chosen by K-fold held-out log predictive density.

Raykov et al. 2016, Appendix A: option 2's greedy search, one hyperparameter at a time from the
estimator's own configuration, scored by held-out density over K folds as option 4 recommends.
The hyperparameters are taken in ``TUNE_ORDER`` (the Gaussian covariance is ``family="auto"``'s
own held-out choice, ``Schema.choose_structure``), each over ``TUNE_GRID`` plus its current value,
as a ``GridSearch`` with ``select="given"`` on the same folds, reusing the fold results of the
current value. The estimator is then fitted to all the records with the choice. No label is used
anywhere.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.base import clone

from pipeline.core.config import TUNE_GRID
from pipeline.families.schema import Schema, as_frame

TUNE_CHOICES = (None, "cv")
TUNE_FOLDS = 5
TUNE_SELECT = "given"
#: the hyperparameters in the order the greedy search takes them (module docstring); the
#: covariance is ``family="auto"``'s own held-out choice (``Schema.choose_structure``)
TUNE_ORDER = ("alpha", "prior_scale")


def check_tune(value: Any) -> Any:
    if value not in TUNE_CHOICES:
        raise ValueError(f"tune must be None or 'cv', got {value!r}")
    return value


def tune_steps(est: Any, X: Any) -> list[tuple[str, list[Any]]]:
    """The greedy search's steps for ``est`` on X: each hyperparameter of ``TUNE_ORDER`` with
    ``TUNE_GRID``'s values, then ``est``'s own; the scale is left out for a given prior or without
    Gaussian columns."""
    from pipeline.estimators.grid import same_param

    df, from_frame = as_frame(X)
    gauss = False
    if isinstance(est.family, (str, dict)):
        # the columns read as the fit reads them (``_encode_fit``; ``missing`` checked with the
        # other parameters before the search): a bad cell is refused here naming the input's
        # row, not a fold's
        missing = getattr(est, "missing", "refuse") == "latent"
        schema = Schema.infer(df, est.family, from_frame, missing=missing)
        schema.encode(df, fitting=True)
        gauss = any(k in ("gaussian", "diag-gaussian") for k in schema.kinds.values())
    own = est.get_params(deep=False)
    steps: list[tuple[str, list[Any]]] = []
    for name in TUNE_ORDER if gauss else ("alpha",):
        values = list(TUNE_GRID[name])
        if not any(same_param(v, own[name]) for v in values):
            values.append(own[name])
        steps.append((name, values))
    return steps


def tune_cv(est: Any, X: Any) -> Any:
    """Fit ``est`` (``tune="cv"``) by the module's procedure: ``tune_steps``, each a ``GridSearch``
    on the same ``TUNE_FOLDS`` folds with ``TUNE_SELECT``, then a fit of all of X with the choice,
    setting ``best_params_`` and ``cv_results_`` (``step`` names each row's hyperparameter) too.
    The fold fits run on the current Dask client if there is one, else in this process."""
    import dask

    from pipeline.estimators.search import GridSearch

    if dask.is_dask_collection(X):
        raise ValueError("tune='cv' takes records in memory; use `dpmm cv` for a dataset store")
    base = clone(est).set_params(tune=None)
    if getattr(base, "n_restarts", None) == "auto":
        # a fold fit is a score, not the model: one run each; the final fit keeps "auto"
        base.set_params(n_restarts=1)
    n = int(np.asarray(X).shape[0]) if not hasattr(X, "iloc") else len(X)
    folds = min(TUNE_FOLDS, n)
    steps = tune_steps(est, X)
    chosen = {name: est.get_params(deep=False)[name] for name, _ in steps}
    tables: list[tuple[str, dict[str, Any]]] = []
    client = _current_client()
    # the fold results of the configuration chosen so far: each step's current value
    current: list[dict[str, Any]] | None = None
    for name, values in steps:
        search = GridSearch(
            clone(base).set_params(**chosen),
            {name: values},
            cv=folds,
            select=TUNE_SELECT,
            refit=False,
            client=client,
            random_state=0,
            error_score=np.nan,
        )
        with warnings.catch_warnings():
            # a fold on which every cell fails (a column constant in its training rows) is left
            # out of every mean by design; ``cv_results_["n_folds_used"]`` says so
            warnings.filterwarnings(
                "ignore", message="cv: every candidate failed", category=UserWarning
            )
            search.fit(X, known=[] if current is None else [({name: chosen[name]}, current)])
        tables.append(
            (
                name,
                {
                    **search.cv_results_,
                    "params": [{**chosen, **p} for p in search.cv_results_["params"]],
                },
            )
        )
        chosen[name] = search.best_params_[name]
        current = search.fold_results_[search.best_index_]
    final = clone(est).set_params(tune=None, **chosen)
    final.fit(X)
    # the fitted state (attributes and the caches predict uses), the parameters kept as given
    params = est.get_params(deep=False)
    vars(est).update({k: v for k, v in vars(final).items() if k not in params})
    est.best_params_ = chosen
    est.cv_results_ = _concat_results(tables)
    return est


def _concat_results(tables: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The steps' ``cv_results_`` one after the other, in ``GridSearch``'s layout, with
    ``rank_test_score`` over all rows; a step with fewer ``split*`` columns has NaN in the rest."""
    from pipeline.estimators.search import rank_scores

    params = [p for _, t in tables for p in t["params"]]
    out: dict[str, Any] = {"params": params}
    out["step"] = np.array([name for name, t in tables for _ in t["params"]], dtype=object)
    for key in sorted({k for c in params for k in c}):
        col = np.ma.MaskedArray(np.empty(len(params), dtype=object), mask=False)
        for i, c in enumerate(params):
            col[i] = c[key]
        out[f"param_{key}"] = col
    keys = [k for _, t in tables for k in t if k not in out and not k.startswith("param")]
    for key in dict.fromkeys(keys):
        if key == "rank_test_score":
            continue
        parts = [
            np.asarray(t[key]) if key in t else np.full(len(t["params"]), np.nan) for _, t in tables
        ]
        out[key] = np.concatenate(parts)
    out["rank_test_score"] = rank_scores(out["mean_test_score"])
    return out


def _current_client() -> Any:
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return False
