"""Contract tests for the likelihood families (Raykov et al. 2016, Appendix B).

``FamilyContract`` holds the tests every family must pass; one subclass per family supplies the
family, data, an independent reference for the marginal and the predictive (numerical
integration / scipy densities), and the bad inputs ``check_values`` must reject.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from kernels.obs import product
from pipeline.families import (
    FAMILIES,
    Bernoulli,
    Binomial,
    Categorical,
    Exponential,
    Family,
    GaussianNW,
    Geometric,
    NormalGamma,
    Poisson,
    ProductFamily,
)
from pipeline.families.counts import DISCRETE_SHARE

RTOL_QUAD = 1e-6  # log marginal vs numerical integration
RTOL_CHAIN = 1e-9  # log marginal vs the chain rule of predictives
RTOL_SCIPY = 1e-9  # log predictive vs scipy


# -- independent references ---------------------------------------------------------------------


def quad_log(logf: Callable[[float], float], lo: float, hi: float, mode: float) -> float:
    """log of the integral of exp(logf) over (lo, hi), the integrand scaled by its value at the
    mode so it neither overflows nor underflows."""
    shift = logf(mode)
    val, _err = integrate.quad(
        lambda t: math.exp(logf(t) - shift),
        lo,
        hi,
        points=[mode],
        epsabs=0.0,
        epsrel=1e-11,
        limit=500,
    )
    return math.log(val) + shift


def gamma_window(shape: float, rate: float) -> tuple[float, float, float]:
    """(lo, hi, mode) covering a Gamma(shape, rate) density."""
    mean, sd = shape / rate, math.sqrt(shape) / rate
    mode = (shape - 1.0) / rate if shape > 1.0 else 0.5 * mean
    return 0.0, mean + 60.0 * sd, mode


def beta_mode(a: float, b: float) -> float:
    return (a - 1.0) / (a + b - 2.0) if a > 1.0 and b > 1.0 else a / (a + b)


def normal_gamma_quad(x: np.ndarray, m0: float, c0: float, a0: float, b0: float) -> float:
    """log p(x) for one column under tau ~ Gamma(a0, rate b0), mu | tau ~ N(m0, 1 / (c0 tau)):
    mu integrated out in closed form (x is jointly normal with covariance (I + 11^T / c0) / tau),
    tau by quadrature."""
    n = x.shape[0]
    C = np.eye(n) + np.ones((n, n)) / c0
    mean = np.full(n, m0)

    def logf(tau: float) -> float:
        return float(
            stats.multivariate_normal.logpdf(x, mean=mean, cov=C / tau)
            + stats.gamma.logpdf(tau, a0, scale=1.0 / b0)
        )

    xbar = x.mean()
    S = ((x - xbar) ** 2).sum()
    bn = b0 + 0.5 * (S + c0 * n / (c0 + n) * (xbar - m0) ** 2)
    lo, hi, mode = gamma_window(a0 + 0.5 * n, bn)
    return quad_log(logf, lo, hi, mode)


def nw_posterior(fam: GaussianNW, X: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
    """(m, c, B, a) of eq. B.1, computed directly from the records."""
    m0 = np.asarray(fam.m0)
    B0 = np.asarray(fam.B0)
    n = X.shape[0]
    if n == 0:
        return m0, fam.c0, B0, fam.a0
    xbar = X.mean(axis=0)
    S = (X - xbar).T @ (X - xbar)
    Binv = np.linalg.inv(B0) + S + fam.c0 * n / (fam.c0 + n) * np.outer(xbar - m0, xbar - m0)
    m = (fam.c0 * m0 + n * xbar) / (fam.c0 + n)
    return m, fam.c0 + n, np.linalg.inv(Binv), fam.a0 + n


def nw_predictive_scipy(fam: GaussianNW, x: np.ndarray, X: np.ndarray) -> float:
    """Appendix B: Student-t with nu = a - d + 1, mu = m, Lambda = c nu / (c + 1) B."""
    m, c, B, a = nw_posterior(fam, X)
    d = m.shape[0]
    nu = a - d + 1.0
    Lam = c * nu / (c + 1.0) * B
    return float(stats.multivariate_t(loc=m, shape=np.linalg.inv(Lam), df=nu).logpdf(x))


# -- the contract -------------------------------------------------------------------------------


class FamilyContract:
    """Tests every family passes. Subclasses implement the hooks below."""

    n_data = 30
    n_quad = 8
    # which moments the family's statistics determine: "full" (mean, covariance), "diag" (mean,
    # variances) or "mean"
    moments_known = "diag"

    # hooks -------------------------------------------------------------------------------------
    def make_family(self) -> Family:
        raise NotImplementedError

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def reference_log_marginal(self, fam: Any, X: np.ndarray) -> float:
        raise NotImplementedError

    def reference_log_predictive(self, fam: Any, x: np.ndarray, X: np.ndarray) -> float:
        raise NotImplementedError

    def bad_values(self) -> list[tuple[float, str]]:
        """(value outside the support, fragment of the error message)."""
        return []

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        """(constructor call that must fail, the parameter name the message must give)."""
        return []

    def check_empirical_bayes(self, fam: Any, X: np.ndarray) -> None:
        """Family-specific assertions about the documented empirical-Bayes rule."""

    # helpers -----------------------------------------------------------------------------------
    def names(self, fam: Family) -> list[str]:
        return [f"col{j}" for j in range(fam.n_cols)]

    def data(self, seed: int, n: int) -> np.ndarray:
        return np.asarray(self.make_data(np.random.default_rng(seed), n), dtype=np.float64)

    # tests -------------------------------------------------------------------------------------
    def test_moments_are_the_records_own_where_determined(self) -> None:
        """``product.moments`` of one statistics row: the records' mean and (biased) covariance
        where the family's statistics determine them, NaN everywhere else."""
        fam = self.make_family()
        X = self.data(31, 50)
        pf = fam.as_product()
        D = X.shape[1]
        s = pf.stats_of(X, np.zeros(len(X), dtype=np.int64), 1)[0]
        mean, cov = product.moments(s, pf.spec, pf.prior, D)
        np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-10)
        want = np.cov(X, rowvar=False, bias=True).reshape(D, D)
        known = {
            "full": np.ones((D, D), dtype=bool),
            "diag": np.eye(D, dtype=bool),
            "mean": np.zeros((D, D), dtype=bool),
        }[self.moments_known]
        np.testing.assert_allclose(cov[known], want[known], rtol=1e-9, atol=1e-12)
        assert np.isnan(cov[~known]).all()
        # no records: nothing is determined
        mean0, cov0 = product.moments(np.zeros_like(s), pf.spec, pf.prior, D)
        assert np.isnan(mean0).all() and np.isnan(cov0).all()

    def test_log_marginal_matches_independent_computation(self) -> None:
        fam = self.make_family()
        X = self.data(1, self.n_quad)
        got = fam.log_marginal(X)
        want = self.reference_log_marginal(fam, X)
        assert got == pytest.approx(want, rel=RTOL_QUAD)
        assert fam.log_marginal(X[:0]) == 0.0

    def test_chain_rule(self) -> None:
        """log p(X) = sum_i log p(x_i | x_1..x_{i-1}), through the kernels' incremental update
        and through the public one-shot predictive."""
        fam = self.make_family()
        pf = fam.as_product()
        X = self.data(2, self.n_data)
        Xa = pf.arrange(X)
        s = pf.empty_stats()[0]
        c = pf.empty_cache()
        total = 0.0
        for x in Xa:
            total += product.log_predictive(x, s, c, pf.spec, pf.prior)
            product.update(x, s, c, pf.spec, pf.prior, 1.0)
        lm = fam.log_marginal(X)
        assert total == pytest.approx(lm, rel=RTOL_CHAIN)
        assert pf.log_marginal_stats(s) == pytest.approx(lm, rel=RTOL_CHAIN)
        public = sum(fam.log_predictive(X[i], X[:i]) for i in range(X.shape[0]))
        assert public == pytest.approx(lm, rel=RTOL_CHAIN)

    def test_predictive_matches_scipy(self) -> None:
        fam = self.make_family()
        X = self.data(3, self.n_data)
        for n in (0, 1, self.n_data):
            for x in self.data(4, 5):
                got = fam.log_predictive(x, X[:n])
                want = self.reference_log_predictive(fam, x, X[:n])
                assert got == pytest.approx(want, rel=RTOL_SCIPY, abs=1e-12)

    def test_leave_one_out_predictive(self) -> None:
        """``product.log_predictive_loo`` of a member equals the predictive given the others,
        and leaves the cluster's statistics and cache untouched."""
        fam = self.make_family()
        pf = fam.as_product()
        Xa = pf.arrange(self.data(14, 12))
        s = pf.stats_of(Xa)[0]
        c = pf.cache_of(s)[0]
        s0, c0 = s.copy(), c.copy()
        scratch_s, scratch_c = np.empty(pf.n_stats), np.empty(pf.n_cache)
        for i in (0, 5, 11):
            got = product.log_predictive_loo(Xa[i], s, c, pf.spec, pf.prior, scratch_s, scratch_c)
            want = pf.log_predictive(Xa[i], np.delete(Xa, i, axis=0))
            assert got == pytest.approx(want, rel=1e-9)
        np.testing.assert_array_equal(s, s0)
        np.testing.assert_array_equal(c, c0)

    def test_update_matches_refresh(self) -> None:
        """Many kernel ``update`` calls (w = +1 / -1) leave the cache equal to ``refresh`` of the
        same statistics (for GaussianNW: the rank-one Cholesky update and downdate)."""
        fam = self.make_family()
        pf = fam.as_product()
        Xa = pf.arrange(self.data(5, 60))
        rng = np.random.default_rng(6)
        s = pf.empty_stats()[0]
        c = pf.empty_cache()
        inside: list[int] = []
        for _step in range(400):
            if len(inside) < 3 or (rng.random() < 0.55 and len(inside) < Xa.shape[0]):
                i = int(rng.choice(np.setdiff1d(np.arange(Xa.shape[0]), inside)))
                product.update(Xa[i], s, c, pf.spec, pf.prior, 1.0)
                inside.append(i)
            else:
                i = inside.pop(int(rng.integers(len(inside))))
                product.update(Xa[i], s, c, pf.spec, pf.prior, -1.0)
        want_s = pf.stats_of(Xa[inside])[0]
        np.testing.assert_allclose(s, want_s, rtol=1e-10, atol=1e-8)
        np.testing.assert_allclose(c, pf.cache_of(s)[0], rtol=1e-8, atol=1e-8)

    def test_add_then_remove_restores_statistics(self) -> None:
        fam = self.make_family()
        pf = fam.as_product()
        X = pf.arrange(self.data(7, 20))
        extra = pf.arrange(self.data(8, 10))
        s = pf.stats_of(X)[0]
        c = pf.cache_of(s)[0]
        s0, c0 = s.copy(), c.copy()
        for x in extra:
            product.update(x, s, c, pf.spec, pf.prior, 1.0)
        np.testing.assert_allclose(s, pf.stats_of(np.vstack([X, extra]))[0], rtol=1e-12)
        for x in extra[::-1]:
            product.update(x, s, c, pf.spec, pf.prior, -1.0)
        np.testing.assert_allclose(s, s0, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(c, c0, rtol=1e-8, atol=1e-10)
        # and through add_stats alone
        for x in extra:
            product.add_stats(x, s, pf.spec, 1.0)
        for x in extra:
            product.add_stats(x, s, pf.spec, -1.0)
        np.testing.assert_allclose(s, s0, rtol=1e-10, atol=1e-10)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.differing_executors],
    )
    @given(data=st.data())
    def test_stats_independent_of_order_and_chunking(self, data: st.DataObject) -> None:
        fam = self.make_family()
        pf = fam.as_product()
        n = data.draw(st.integers(0, 25), label="n")
        X = pf.arrange(self.data(data.draw(st.integers(0, 2**32 - 1), label="seed"), n))
        perm = data.draw(st.permutations(range(n)), label="perm")
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4), label="cuts"))
        whole = pf.stats_of(X)[0]
        chunked = sum(
            (pf.stats_of(chunk)[0] for chunk in np.split(X[list(perm)], cuts)),
            pf.empty_stats()[0],
        )
        np.testing.assert_allclose(chunked, whole, rtol=1e-12, atol=1e-9)
        K = data.draw(st.integers(1, 4), label="K")
        z = np.asarray(data.draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n)))
        by_cluster = pf.stats_of(X, z.astype(np.int64), K)
        np.testing.assert_allclose(by_cluster.sum(axis=0), whole, rtol=1e-12, atol=1e-9)
        assert by_cluster[:, 0].sum() == n

    def test_check_values_names_column_and_row(self) -> None:
        fam = self.make_family()
        names = self.names(fam)
        X = self.data(9, 20)
        fam.check_values(X, names)  # good data passes
        cases = self.bad_values()
        assert cases, "every family states values outside its support"
        col = fam.n_cols - 1
        for value, fragment in cases:
            Xb = X.copy()
            Xb[13, col] = value
            Xb[17, 0] = value  # a later bad row is not the one reported
            with pytest.raises(ValueError) as info:
                fam.check_values(Xb, names)
            msg = str(info.value)
            assert f"column '{names[col]}': row 13 has " in msg
            assert fragment in msg

    def test_bad_parameters_are_named(self) -> None:
        for make, param in self.bad_params():
            with pytest.raises(ValueError, match=param):
                make()

    def test_empirical_bayes(self) -> None:
        proto = self.make_family()
        X = self.data(10, 200)
        fam = type(proto).empirical_bayes(X)
        assert type(fam) is type(proto)
        assert fam.n_cols == proto.n_cols
        assert np.all(np.isfinite(fam.prior_array()))
        fam.check_values(X, self.names(fam))
        assert math.isfinite(fam.log_marginal(X))
        lp = fam.log_predictive(X[0], X)
        assert math.isfinite(lp)
        self.check_empirical_bayes(fam, X)

    def test_posterior_summary(self) -> None:
        fam = self.make_family()
        pf = fam.as_product()
        names = self.names(fam)
        s = pf.stats_of(pf.arrange(self.data(11, 50)))[0]
        summary = fam.posterior_summary(s, names)
        assert summary
        for key, value in summary.items():
            assert key.split(":")[0] in names
            assert math.isfinite(value)

    def test_layout_sizes(self) -> None:
        fam = self.make_family()
        pf = fam.as_product()
        assert pf.n_stats == fam.stat_size()
        assert pf.n_cache == fam.cache_size()
        assert pf.empty_cache().shape == (fam.cache_size(),)
        assert FAMILIES[fam.name] is type(fam)


