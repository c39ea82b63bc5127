"""The grid of a cross-validated search and its folds: the candidates checked before any work,
the (train, test) splits, and one fit scored per (candidate, fold), as Dask tasks."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.base import clone
from sklearn.model_selection import GroupKFold, KFold, ParameterGrid

from pipeline.core.errors import InputError
from pipeline.core.tasks import on_scattered

CV_SEED = 0


class SearchError(InputError):
    """A search that cannot start: empty grid, a value out of range, too many folds."""


def check_grid(param_grid: Any) -> list[dict[str, Any]]:
    """The candidates of ``param_grid`` in ``ParameterGrid`` order; a ``SearchError`` if none."""
    if isinstance(param_grid, Mapping):
        grids: list[Mapping[str, Any]] = [param_grid]
    elif isinstance(param_grid, Sequence) and not isinstance(param_grid, str):
        grids = list(param_grid)
    else:
        raise SearchError(f"param_grid must be a dict or a list of dicts, got {param_grid!r}")
    if not grids or any(not isinstance(g, Mapping) or not g for g in grids):
        raise SearchError("the parameter grid is empty: give at least one parameter and value")
    for g in grids:
        for name, values in g.items():
            if isinstance(values, str) or not isinstance(values, Iterable):
                raise SearchError(f"grid parameter {name!r}: expected a list of values")
            if len(list(values)) == 0:
                raise SearchError(f"grid parameter {name!r} has no values")
    return list(ParameterGrid(grids))


def check_candidates(estimator: Any, candidates: list[dict[str, Any]]) -> None:
    """Every candidate is valid for ``estimator``; a ``SearchError`` names the first that is not."""
    valid = set(estimator.get_params(deep=True))
    for cand in candidates:
        unknown = sorted(set(cand) - valid)
        if unknown:
            raise SearchError(
                f"{type(estimator).__name__} has no parameter {unknown[0]!r} "
                f"(it has: {', '.join(sorted(valid))})"
            )
        est = clone(estimator).set_params(**cand)
        check = getattr(est, "_check_params", None)
        try:
            if check is not None:
                check()
        except (ValueError, TypeError) as err:
            raise SearchError(f"grid value {show_candidate(cand)}: {err}") from None


def show_candidate(cand: Mapping[str, Any]) -> str:
    """``name=value, ...`` of a candidate, by name (for messages)."""
    return ", ".join(f"{k}={v!r}" for k, v in sorted(cand.items()))


def same_param(a: Any, b: Any) -> bool:
    """Whether two parameter values are equal (``GridSearch``'s and ``tune``'s test)."""
    # parameters are numbers, strings, None or dicts of them; == on arrays would not be a bool
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def same_candidate(cand: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Whether every parameter of ``cand`` has the same value in ``params``."""
    return all(k in params and same_param(params[k], v) for k, v in cand.items())


def make_splits(
    n_samples: int, cv: Any, groups: Any = None, random_state: Any = CV_SEED
) -> list[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """The (train, test) index pairs of ``cv``: an int K (shuffled ``KFold``, or ``GroupKFold``
    with ``groups``), a splitter, or pairs; a ``SearchError`` when K < 2 or K exceeds the units."""
    X_dummy = np.zeros((n_samples, 1))
    if isinstance(cv, (int, np.integer)) and not isinstance(cv, bool):
        k = int(cv)
        if k < 2:
            raise SearchError(f"cv must be at least 2 folds, got {k}")
        if groups is not None:
            n_groups = len(np.unique(np.asarray(groups)))
            if k > n_groups:
                raise SearchError(f"{k} folds but only {n_groups} groups: use at most {n_groups}")
            splitter: Any = GroupKFold(n_splits=k)
        else:
            if k > n_samples:
                raise SearchError(
                    f"{k} folds but only {n_samples} records: use at most {n_samples} folds"
                )
            # shuffled: a data set sorted by class would otherwise hold out whole clusters
            splitter = KFold(n_splits=k, shuffle=True, random_state=random_state)
        pairs = splitter.split(X_dummy, groups=groups)
    elif hasattr(cv, "split"):
        n_splits = cv.get_n_splits(X_dummy, groups=groups)
        if groups is None and n_splits > n_samples:
            raise SearchError(
                f"{n_splits} folds but only {n_samples} records: use at most {n_samples} folds"
            )
        pairs = cv.split(X_dummy, groups=groups)
    else:
        pairs = cv
    try:
        out = [(np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64)) for tr, te in pairs]
    except ValueError as err:
        raise SearchError(f"cv: {err}") from None
    if len(out) < 1:
        raise SearchError("cv gave no (train, test) split")
    for i, (tr, te) in enumerate(out):
        if tr.size == 0 or te.size == 0:
            raise SearchError(f"cv split {i} has an empty training or test set")
    return out


