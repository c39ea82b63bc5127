"""``GridSearch`` on a real LocalCluster against scikit-learn's ``GridSearchCV`` and a serial
reference, the one-standard-error rule, the checks before any work, and ``MAPDP(tune="cv")``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.metrics import normalized_mutual_info_score
from sklearn.model_selection import GridSearchCV, KFold

from pipeline.core.config import TUNE_GRID
from pipeline.core.errors import InputError
from pipeline.estimators.baselines import CollapsedGibbs
from pipeline.estimators.bhc import BHC
from pipeline.estimators.grid import SearchError
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.search import GridSearch, select_index
from pipeline.estimators.tgmcmc import TreeGuidedMCMC


def blobs(n: int = 90, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return centres[y] + rng.normal(size=(n, 2)), y


GRID = {"alpha": [0.5, 5.0], "prior_scale": [0.3, 0.05], "family": ["gaussian", "diag-gaussian"]}
EST = MAPDP(n_restarts=1, random_state=0)


def test_matches_sklearn_gridsearchcv(client) -> None:
    X, _ = blobs()
    cv = KFold(4, shuffle=True, random_state=3)
    ours = GridSearch(EST, GRID, cv=cv, client=client).fit(X)
    ref = GridSearchCV(EST, GRID, cv=cv).fit(X)
    # the same fits on the same folds: the fold scores agree to rounding
    for j in range(4):
        np.testing.assert_allclose(
            ours.cv_results_[f"split{j}_test_score"],
            ref.cv_results_[f"split{j}_test_score"],
            rtol=1e-10,
        )
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"]
    )
    np.testing.assert_array_equal(
        ours.cv_results_["rank_test_score"], ref.cv_results_["rank_test_score"]
    )
    assert ours.cv_results_["params"] == ref.cv_results_["params"]
    assert ours.best_params_ == ref.best_params_
    assert ours.best_score_ == pytest.approx(ref.best_score_)
    np.testing.assert_array_equal(ours.best_estimator_.labels_, ref.best_estimator_.labels_)
    assert ours.score(X) == pytest.approx(ref.score(X))
    np.testing.assert_array_equal(ours.predict(X[:5]), ref.predict(X[:5]))


def test_dask_equals_serial_and_reports_clusters(client) -> None:
    X, _ = blobs(60, seed=1)
    grid = {"alpha": [0.2, 2.0]}
    dist = GridSearch(EST, grid, cv=3, client=client).fit(X)
    serial = GridSearch(EST, grid, cv=3, client=False).fit(X)
    for key in ("mean_test_score", "split0_test_score", "mean_n_clusters", "se_test_score"):
        np.testing.assert_array_equal(dist.cv_results_[key], serial.cv_results_[key])
    res = dist.cv_results_
    scores = np.column_stack([res[f"split{j}_test_score"] for j in range(3)])
    # the standard error of the mean over folds
    np.testing.assert_allclose(res["se_test_score"], scores.std(axis=1, ddof=1) / np.sqrt(3))
    assert np.all(res["mean_fit_time"] > 0)
    assert np.all(res["mean_n_clusters"] >= 1)
    frame = dist.to_frame()
    assert list(frame["alpha"]) == [0.2, 2.0]
    # the held-out score is the estimator's own on the held-out rows
    folds = list(KFold(3, shuffle=True, random_state=0).split(X))
    tr, te = folds[1]
    est = MAPDP(n_restarts=1, random_state=0, alpha=2.0).fit(X[tr])
    assert res["split1_test_score"][1] == pytest.approx(est.score(X[te]), rel=1e-12)
    assert res["split1_n_clusters"][1] == est.n_clusters_


def test_other_estimator(client) -> None:
    X, _ = blobs(45, seed=2)
    est = CollapsedGibbs(n_iter=10, burn_in=2, random_state=0)
    gs = GridSearch(est, {"alpha": [0.5, 2.0]}, cv=3, client=client).fit(X)
    assert gs.best_params_["alpha"] in (0.5, 2.0)
    assert np.isfinite(gs.best_score_)
    assert gs.labels_.shape == (45,)


def test_one_standard_error_rule() -> None:
    mean = np.array([-10.0, -10.2, -10.9, -10.05])
    se = np.array([0.3, 0.1, 0.1, 0.2])
    clusters = np.array([6.0, 3.0, 2.0, 3.0])
    assert select_index(mean, se, clusters, "best") == 0
    # within one SE of the best (>= -10.3): 0, 1, 3; fewest clusters 3 (1 and 3), larger mean 3
    assert select_index(mean, se, clusters, "one-se") == 3


def test_given_rule() -> None:
    """``select="given"``: the given candidate is kept unless the best beats it fold by fold by
    more than one standard error of the paired difference, however small each mean's own
    spread would make the gap look."""
    mean = np.array([-10.0, -10.1])
    se = np.array([1.0, 1.0])
    clusters = np.array([5.0, 3.0])
    # the best is ahead by 0.1 on every fold: a difference with no spread is evidence
    steady = np.array([[-9.0, -10.0, -11.0], [-9.1, -10.1, -11.1]])
    assert select_index(mean, se, clusters, "given", steady, 1) == 0
    # ahead by 0.1 on average but behind on one fold of three: mean 0.1 < se 0.15
    noisy = np.array([[-9.0, -10.0, -11.0], [-9.2, -10.2, -10.9]])
    assert select_index(mean, se, clusters, "given", noisy, 1) == 1
    # the given candidate is the best, or failed everywhere
    assert select_index(mean[::-1], se, clusters, "given", steady[::-1], 1) == 1
    assert select_index(np.array([-10.0, np.nan]), se, clusters, "given", steady, 1) == 0


def test_given_rule_in_search(client) -> None:
    X, _ = blobs(60, seed=3)
    grid = {"alpha": [0.5, 5.0], "prior_scale": [0.3, 0.05]}
    est = MAPDP(n_restarts=1, random_state=0, alpha=5.0, prior_scale=0.05)
    gs = GridSearch(est, grid, cv=3, select="given", refit=False, client=client).fit(X)
    assert gs.best_index_ == expected_given(gs.cv_results_, np.arange(4), 3)
    # the estimator's own configuration must be a candidate, checked before any fit
    with pytest.raises(SearchError, match=r"alpha=1\.0, prior_scale=0\.05 is not one of them"):
        GridSearch(est.set_params(alpha=1.0), grid, select="given", client=client).fit(X)


def test_one_se_in_search(client) -> None:
    X, _ = blobs(60, seed=4)
    grid = {"alpha": [0.1, 1.0, 30.0], "prior_scale": [0.3, 0.02]}
    best = GridSearch(EST, grid, cv=3, client=client, refit=False).fit(X)
    onese = GridSearch(EST, grid, cv=3, client=client, select="one-se", refit=False).fit(X)
    res = onese.cv_results_
    b = best.best_index_
    chosen = onese.best_index_
    assert res["mean_test_score"][chosen] >= res["mean_test_score"][b] - res["se_test_score"][b]
    within = res["mean_test_score"] >= res["mean_test_score"][b] - res["se_test_score"][b]
    assert res["mean_n_clusters"][chosen] == res["mean_n_clusters"][within].min()


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({}, "grid is empty"),
        ([], "grid is empty"),
        ({"alpha": []}, "'alpha' has no values"),
        ({"alpha": [1.0, 0.0]}, "alpha=0.0"),
        ({"alpha": [-1.0]}, "alpha must be a positive"),
        ({"prior_scale": [0.1, 0.0]}, "prior_scale must be in"),
        ({"prior_scale": [-2.0]}, "prior_scale must be in"),
        ({"concentration": [1.0]}, "no parameter 'concentration'"),
    ],
)
def test_bad_grid_before_any_work(grid, message) -> None:
    X, _ = blobs(30)
    # client=None would start a cluster: the error must come first, so no cluster is needed
    with pytest.raises(SearchError, match=message) as err:
        GridSearch(EST, grid, cv=3, client=None).fit(X)
    assert isinstance(err.value, InputError)
    assert not hasattr(GridSearch(EST, {"alpha": [1.0]}), "cv_results_")


def test_too_many_folds() -> None:
    X, _ = blobs(12)
    with pytest.raises(SearchError, match="13 folds but only 12 records"):
        GridSearch(EST, {"alpha": [1.0]}, cv=13).fit(X)
    groups = np.arange(12) // 4
    with pytest.raises(SearchError, match="4 folds but only 3 groups"):
        GridSearch(EST, {"alpha": [1.0]}, cv=4).fit(X, groups=groups)
    with pytest.raises(SearchError, match="at least 2 folds"):
        GridSearch(EST, {"alpha": [1.0]}, cv=1).fit(X)


def test_groups_hold_out_whole_groups(client) -> None:
    X, _ = blobs(60, seed=5)
    groups = np.arange(60) // 6
    gs = GridSearch(EST, {"alpha": [1.0]}, cv=5, client=client).fit(X, groups=groups)
    assert gs.n_splits_ == 5


def test_tune_cv(client) -> None:
    X, y = blobs(90, seed=6)
    m = MAPDP(tune="cv", random_state=0).fit(X)
    assert set(m.best_params_) == {"alpha", "prior_scale"}
    check_greedy_steps(MAPDP(random_state=0), m)
    assert normalized_mutual_info_score(y, m.labels_) > 0.9
    # the fitted model is the plain fit of the chosen configuration on all the records
    ref = MAPDP(random_state=0, **m.best_params_).fit(X)
    np.testing.assert_array_equal(m.labels_, ref.labels_)
    assert m.score(X) == pytest.approx(ref.score(X))
    with pytest.raises(ValueError, match="tune must be None or 'cv'"):
        MAPDP(tune="labels").fit(X)


def test_tune_cv_takes_missing_cells_as_the_fit_does(client) -> None:
    """A table with holes is tuned as ``missing="latent"`` fits it (the search's steps read the
    columns' kinds with the holes allowed; it refused the table before); with
    ``missing="refuse"`` the refusal names the input's row before any fold is fitted (it said
    "every fit failed" before)."""
    X, _ = blobs(60, seed=6)
    X[2, 0] = X[7, 1] = np.nan
    # a text column with a hole too: its kind was read as if holes were refused
    text = np.where(np.arange(60) % 3 == 0, "u", "v").astype(object)
    text[4] = None
    for table in (X, pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": text})):
        m = MAPDP(tune="cv", random_state=0).fit(table)
        assert set(m.best_params_) == {"alpha", "prior_scale"}
        assert m.labels_.shape == (60,)
    with pytest.raises(ValueError, match="column 'x0': row 2 is NaN"):
        MAPDP(tune="cv", missing="refuse", random_state=0).fit(X)


def test_tune_cv_fits_each_configuration_once(client) -> None:
    """The greedy search fits each configuration on each fold once: a step's current value
    reuses the previous step's results, so (4 + 4) x 5 fold fits run on the workers."""
    from distributed import get_task_stream

    X, _ = blobs(60, seed=6)
    with get_task_stream(client) as ts:
        m = MAPDP(tune="cv", random_state=0).fit(X)
    fits = [t for t in ts.data if t["key"].startswith("fit_and_score")]
    assert len(fits) == (4 + 4) * 5
    assert len(m.cv_results_["params"]) == 4 + 5