# -- one subclass per family --------------------------------------------------------------------


class TestGaussianNW(FamilyContract):
    moments_known = "full"

    def bad_values(self) -> list[tuple[float, str]]:
        return [(np.nan, "must be finite"), (np.inf, "must be finite")]

    def make_family(self) -> GaussianNW:
        B0 = np.array([[0.5, 0.1, 0.0], [0.1, 0.4, 0.05], [0.0, 0.05, 0.3]])
        return GaussianNW(m0=np.array([0.5, -1.0, 2.0]), c0=0.7, B0=B0, a0=4.5)

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        cov = np.array([[1.0, 0.4, 0.1], [0.4, 2.0, -0.3], [0.1, -0.3, 0.5]])
        return rng.multivariate_normal([1.0, -0.5, 2.5], cov, size=n)

    def reference_log_marginal(self, fam: GaussianNW, X: np.ndarray) -> float:
        # chain rule with scipy's multivariate t and the posterior of eq. B.1 built from the
        # records (S about the mean), independent of the kernel's raw-moment arithmetic
        return sum(nw_predictive_scipy(fam, X[i], X[:i]) for i in range(X.shape[0]))

    def reference_log_predictive(self, fam: GaussianNW, x: np.ndarray, X: np.ndarray) -> float:
        return nw_predictive_scipy(fam, x, X)

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [
            (lambda: GaussianNW(m0=[0.0, 0.0], c0=-1.0, B0=np.eye(2), a0=3.0), "c0"),
            (lambda: GaussianNW(m0=[0.0, 0.0], c0=1.0, B0=np.eye(2), a0=0.5), "a0"),
            (lambda: GaussianNW(m0=[0.0, 0.0], c0=1.0, B0=-np.eye(2), a0=3.0), "B0"),
        ]

    def test_one_dimensional_marginal_by_quadrature(self) -> None:
        """d = 1: the Wishart(B0, a0) precision is Gamma(a0 / 2, rate 1 / (2 B0))."""
        fam = GaussianNW(m0=[0.3], c0=0.8, B0=[[0.6]], a0=2.5)
        x = self.data(12, self.n_quad)[:, 1]
        want = normal_gamma_quad(x, 0.3, 0.8, 1.25, 1.0 / (2.0 * 0.6))
        assert fam.log_marginal(x[:, None]) == pytest.approx(want, rel=RTOL_QUAD)

    @settings(max_examples=40, deadline=None)
    @given(
        d=st.integers(1, 6),
        n=st.integers(1, 12),
        seed=st.integers(0, 2**31 - 1),
    )
    def test_joining_and_leaving_keep_the_factor_and_its_inverse(
        self, d: int, n: int, seed: int
    ) -> None:
        """``update``'s O(d^2) change of L and U = L^{-1} together (the closed-form Cholesky
        factor of I +- w w^T), adding n records and then removing them in another order,
        against ``refresh`` of the same statistics after every step."""
        rng = np.random.default_rng(seed)
        A = rng.normal(size=(d, d))
        fam = GaussianNW(m0=rng.normal(size=d), c0=0.5, B0=A @ A.T + d * np.eye(d), a0=d + 1.5)
        pf = fam.as_product()
        X = rng.normal(size=(n, d)) * rng.uniform(0.5, 5.0)
        s, c = pf.empty_stats()[0], pf.empty_cache().copy()
        steps = [(i, 1.0) for i in range(n)] + [(int(i), -1.0) for i in rng.permutation(n)]
        for i, w in steps:
            product.update(X[i], s, c, pf.spec, pf.prior, w)
            want = pf.cache_of(s)[0]
            np.testing.assert_allclose(c, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())
        np.testing.assert_allclose(s, 0.0, atol=1e-9 * np.abs(X).max() ** 2)

    def test_a_removal_that_rounding_would_spoil_rebuilds_the_cache(self) -> None:
        """Removing one of two distant records under a very weak prior leaves |T'| / |T| (beta_d
        of the closed form) at 1.6e-12: the factors' update would lose most of U's digits,
        so ``update`` rebuilds the cache from the statistics instead."""
        fam = GaussianNW(m0=np.zeros(2), c0=1e-6, B0=np.eye(2) * 1e6, a0=3.5)
        pf = fam.as_product()
        X = np.array([[0.0, 0.0], [1000.0, -500.0]])
        s = pf.stats_of(X)[0]
        c = pf.cache_of(s)[0]
        product.update(X[1], s, c, pf.spec, pf.prior, -1.0)
        np.testing.assert_array_equal(s, pf.stats_of(X[:1])[0])
        np.testing.assert_array_equal(c, pf.cache_of(s)[0])


