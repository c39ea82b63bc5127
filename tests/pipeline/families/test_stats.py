"""``pipeline.families.stats.Stats``, the one currency: additive statistics that refuse to add
across
families, column groups or priors; sizes and moments from the statistics alone; independent of
chunking and order (Hypothesis)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import persist
from pipeline.families import GaussianNW, Poisson, ProductFamily
from pipeline.families.stats import Stats


def data(n: int = 60, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.normal(size=(n, 2)), rng.poisson(3.0, size=n)]).astype(float)


def family(X: np.ndarray, cols=((0, 1), (2,))) -> ProductFamily:
    g, p = cols
    return ProductFamily(
        [
            (GaussianNW.empirical_bayes(X[:, list(g)]), list(g)),
            (Poisson.empirical_bayes(X[:, list(p)]), list(p)),
        ]
    )


def test_statistics_add_and_subtract_within_one_family():
    X = data()
    fam = family(X)
    Xa = fam.arrange(X)
    z = np.arange(60) % 3
    a = Stats.of(fam, Xa[:30], z[:30], 3)
    b = Stats.of(fam, Xa[30:], z[30:], 3)
    whole = Stats.of(fam, Xa, z, 3)
    np.testing.assert_allclose((a + b).array, whole.array)
    np.testing.assert_allclose((whole - b).array, a.array, atol=1e-9)
    np.testing.assert_array_equal(whole.n, np.bincount(z))
    assert whole.total().n[0] == 60


def test_statistics_of_another_family_column_group_or_prior_refuse_to_add():
    X = data()
    fam = family(X)
    s = Stats.zeros(fam, 2)
    other_prior = ProductFamily(
        [
            (GaussianNW.empirical_bayes(2.0 * X[:, :2]), [0, 1]),
            (Poisson.empirical_bayes(X[:, 2:]), [2]),
        ]
    )
    swapped = ProductFamily(
        [(GaussianNW.empirical_bayes(X[:, :2]), [1, 2]), (Poisson.empirical_bayes(X[:, 2:]), [0])]
    )
    for other in (other_prior, swapped):
        with pytest.raises(ValueError, match="do not add"):
            s + Stats.zeros(other, 2)
    with pytest.raises(ValueError, match="shapes"):
        s + Stats.zeros(fam, 3)
    with pytest.raises(TypeError):
        s + np.zeros((2, fam.n_stats))  # type: ignore[operator]
    with pytest.raises(ValueError, match="do not add"):
        Stats.concat([s, Stats.zeros(other_prior, 1)])


def test_moments_are_the_records_own():
    X = data(200, seed=1)
    fam = family(X)
    Xa = fam.arrange(X)
    z = (Xa[:, 0] > 0).astype(np.int64)
    mean, cov = Stats.of(fam, Xa, z, 2).moments(fam)
    for k in (0, 1):
        Xk = Xa[z == k]
        np.testing.assert_allclose(mean[k], Xk.mean(axis=0), rtol=1e-10, atol=1e-12)
        # the Gaussian block: the records' covariance (divided by n)
        np.testing.assert_allclose(cov[k][:2, :2], np.cov(Xk[:, :2].T, bias=True), atol=1e-10)
        # a count's variance and the covariances across groups are not in the statistics
        assert np.isnan(cov[k][2, 2]) and np.isnan(cov[k][0, 2])
    with pytest.raises(ValueError, match="not of"):
        Stats.of(fam, Xa, z, 2).moments(family(2.0 * X))


def test_merged_adds_rows_by_mapping():
    X = data()
    fam = family(X)
    Xa = fam.arrange(X)
    z = np.arange(60) % 4
    s = Stats.of(fam, Xa, z, 4)
    merged = s.merged(np.array([0, 1, 0, 1]))
    np.testing.assert_allclose(merged.array, Stats.of(fam, Xa, z % 2, 2).array)


def test_statistics_round_trip_on_disk(tmp_path):
    X = data()
    fam = family(X)
    s = Stats.of(fam, fam.arrange(X), np.arange(60) % 2, 2)
    persist.save(tmp_path, "s", s)
    back = persist.load(tmp_path, "s", Stats)
    assert back == s


@settings(max_examples=40, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=59), max_size=5),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_statistics_do_not_depend_on_chunking_or_order(cuts, seed):
    X = data(60, seed=seed % 7)
    fam = family(X)
    Xa = fam.arrange(X)
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 3, size=60)
    whole = Stats.of(fam, Xa, z, 3)
    bounds = [0, *sorted(set(cuts)), 60]
    parts = [Stats.of(fam, Xa[a:b], z[a:b], 3) for a, b in itertools.pairwise(bounds)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    np.testing.assert_allclose(total.array, whole.array, rtol=1e-10, atol=1e-8)
    perm = rng.permutation(60)
    np.testing.assert_allclose(
        Stats.of(fam, Xa[perm], z[perm], 3).array, whole.array, rtol=1e-10, atol=1e-8
    )