def test_known_results_are_reused(client) -> None:
    """``GridSearch.fit(known=...)``: a candidate already scored on the same folds takes those
    results; the others are fitted as without it."""
    X, _ = blobs()
    first = GridSearch(EST, {"alpha": [0.5, 5.0]}, cv=4, refit=False, client=client).fit(X)
    again = GridSearch(EST, {"alpha": [0.5, 5.0, 50.0]}, cv=4, refit=False, client=client).fit(
        X, known=[({"alpha": 5.0}, first.fold_results_[1])]
    )
    assert again.fold_results_[1] == first.fold_results_[1]  # fit times too: not refitted
    np.testing.assert_array_equal(
        again.cv_results_["split0_test_score"][:2], first.cv_results_["split0_test_score"]
    )
    # results of another configuration (one more parameter set) are not taken
    other = GridSearch(EST, {"alpha": [5.0]}, cv=4, refit=False, client=client).fit(
        X, known=[({"alpha": 5.0, "prior_scale": 0.05}, first.fold_results_[1])]
    )
    assert other.fold_results_[0] != first.fold_results_[1]
    fresh = GridSearch(EST, {"alpha": [50.0]}, cv=4, refit=False, client=client).fit(X)
    np.testing.assert_allclose(
        [r["score"] for r in again.fold_results_[2]], [r["score"] for r in fresh.fold_results_[0]]
    )