class TestNormalGamma(FamilyContract):
    def make_family(self) -> NormalGamma:
        return NormalGamma(m0=[0.0, 5.0], c0=[0.5, 2.0], a0=[1.5, 3.0], b0=[2.0, 0.5])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([rng.normal(1.0, 2.0, n), rng.normal(4.0, 0.5, n)])

    def reference_log_marginal(self, fam: NormalGamma, X: np.ndarray) -> float:
        m0, c0, a0, b0 = (np.asarray(v) for v in (fam.m0, fam.c0, fam.a0, fam.b0))
        return sum(
            normal_gamma_quad(X[:, j], m0[j], c0[j], a0[j], b0[j]) for j in range(X.shape[1])
        )

    def reference_log_predictive(self, fam: NormalGamma, x: np.ndarray, X: np.ndarray) -> float:
        out = 0.0
        n = X.shape[0]
        for j in range(fam.n_cols):
            m0, c0, a0, b0 = (float(np.asarray(v)[j]) for v in (fam.m0, fam.c0, fam.a0, fam.b0))
            xbar = X[:, j].mean() if n else 0.0
            S = ((X[:, j] - xbar) ** 2).sum()
            cn, an = c0 + n, a0 + 0.5 * n
            mn = (c0 * m0 + n * xbar) / cn
            bn = b0 + 0.5 * (S + c0 * n / cn * (xbar - m0) ** 2)
            scale = math.sqrt(bn * (cn + 1.0) / (an * cn))
            out += stats.t.logpdf(x[j], df=2.0 * an, loc=mn, scale=scale)
        return out

    def bad_values(self) -> list[tuple[float, str]]:
        return [(np.nan, "must be finite"), (np.inf, "must be finite")]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [
            (lambda: NormalGamma(0.0, 0.0, 1.0, 1.0), "c0"),
            (lambda: NormalGamma(0.0, 1.0, -1.0, 1.0), "a0"),
            (lambda: NormalGamma(0.0, 1.0, 1.0, [1.0, 0.0]), "b0"),
            (lambda: NormalGamma([0.0, 1.0], 1.0, [1.0, 1.0, 1.0], 1.0), "a0"),
            (lambda: NormalGamma(np.nan, 1.0, 1.0, 1.0), "m0"),
            (lambda: NormalGamma(0.0, 1.0, 1.0, 1.0, n_cols=-1), "n_cols"),
        ]

    def check_empirical_bayes(self, fam: NormalGamma, X: np.ndarray) -> None:
        np.testing.assert_allclose(fam.m0, X.mean(axis=0))
        np.testing.assert_allclose(np.asarray(fam.b0) / np.asarray(fam.a0), X.var(axis=0))
        np.testing.assert_allclose(fam.c0, 1.0)

    def test_scalar_parameters_broadcast(self) -> None:
        fam = NormalGamma(0.0, 1.0, 2.0, 3.0, n_cols=3)
        assert fam.n_cols == 3
        np.testing.assert_array_equal(fam.b0, [3.0, 3.0, 3.0])
        assert NormalGamma(0.0, 1.0, 2.0, [1.0, 2.0]).n_cols == 2


