"""The defaults on data no one here generated (issue 36): missing cells, constant columns, wide
tables, binary columns, and the degenerate-fit warning; with small real tables under
tests/data/real/ (their sources in that folder's README)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score as nmi

from pipeline import MAPDP
from pipeline.core.diagnose import DegenerateFitWarning
from pipeline.families import Bernoulli, GaussianNW, NormalGamma, ProductFamily
from tests.reference import dpm_observed_log_density

REAL = Path(__file__).resolve().parents[2] / "data" / "real"


def _mixture(seed: int, n: int = 600, d: int = 5, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 6.0, (k, d))
    y = rng.integers(0, k, n)
    A = rng.normal(0.0, 0.4, (d, d)) + np.eye(d)
    return centres[y] + rng.normal(size=(n, d)) @ A.T, y


def _quiet_fit(est: MAPDP, X: object) -> MAPDP:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        return est.fit(X)


# -- missing cells -------------------------------------------------------------------------------


def test_missing_cells_cluster_as_well_as_complete_data() -> None:
    """10% of the cells removed at random: NMI within 0.02 of the complete data's."""
    X, y = _mixture(0)
    rng = np.random.default_rng(1)
    Xm = X.copy()
    Xm[rng.random(X.shape) < 0.1] = np.nan
    full = MAPDP(random_state=0).fit(X)
    holes = MAPDP(random_state=0).fit(Xm)
    assert nmi(y, holes.labels_) >= nmi(y, full.labels_) - 0.02
    assert np.all(holes.labels_ >= 0)
    assert np.isfinite(holes.score_samples(Xm)).all()


def test_missing_cells_density_is_the_observed_marginal() -> None:
    """The held-out density of a record with missing cells is the DP mixture of the clusters'
    Student-t predictives marginalised onto the observed dimensions (SciPy), at 1e-8."""
    X, _y = _mixture(2, n=300, d=4, k=3)
    X = X + 1e-7 * np.random.default_rng(3).normal(size=X.shape)  # off any recording grid
    m = MAPDP(random_state=0).fit(X)
    fam = m.family_.groups[0][0]
    assert isinstance(fam, GaussianNW) and fam.step is None
    rng = np.random.default_rng(4)
    Xt = _mixture(5, n=12, d=4, k=3)[0]
    masks = [np.array([True, False, True, True]), np.array([False, False, True, False])]
    Xt[:6][:, ~masks[0]] = np.nan
    Xt[6:][:, ~masks[1]] = np.nan
    got = m.score_samples(Xt)
    stats = np.asarray(m.cluster_stats_)
    for i, x in enumerate(Xt):
        want = dpm_observed_log_density(fam, stats, m.alpha_, x)
        assert got[i] == pytest.approx(want, rel=1e-8, abs=1e-8)
    del rng


@pytest.mark.parametrize(
    "fam",
    [
        GaussianNW(m0=[0.0, 1.0, -1.0], c0=0.5, B0=np.diag([0.5, 1.0, 2.0]), a0=5.0),
        NormalGamma(m0=[0.0, 1.0, -1.0], c0=1.0, a0=2.0, b0=[1.0, 0.5, 2.0]),
        Bernoulli(a=[1.5, 2.0, 0.7], b=[1.0, 0.5, 3.0]),
    ],
    ids=["normal-wishart", "normal-gamma", "bernoulli"],
)
def test_restrict_is_the_marginal(fam: object) -> None:
    """Restricted to every column it is the family itself; for independent columns the
    predictive of the observed columns plus that of the others is the whole record's."""
    pf = ProductFamily([(fam, [0, 1, 2])])  # type: ignore[list-item]
    rng = np.random.default_rng(6)
    X = (
        (rng.random((20, 3)) < 0.4).astype(float)
        if isinstance(fam, Bernoulli)
        else rng.normal(size=(20, 3))
    )
    s = pf.stats_of(X)
    x = X[0]
    whole, idx = pf.restrict(np.ones(3, dtype=bool))
    assert whole.log_predictive(x, X) == pytest.approx(pf.log_predictive(x, X), rel=1e-12)
    np.testing.assert_array_equal(s[:, idx], s)
    if isinstance(fam, GaussianNW):
        return
    keep = np.array([True, False, True])
    a, ia = pf.restrict(keep)
    b, _ib = pf.restrict(~keep)
    part = a.log_predictive(x[keep], X[:, keep]) + b.log_predictive(x[~keep], X[:, ~keep])
    assert part == pytest.approx(pf.log_predictive(x, X), rel=1e-10)
    np.testing.assert_array_equal(s[:, ia], a.stats_of(X[:, keep]))


def test_missing_refuse_keeps_the_error() -> None:
    X, _y = _mixture(7, n=50)
    X[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"column 'x2': row 3 is NaN"):
        MAPDP(missing="refuse").fit(X)
    with pytest.raises(ValueError, match="missing must be one of"):
        MAPDP(missing="impute").fit(X)