def expected_given(res: dict, rows: np.ndarray, given: int) -> int:
    """``select="given"`` recomputed from the fold scores of ``rows`` (one step's candidates):
    the row of the step's best candidate if its paired difference from candidate ``given``
    exceeds one standard error, else the row of ``given``."""
    n = int(res["n_folds_used"][rows[0]])
    folds = np.array([res[f"split{j}_test_score"][rows] for j in range(n)])
    best = int(np.nanargmax(res["mean_test_score"][rows]))
    d = folds[:, best] - folds[:, given]
    return int(rows[best if d.mean() > d.std(ddof=1) / np.sqrt(d.size) else given])


def check_greedy_steps(est: Any, m: Any) -> None:
    """``m.cv_results_`` is Raykov et al. 2016, Appendix A's greedy search from ``est``'s
    configuration: alpha, then the prior scale, each step's candidates the
    configuration so far with that one value changed (``TUNE_GRID``'s values and the current one),
    and the step's choice the ``select="given"`` rule over its rows."""
    res = m.cv_results_
    steps = list(dict.fromkeys(res["step"]))
    assert steps == ["alpha", "prior_scale"]
    current = {k: v for k, v in est.get_params().items() if k in m.best_params_}
    chosen_row = -1
    for name in steps:
        rows = np.flatnonzero(res["step"] == name)
        values = [res["params"][i][name] for i in rows]
        expect = list(TUNE_GRID[name])
        assert values == expect + ([current[name]] if current[name] not in expect else [])
        for i in rows:
            assert {k: v for k, v in res["params"][i].items() if k != name} == {
                k: v for k, v in current.items() if k != name
            }
        given = int(rows[values.index(current[name])])
        if chosen_row >= 0:
            # the current value is the configuration the previous step chose: its fold
            # results (scores, and fit times that a second fit would not repeat) are reused
            for key in [k for k in res if k.startswith("split") or k.endswith("fit_time")]:
                assert res[key][given] == res[key][chosen_row] or (
                    np.isnan(res[key][given]) and np.isnan(res[key][chosen_row])
                ), key
        chosen_row = expected_given(res, rows, values.index(current[name]))
        current = res["params"][chosen_row]
    assert m.best_params_ == current
    assert list(res["param_alpha"]) == [p["alpha"] for p in res["params"]]
    assert res["rank_test_score"][int(np.argmax(res["mean_test_score"]))] == 1