class TestCategorical(FamilyContract):
    probs = np.array([0.5, 0.3, 0.15, 0.05])

    def make_family(self) -> Categorical:
        return Categorical(alpha=[0.5, 1.0, 2.0, 0.25])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(4, size=(n, 1), p=self.probs).astype(np.float64)

    def reference_log_marginal(self, fam: Categorical, X: np.ndarray) -> float:
        alpha = np.asarray(fam.alpha)
        counts = np.bincount(X[:, 0].astype(int), minlength=alpha.shape[0])
        n = X.shape[0]
        # scipy's pmf is of the counts; the sequence drops the multinomial coefficient
        coef = special.gammaln(n + 1) - special.gammaln(counts + 1).sum()
        return float(stats.dirichlet_multinomial.logpmf(counts, alpha, n) - coef)

    def reference_log_predictive(self, fam: Categorical, x: np.ndarray, X: np.ndarray) -> float:
        alpha = np.asarray(fam.alpha)
        k = int(x[0])
        n_k = float(np.sum(X[:, 0] == k))
        return math.log((alpha[k] + n_k) / (alpha.sum() + X.shape[0]))

    def bad_values(self) -> list[tuple[float, str]]:
        return [
            (4.0, "integers in 0..3"),
            (-1.0, "integers in 0..3"),
            (1.5, "integers in 0..3"),
            (np.nan, "integers in 0..3"),
        ]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [
            (lambda: Categorical(alpha=[1.0, 0.0]), "alpha"),
            (lambda: Categorical(alpha=[]), "alpha"),
            (lambda: Categorical(alpha=[[1.0, 2.0]]), "alpha"),
        ]

    def check_empirical_bayes(self, fam: Categorical, X: np.ndarray) -> None:
        alpha = np.asarray(fam.alpha)
        kappa = max(1.0, DISCRETE_SHARE * X.shape[0])
        assert alpha.sum() == pytest.approx(kappa)
        counts = np.bincount(X[:, 0].astype(int), minlength=4)
        np.testing.assert_allclose(alpha, kappa * (counts + 0.25) / (X.shape[0] + 1.0))
        wider = Categorical.empirical_bayes(X, n_categories=6)
        assert wider.n_categories == 6 and np.all(np.asarray(wider.alpha) > 0)

    def test_kernel_rejects_codes_outside_range(self) -> None:
        pf = self.make_family().as_product()
        s = pf.empty_stats()[0]
        c = pf.empty_cache()
        x = np.array([4.0])
        assert product.log_predictive(x, s, c, pf.spec, pf.prior) == -np.inf
        with pytest.raises(ValueError):
            product.add_stats(x, s, pf.spec, 1.0)