def test_missing_categorical_and_model_round_trip(tmp_path: Path) -> None:
    df = pd.read_csv(REAL / "clust_housevotes84.csv")
    X = df.drop(columns=["label"])
    assert X.isna().any().any()
    m = MAPDP(random_state=0).fit(X)
    assert 2 <= m.n_clusters_ <= len(X) // 10
    m.save(tmp_path / "model")
    from pipeline import load_model

    back = load_model(tmp_path / "model")
    np.testing.assert_array_equal(back.predict(X), m.predict(X))
    np.testing.assert_allclose(back.score_samples(X), m.score_samples(X), rtol=1e-12)


def test_integer_columns_with_holes_keep_their_discrete_family(tmp_path: Path) -> None:
    """A CSV integer column with an empty cell is read as floats; ``family="auto"`` judges it by
    the values present, as the same column without holes (a 0/1 vote stays Bernoulli, a short
    score scale stays categorical), while a float column with holes stays Gaussian."""
    rng = np.random.default_rng(4)
    df = pd.DataFrame(
        {
            "vote": rng.integers(0, 2, 120),
            "score": rng.integers(1, 6, 120),
            "size": rng.normal(size=120),
        }
    )
    full = MAPDP(random_state=0).fit(df).schema_.kinds
    holed = df.astype(float)
    holed.iloc[[3, 50], 0] = np.nan
    holed.iloc[[7], 1] = np.nan
    holed.iloc[[9], 2] = np.nan
    holed.to_csv(tmp_path / "t.csv", index=False)
    back = pd.read_csv(tmp_path / "t.csv")
    assert back["vote"].dtype == np.float64
    kinds = MAPDP(random_state=0).fit(back).schema_.kinds
    assert kinds == full == {"vote": "bernoulli", "score": "categorical", "size": "gaussian"}


# -- constant columns, wide tables, degenerate fits ------------------------------------------------


def test_constant_column_dropped_with_a_warning() -> None:
    X, _y = _mixture(8, n=200, d=3)
    df = pd.DataFrame(X, columns=["a", "b", "c"]).assign(flat=7.0)
    with pytest.warns(UserWarning, match=r"constant columns dropped.*'flat' \(every value 7.0\)"):
        m = MAPDP(random_state=0).fit(df)
    assert m.schema_.dropped == {"flat": 7.0}
    assert m.family_.n_cols == 3 and m.n_features_in_ == 4
    np.testing.assert_array_equal(
        m.predict(df), MAPDP(random_state=0).fit(df[["a", "b", "c"]]).labels_
    )
    with pytest.raises(ValueError, match="column 'flat' is constant"):
        MAPDP(strict=True).fit(df)


def test_wide_table_gets_diagonal_covariance() -> None:
    """More columns than rows: "auto" makes them diag-gaussian, says so, and separates them."""
    rng = np.random.default_rng(9)
    y = np.repeat(np.arange(3), 30)
    X = rng.normal(0.0, 3.0, (3, 120))[y] + rng.normal(size=(90, 120))
    m = MAPDP(random_state=0).fit(X)
    assert set(m.schema_.kinds.values()) == {"diag-gaussian"}
    assert "diagonal covariance" in m.schema_.notes[0]
    assert nmi(y, m.labels_) == pytest.approx(1.0)


def test_degenerate_fit_warns() -> None:
    X = np.random.default_rng(10).normal(size=(60, 2))
    with pytest.warns(DegenerateFitWarning, match="one cluster holds all 60 records"):
        MAPDP(random_state=0).fit(X)


# -- small real tables -----------------------------------------------------------------------------


def _real(name: str) -> tuple[pd.DataFrame, np.ndarray]:
    df = pd.read_csv(REAL / f"clust_{name}.csv")
    y = df["label"].astype(str).to_numpy()
    return df.drop(columns=[c for c in df.columns if c.startswith("label")]), y


def _kmeans_nmi(X: pd.DataFrame, y: np.ndarray) -> float:
    Z = pd.get_dummies(X.fillna(X.mode().iloc[0]), dtype=float).to_numpy()
    Z = (Z - Z.mean(axis=0)) / np.where(Z.std(axis=0) > 0, Z.std(axis=0), 1.0)
    k = len(np.unique(y))
    return float(nmi(y, KMeans(k, n_init=10, random_state=0).fit_predict(Z)))


@pytest.mark.parametrize("name", ["dna_splice", "glass", "tissue_gene_expression"])
def test_real_tables_defaults_at_least_kmeans_told_k(name: str) -> None:
    """With its defaults MAPDP is at or above KMeans told the true number of classes (on the
    standardised one-hot columns), and is neither one cluster nor over-segmented."""
    X, y = _real(name)
    m = MAPDP(random_state=0).fit(X)
    assert 2 <= m.n_clusters_ <= len(X) / 10
    assert nmi(y, m.labels_) >= _kmeans_nmi(X, y) - 0.01