@pytest.mark.parametrize(
    "est",
    [
        BHC(tune="cv"),
        CollapsedGibbs(tune="cv", n_iter=15, burn_in=5, random_state=0),
        TreeGuidedMCMC(tune="cv", n_iter=10, burn_in=2, random_state=0),
    ],
    ids=["bhc", "collapsed-gibbs", "tgmcmc"],
)
def test_tune_cv_on_the_other_clustering_estimators(client, est) -> None:
    """``tune="cv"`` is the same procedure on every estimator with clusters and a density: the
    greedy steps of ``check_greedy_steps``, and the model is the plain fit of their choice on
    all the records."""
    X, y = blobs(60, seed=6)
    m = clone(est).fit(X)
    assert set(m.best_params_) == {"alpha", "prior_scale"}
    check_greedy_steps(est, m)
    ref = clone(est).set_params(tune=None, **m.best_params_).fit(X)
    np.testing.assert_array_equal(m.labels_, ref.labels_)
    assert m.score(X) == pytest.approx(ref.score(X))
    assert normalized_mutual_info_score(y, m.labels_) > 0.9
    with pytest.raises(ValueError, match="tune must be None or 'cv'"):
        clone(est).set_params(tune="labels").fit(X)
    with pytest.raises(ValueError, match="prior_scale"):
        clone(est).set_params(tune=None, prior_scale=1.5).fit(X)