class TestPoisson(FamilyContract):
    moments_known = "mean"

    def make_family(self) -> Poisson:
        return Poisson(a=[1.5, 4.0], b=[0.5, 2.0])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([rng.poisson(3.0, n), rng.poisson(0.7, n)]).astype(np.float64)

    def reference_log_marginal(self, fam: Poisson, X: np.ndarray) -> float:
        out = 0.0
        for j in range(fam.n_cols):
            a, b = float(np.asarray(fam.a)[j]), float(np.asarray(fam.b)[j])
            x = X[:, j]

            def logf(lam: float, x: np.ndarray = x, a: float = a, b: float = b) -> float:
                return float(
                    stats.poisson.logpmf(x, lam).sum() + stats.gamma.logpdf(lam, a, scale=1 / b)
                )

            out += quad_log(logf, *gamma_window(a + x.sum(), b + x.shape[0]))
        return out

    def reference_log_predictive(self, fam: Poisson, x: np.ndarray, X: np.ndarray) -> float:
        an = np.asarray(fam.a) + X.sum(axis=0)
        bn = np.asarray(fam.b) + X.shape[0]
        return float(stats.nbinom.logpmf(x, an, bn / (bn + 1.0)).sum())

    def bad_values(self) -> list[tuple[float, str]]:
        msg = "Poisson counts must be non-negative integers"
        return [(-2.0, msg), (1.5, msg), (np.nan, msg), (np.inf, msg)]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [
            (lambda: Poisson(a=0.0, b=1.0), "a"),
            (lambda: Poisson(a=1.0, b=[1.0, -1.0]), "b"),
        ]

    def check_empirical_bayes(self, fam: Poisson, X: np.ndarray) -> None:
        np.testing.assert_allclose(np.asarray(fam.a) / np.asarray(fam.b), X.mean(axis=0))
        zeros = Poisson.empirical_bayes(np.zeros((5, 1)))
        assert np.all(np.asarray(zeros.a) > 0)


