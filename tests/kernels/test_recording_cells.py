"""Sheppard's correction for Gaussian columns recorded on a grid (``recording_step``; eq. B.1' of
``kernels.obs.gaussian_nw``, and ``kernels.obs.normal_gamma``): each record counts with its
cell's variance step^2 / 12.

References: the chain rule of predictives, the uncorrected kernels on statistics with the cells
added by hand, SciPy's Student-t, and the bound a cell puts on a density."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from kernels.obs import gaussian_nw
from kernels.obs import product as kproduct
from pipeline.families import GaussianNW, NormalGamma
from pipeline.families.gaussian import recording_step

RTOL_CHAIN = 1e-9  # log marginal vs the chain rule of predictives
RTOL_REF = 1e-10  # against the uncorrected kernels on corrected statistics / SciPy


def _integer_data(n: int = 15, d: int = 3, seed: int = 0) -> np.ndarray:
    return np.round(np.random.default_rng(seed).normal(size=(n, d)) * 2.0)


def test_recording_step_finds_the_grid() -> None:
    X = np.column_stack(
        [
            [1.0, 2.0, -7.0, 12.0],  # integers
            [0.1, 0.3, 1.7, 2.2],  # one decimal (0.1 * 3 is not 0.3 in floating point)
            [0.25, 0.5, 1.75, 0.05],  # two decimals
            [math.pi, 1.0, 2.0, 3.0],  # continuous
            [np.nan, 1.0, 2.0, 3.0],  # missing values are not evidence
        ]
    )
    np.testing.assert_allclose(recording_step(X), [1.0, 0.1, 0.01, 0.0, 1.0])


def test_recording_step_reads_past_its_first_values() -> None:
    """The first values (``_GRID_PROBE``) only rule grids out: a column on the integer grid up
    to them and off it later is on the 0.5 grid (0.1 is the answer), one all-missing at first
    is judged by the rest, and one with no finite value has no grid."""
    n = 600
    x = np.arange(n, dtype=np.float64) % 10.0
    late = x.copy()
    late[-1] += 0.5
    holes = x.copy()
    holes[:300] = np.nan
    X = np.column_stack([x, late, holes, np.full(n, np.nan)])
    np.testing.assert_allclose(recording_step(X), [1.0, 0.1, 1.0, 0.0])


def test_a_grid_fine_against_the_spread_counts_as_continuous() -> None:
    """Six decimals on a spread of about 1 (the demo's records, many CSV exports): step 0; the
    same decimals on a spread of 1e-4 are a grid."""
    z = np.random.default_rng(0).normal(size=(500, 1))
    np.testing.assert_array_equal(recording_step(np.round(z, 6)), [0.0])
    np.testing.assert_allclose(recording_step(np.round(1e-4 * z, 6)), [1e-6])


@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
def test_empirical_bayes_sets_the_step_only_for_grids(family: type) -> None:
    X = _integer_data()
    assert np.all(family.empirical_bayes(X).step == 1.0)
    cont = X + np.random.default_rng(1).uniform(-0.5, 0.5, X.shape)
    assert family.empirical_bayes(cont).step is None


@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), step=st.sampled_from([1.0, 0.1, 0.01]))
def test_chain_rule_with_cells(family: type, seed: int, step: float) -> None:
    """log p(x_1..x_n) = sum_i log p(x_i | x_<i) with the cells counted."""
    X = _integer_data(seed=seed) * step
    fam = family.empirical_bayes(X)
    np.testing.assert_allclose(fam.step, step)
    chain = sum(fam.log_predictive(X[i], X[:i]) for i in range(X.shape[0]))
    assert fam.log_marginal(X) == pytest.approx(chain, rel=RTOL_CHAIN)


def test_nw_marginal_is_b1_with_the_cells_in_the_scatter() -> None:
    """B.1': the corrected marginal equals B.1's on statistics whose scatter holds n H."""
    X = _integer_data(n=20, d=4)
    fam = GaussianNW.empirical_bayes(X)
    plain = GaussianNW(m0=fam.m0, c0=fam.c0, B0=fam.B0, a0=fam.a0)
    d, n = 4, X.shape[0]
    s = np.zeros(1 + d + d * d)
    for x in X:
        gaussian_nw.add_stats(x, s, 1.0)
    s_cells = s.copy()
    s_cells[1 + d :] += (n * np.eye(d) / 12.0).ravel()
    got = gaussian_nw.log_marginal(s, fam.prior_array())
    ref = gaussian_nw.log_marginal(s_cells, plain.prior_array())
    assert got == pytest.approx(ref, rel=RTOL_REF)


def test_normal_gamma_predictive_is_a_scaled_student_t() -> None:
    """Per column, log p(x | X) = log t_{2 a_n}(x; m_n, b' (c_n + 1) / (a_n c_n))
    + a_n log(b_n / b') with b' = b_n + h / 2 (``kernels.obs.normal_gamma``)."""
    X = _integer_data(n=12, d=2)
    fam = NormalGamma.empirical_bayes(X)
    x = np.array([1.0, -2.0])
    mn, cn, an, bn = fam.posterior(fam.as_product().stats_of(X, np.zeros(12, np.int64), 1)[0])
    b1 = bn + 0.5 / 12.0
    ref = stats.t.logpdf(x, df=2 * an, loc=mn, scale=np.sqrt(b1 * (cn + 1) / (an * cn)))
    ref = float(np.sum(ref + an * np.log(bn / b1)))
    assert fam.log_predictive(x, X) == pytest.approx(ref, rel=RTOL_REF)


@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
def test_no_step_is_the_uncorrected_family_exactly(family: type) -> None:
    X = _integer_data()
    fam = family.empirical_bayes(X)
    zero = family(**{**_fields(fam), "step": 0.0})
    none = family(**{**_fields(fam), "step": None})
    x = X[0] + 0.5
    assert zero.log_predictive(x, X) == none.log_predictive(x, X)
    assert zero.log_marginal(X) == none.log_marginal(X)


def _fields(fam: GaussianNW | NormalGamma) -> dict[str, object]:
    if isinstance(fam, GaussianNW):
        return {"m0": fam.m0, "c0": fam.c0, "B0": fam.B0, "a0": fam.a0}
    return {"m0": fam.m0, "c0": fam.c0, "a0": fam.a0, "b0": fam.b0}


@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
def test_a_cell_bounds_the_density_of_repeated_values(family: type) -> None:
    """Without cells the density of a value every member shares grows like sqrt(n) per column;
    with them it stays below the peak of N(0, 1/12), -log(2 pi / 12) / 2 per column."""
    d = 3
    X = _integer_data(n=40, d=d)
    fam = family.empirical_bayes(X)
    plain = family(**_fields(fam))
    same = np.tile(X[0], (5000, 1))
    bound = -0.5 * d * math.log(2.0 * math.pi / 12.0)
    assert fam.log_predictive(X[0], same) < bound
    assert plain.log_predictive(X[0], same) > bound + d


@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
def test_sweep_updates_and_leave_one_out_match_a_refresh(family: type) -> None:
    """With cells the update is not rank one: ``update`` rebuilds the cache; the leave-one-out
    predictive (the Normal-Wishart's closed form on G_k, the Normal-Gamma's downdated copy) must
    equal the predictive given the other records, and the cache one built from scratch."""
    X = _integer_data(n=30, d=4)
    prod = family.empirical_bayes(X).as_product()
    prior = prod.prior
    # a Normal-Wishart prior with cells never gets the int32 kernels, which leave its cells out,
    # but its own with them (int16); the Normal-Gamma's kernels read its cells from its prior
    own = kproduct.NW_CELLS_DTYPE if family is GaussianNW else kproduct.GAUSSIAN_DTYPE
    assert prod.spec.dtype == own
    z = np.zeros(30, dtype=np.int64)
    for spec in (prod.spec, prod.spec.astype(kproduct.ANY_DTYPE)):
        stats_ = prod.stats_of(X, z, 1)
        cache = prod.cache_of(stats_)
        s, c = stats_[0].copy(), cache[0].copy()
        for x in X[:5]:
            kproduct.update(x, s, c, spec, prior, -1.0)
        ref_s = prod.stats_of(X[5:], z[5:], 1)
        np.testing.assert_allclose(s, ref_s[0], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(c, prod.cache_of(ref_s)[0], rtol=1e-9, atol=1e-9)
        scratch_s, scratch_c = np.empty_like(s), np.empty_like(c)
        x = X[7]
        loo = kproduct.log_predictive_loo(x, s, c, spec, prior, scratch_s, scratch_c)
        rest = np.delete(X[5:], 2, axis=0)
        assert loo == pytest.approx(prod.groups[0][0].log_predictive(x, rest), rel=RTOL_REF)
        if family is GaussianNW:
            # the O(d^2) closed form on G_k = T_k - H, not the fallback
            closed = gaussian_nw.log_predictive_loo(x, s, c, prior, True)
            assert closed == pytest.approx(loo, rel=RTOL_REF)


def test_mapdp_on_integer_pixels_finds_the_digits() -> None:
    """The defaults on scikit-learn's digits (integer pixels 0-16): NMI 0.33 without the cells
    (clusters of which pixels are exactly 0), 0.77 with them, above BayesianGaussianMixture's
    0.74 (issue 14's table); asserted with a margin."""
    from sklearn.datasets import load_digits
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from pipeline import MAPDP

    X, y = load_digits(return_X_y=True)
    X = X[:, X.std(axis=0) > 0]
    m = MAPDP(random_state=0).fit(pd.DataFrame(X, columns=[f"p{j}" for j in range(X.shape[1])]))
    assert np.all(m.family_.groups[0][0].step == 1.0)
    assert nmi(y, m.labels_) > 0.72


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (-1.0, "step must be finite and >= 0"),
        (np.nan, "step must be finite"),
        ([1.0, 1.0], "3 entries"),
    ],
)
@pytest.mark.parametrize("family", [GaussianNW, NormalGamma])
def test_a_bad_step_is_refused(family: type, step: object, message: str) -> None:
    fam = family.empirical_bayes(_integer_data())
    with pytest.raises(ValueError, match=message):
        family(**{**_fields(fam), "step": step})