def fit_and_score(
    estimator: Any,
    params: dict[str, Any],
    X: Any,
    train: Any,
    test: Any,
    error_score: Any = "raise",
) -> dict[str, Any]:
    """Fit a clone of ``estimator`` with ``params`` on the rows ``train`` of X and score ``test``
    (mean held-out log predictive density, clusters, seconds), in a Dask worker; a failed fit
    scores ``error_score`` with its message as ``"error"``, unless that is ``"raise"``."""
    est = clone(estimator).set_params(**params)
    Xtr, Xte = _rows(X, train), _rows(X, test)
    t0 = time.perf_counter()
    from sklearn.exceptions import ConvergenceWarning

    try:
        with warnings.catch_warnings():
            # a fold fit that stops at max_iter is still a fit to score; the refit warns
            warnings.simplefilter("ignore", category=ConvergenceWarning)
            est.fit(Xtr)
        t1 = time.perf_counter()
        score = float(est.score(Xte))
    except (ValueError, ArithmeticError) as err:
        if isinstance(error_score, str) and error_score == "raise":
            raise
        t = time.perf_counter() - t0
        return {
            "score": float(error_score),
            "n_clusters": math.nan,
            "fit_time": t,
            "score_time": 0.0,
            "error": f"{type(err).__name__}: {err}",
        }
    t2 = time.perf_counter()
    return {
        "score": score,
        "n_clusters": float(getattr(est, "n_clusters_", math.nan)),
        "fit_time": t1 - t0,
        "score_time": t2 - t1,
        "error": "",
    }


def _rows(X: Any, idx: Any) -> Any:
    if hasattr(X, "iloc"):
        return X.iloc[idx]
    return X[idx]


@contextlib.contextmanager
def search_client(client: Any) -> Any:
    """The given client, else the current one, else a LocalCluster for the search."""
    if client is not None:
        yield client
        return
    try:
        from distributed import get_client

        yield get_client()
        return
    except ValueError:
        pass
    from pipeline.distributed.client import dask_client

    with dask_client(dashboard_address=None, quiet=True) as c:
        yield c


def run_grid(
    estimator: Any,
    candidates: list[dict[str, Any]],
    X: Any,
    splits: list[tuple[NDArray[np.int64], NDArray[np.int64]]],
    client: Any = None,
    error_score: Any = "raise",
    known: Mapping[int, list[dict[str, Any]]] | None = None,
) -> list[list[dict[str, Any]]]:
    """``fit_and_score`` of every (candidate, fold) as Dask tasks on ``client``; results[i][j]
    of candidate i on fold j. X and the splits are scattered once. ``known[i]``: candidate i's
    results on these splits, already computed, taken as they are instead of fitted again."""
    known = known or {}
    todo = [i for i in range(len(candidates)) if i not in known]
    if client is None or not todo:
        # a serial reference (and the path when no Dask is wanted, or nothing is left to fit)
        done = {
            i: [
                fit_and_score(estimator, candidates[i], X, tr, te, error_score) for tr, te in splits
            ]
            for i in todo
        }
    else:

        def cells(X_f: Any, est_f: Any, *folds_f: Any) -> dict[int, list[dict[str, Any]]]:
            futs = {
                i: [
                    client.submit(
                        fit_and_score, est_f, candidates[i], X_f, tr, te, error_score, pure=False
                    )
                    for tr, te in zip(folds_f[::2], folds_f[1::2])
                ]
                for i in todo
            }
            return {i: client.gather(row) for i, row in futs.items()}

        # X, the estimator and each fold's rows on one worker each (the others fetch them once)
        folds = [rows for split in splits for rows in split]
        done = on_scattered(client, [X, estimator, *folds], cells, "grid")
    return [known[i] if i in known else done[i] for i in range(len(candidates))]