class TestBinomial(FamilyContract):
    n_trials = (4.0, 7.0)

    def make_family(self) -> Binomial:
        return Binomial(n_trials=list(self.n_trials), a=[1.2, 3.0], b=[2.0, 1.5])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([rng.binomial(4, 0.3, n), rng.binomial(7, 0.8, n)]).astype(
            np.float64
        )

    def reference_log_marginal(self, fam: Binomial, X: np.ndarray) -> float:
        out = 0.0
        N = np.asarray(fam.n_trials)
        for j in range(fam.n_cols):
            a, b, Nj = float(np.asarray(fam.a)[j]), float(np.asarray(fam.b)[j]), N[j]
            x = X[:, j]

            def logf(p: float, x: np.ndarray = x, a: float = a, b: float = b, Nj: float = Nj):
                return float(stats.binom.logpmf(x, Nj, p).sum() + stats.beta.logpdf(p, a, b))

            an, bn = a + x.sum(), b + x.shape[0] * Nj - x.sum()
            out += quad_log(logf, 0.0, 1.0, beta_mode(an, bn))
        return out

    def reference_log_predictive(self, fam: Binomial, x: np.ndarray, X: np.ndarray) -> float:
        N = np.asarray(fam.n_trials)
        an = np.asarray(fam.a) + X.sum(axis=0)
        bn = np.asarray(fam.b) + X.shape[0] * N - X.sum(axis=0)
        return float(stats.betabinom.logpmf(x, N, an, bn).sum())

    def bad_values(self) -> list[tuple[float, str]]:
        msg = "binomial counts must be integers in 0..7"
        return [(8.0, msg), (-1.0, msg), (2.5, msg), (np.nan, msg)]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [
            (lambda: Binomial(n_trials=0, a=1.0, b=1.0), "n_trials"),
            (lambda: Binomial(n_trials=2.5, a=1.0, b=1.0), "n_trials"),
            (lambda: Binomial(n_trials=3, a=-1.0, b=1.0), "a"),
            (lambda: Binomial(n_trials=3, a=1.0, b=0.0), "b"),
        ]

    def check_empirical_bayes(self, fam: Binomial, X: np.ndarray) -> None:
        N = np.asarray(fam.n_trials)
        np.testing.assert_allclose(N, np.maximum(X.max(axis=0), 1.0))  # the default
        a, b = np.asarray(fam.a), np.asarray(fam.b)
        np.testing.assert_allclose(a + b, N * max(1.0, DISCRETE_SHARE * X.shape[0]))
        np.testing.assert_allclose(a / (a + b), X.mean(axis=0) / N, atol=2e-3)
        given_trials = Binomial.empirical_bayes(X, n_trials=[10, 10])
        np.testing.assert_allclose(given_trials.n_trials, [10.0, 10.0])

    # what check_values says of a 5 in column 0, row 3 (Binomial: the column's number of trials)
    first_bad_match = r"column 'col0': row 3 has 5.0; .* 0\.\.4"

    def test_check_values_first_bad_column(self) -> None:
        """The message quotes the number of trials of the column at fault."""
        fam = self.make_family()
        X = self.data(13, 10)
        X[3, 0] = 5.0
        with pytest.raises(ValueError, match=self.first_bad_match):
            fam.check_values(X, self.names(fam))


class TestBernoulli(TestBinomial):
    first_bad_match = r"column 'col0': row 3 has 5.0; Bernoulli"

    def make_family(self) -> Bernoulli:
        return Bernoulli(a=[1.5, 1.1], b=[1.2, 2.0])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (rng.random((n, 2)) < [0.3, 0.75]).astype(np.float64)

    def bad_values(self) -> list[tuple[float, str]]:
        msg = "Bernoulli values must be 0 or 1"
        return [(2.0, msg), (0.5, msg), (-1.0, msg)]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [(lambda: Bernoulli(a=0.0, b=1.0), "a"), (lambda: Bernoulli(a=1.0, b=-2.0), "b")]

    def check_empirical_bayes(self, fam: Bernoulli, X: np.ndarray) -> None:
        np.testing.assert_allclose(fam.n_trials, 1.0)
        a, b = np.asarray(fam.a), np.asarray(fam.b)
        kappa = max(1.0, DISCRETE_SHARE * X.shape[0])
        np.testing.assert_allclose(a + b, kappa)
        np.testing.assert_allclose(a, kappa * (X.sum(axis=0) + 0.5) / (X.shape[0] + 1.0))
        with pytest.raises(ValueError, match="n_trials"):
            Bernoulli.empirical_bayes(X, n_trials=3)


class TestExponential(FamilyContract):
    moments_known = "mean"

    def make_family(self) -> Exponential:
        return Exponential(a=[2.0, 1.0], b=[1.0, 0.3])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([rng.exponential(2.0, n), rng.exponential(0.25, n)])

    def reference_log_marginal(self, fam: Exponential, X: np.ndarray) -> float:
        out = 0.0
        for j in range(fam.n_cols):
            a, b = float(np.asarray(fam.a)[j]), float(np.asarray(fam.b)[j])
            x = X[:, j]

            def logf(lam: float, x: np.ndarray = x, a: float = a, b: float = b) -> float:
                return float(
                    stats.expon.logpdf(x, scale=1 / lam).sum()
                    + stats.gamma.logpdf(lam, a, scale=1 / b)
                )

            out += quad_log(logf, *gamma_window(a + x.shape[0], b + x.sum()))
        return out

    def reference_log_predictive(self, fam: Exponential, x: np.ndarray, X: np.ndarray) -> float:
        an = np.asarray(fam.a) + X.shape[0]
        bn = np.asarray(fam.b) + X.sum(axis=0)
        return float(stats.lomax.logpdf(x, an, scale=bn).sum())

    def bad_values(self) -> list[tuple[float, str]]:
        msg = "exponential values must be finite and >= 0"
        return [(-0.5, msg), (np.nan, msg), (np.inf, msg)]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [(lambda: Exponential(a=-1.0, b=1.0), "a"), (lambda: Exponential(1.0, 0.0), "b")]

    def check_empirical_bayes(self, fam: Exponential, X: np.ndarray) -> None:
        np.testing.assert_allclose(np.asarray(fam.a) / np.asarray(fam.b), 1.0 / X.mean(axis=0))


class TestGeometric(FamilyContract):
    moments_known = "mean"

    def make_family(self) -> Geometric:
        return Geometric(a=[1.5, 3.0], b=[2.0, 1.2])

    def make_data(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # numpy's geometric counts trials up to the first success; the family counts failures
        return np.column_stack([rng.geometric(0.3, n) - 1, rng.geometric(0.7, n) - 1]).astype(
            np.float64
        )

    def reference_log_marginal(self, fam: Geometric, X: np.ndarray) -> float:
        out = 0.0
        for j in range(fam.n_cols):
            a, b = float(np.asarray(fam.a)[j]), float(np.asarray(fam.b)[j])
            x = X[:, j]

            def logf(p: float, x: np.ndarray = x, a: float = a, b: float = b) -> float:
                # scipy's geom is on {1, 2, ...}: failures x are trials x + 1
                return float(stats.geom.logpmf(x + 1, p).sum() + stats.beta.logpdf(p, a, b))

            out += quad_log(logf, 0.0, 1.0, beta_mode(a + x.shape[0], b + x.sum()))
        return out

    def reference_log_predictive(self, fam: Geometric, x: np.ndarray, X: np.ndarray) -> float:
        an = np.asarray(fam.a) + X.shape[0]
        bn = np.asarray(fam.b) + X.sum(axis=0)
        return float((special.betaln(an + 1.0, bn + x) - special.betaln(an, bn)).sum())

    def bad_values(self) -> list[tuple[float, str]]:
        msg = "geometric counts must be non-negative integers"
        return [(-1.0, msg), (0.5, msg), (np.nan, msg)]

    def bad_params(self) -> list[tuple[Callable[[], Family], str]]:
        return [(lambda: Geometric(a=0.0, b=1.0), "a"), (lambda: Geometric(1.0, -3.0), "b")]

    def check_empirical_bayes(self, fam: Geometric, X: np.ndarray) -> None:
        a, b = np.asarray(fam.a), np.asarray(fam.b)
        np.testing.assert_allclose(a / (a + b), 1.0 / (1.0 + X.mean(axis=0)))


# -- the product family -------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["poisson", "geometric"])
def test_count_predictive_table_and_its_fallback_match_scipy(family: str) -> None:
    """Counts below ``COUNT_TABLE`` are read from the cached table, larger ones and the table's
    edge by lgamma: both equal SciPy's predictive (negative binomial, ratio of betas)."""
    T = product.COUNT_TABLE
    X = np.array([[3.0, 0.0], [40.0, 1.0], [7.0, 2.0]])
    contract: TestPoisson | TestGeometric = (
        TestPoisson() if family == "poisson" else TestGeometric()
    )
    fam = contract.make_family()
    for x0 in (0.0, 1.0, T - 1.0, float(T), T + 5.0, 250.0):
        x = np.array([x0, 2.0])
        got = fam.log_predictive(x, X)
        want = contract.reference_log_predictive(fam, x, X)  # type: ignore[arg-type]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_product_of_families_adds_log_terms() -> None:
    """GaussianNW on columns (0, 3), Categorical on 1, Poisson on (2, 4): the product's log
    marginal and log predictive are the sums of the parts'."""
    rng = np.random.default_rng(20)
    n = 40
    X = np.column_stack(
        [
            rng.normal(0.0, 1.0, n),
            rng.integers(0, 3, n),
            rng.poisson(2.0, n),
            rng.normal(5.0, 2.0, n),
            rng.poisson(0.5, n),
        ]
    ).astype(np.float64)
    nw = GaussianNW(m0=[0.0, 4.0], c0=1.0, B0=np.eye(2) * 0.3, a0=3.0)
    cat = Categorical(alpha=[1.0, 0.5, 2.0])
    poi = Poisson(a=[2.0, 1.0], b=1.0)
    parts: list[tuple[Family, list[int]]] = [(nw, [0, 3]), (cat, [1]), (poi, [2, 4])]
    pf = ProductFamily(parts)
    want = sum(f.log_marginal(X[:, cols]) for f, cols in parts)
    assert pf.log_marginal(X) == pytest.approx(want, rel=1e-12)
    x = X[0]
    want_pred = sum(f.log_predictive(x[cols], X[1:, cols]) for f, cols in parts)
    assert pf.log_predictive(x, X[1:]) == pytest.approx(want_pred, rel=1e-12)
    assert pf.n_stats == sum(f.stat_size() for f, _ in parts)


def test_product_moments_fill_each_group_block() -> None:
    """Moments of a product: each group's block from its own family, NaN between groups."""
    rng = np.random.default_rng(21)
    n = 60
    X = np.column_stack(
        [rng.normal(0.0, 1.0, n), rng.poisson(2.0, n), rng.normal(5.0, 2.0, n)]
    ).astype(np.float64)
    nw = GaussianNW(m0=[0.0, 4.0], c0=1.0, B0=np.eye(2) * 0.3, a0=3.0)
    pf = ProductFamily([(nw, [0, 2]), (Poisson(a=[2.0], b=1.0), [1])])
    Xa = pf.arrange(X)  # group order: the Gaussian's columns 0, 2, then the Poisson's 1
    s = pf.stats_of(Xa, np.zeros(n, dtype=np.int64), 1)[0]
    mean, cov = product.moments(s, pf.spec, pf.prior, 3)
    np.testing.assert_allclose(mean, Xa.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(cov[:2, :2], np.cov(Xa[:, :2], rowvar=False, bias=True), rtol=1e-9)
    assert np.isnan(cov[2, :]).all() and np.isnan(cov[:, 2]).all()


def test_registry_names() -> None:
    assert set(FAMILIES) == {
        "gaussian",
        "diag-gaussian",
        "categorical",
        "poisson",
        "binomial",
        "bernoulli",
        "exponential",
        "geometric",
    }
    for name, cls in FAMILIES.items():
        assert cls.name == name
