"""The uncollapsed Gibbs sampler (De Bacco and Valera, Algorithm 2): every family's posterior draws
against their closed-form posteriors (SciPy), log p(x | theta) against SciPy, and the chain's
partition frequencies against the exact posterior over all partitions of five records."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats as st
from scipy.special import logsumexp

from kernels import uncollapsed as kunc
from pipeline import families as F
from pipeline.core.seeds import as_seed_sequence, seed_state
from pipeline.estimators.baselines import UncollapsedGibbs
from pipeline.models.exact import restricted_growth_strings

N_DRAWS = 20_000
# KS tests at a fixed seed: a wrong shape or rate moves the p-value to ~0 at 20,000 draws
P_MIN = 1e-3
TV_MAX = 0.05


def draws(fam: F.Family, X: np.ndarray, n: int = N_DRAWS, seed: int = 0) -> np.ndarray:
    """n posterior draws (n, T) of theta given the records X (rows of the family's columns)."""
    prod = fam.as_product()
    s = prod.stats_of(prod.arrange(X))[0]
    toff = kunc.theta_offsets(prod.spec)
    out = np.empty((n, int(toff[-1])))
    state = seed_state(as_seed_sequence(seed))
    for i in range(n):
        kunc.draw_params(s, out[i], prod.spec, prod.prior, toff, state)
    return out


def log_lik(fam: F.Family, x: np.ndarray, th: np.ndarray) -> float:
    prod = fam.as_product()
    toff = kunc.theta_offsets(prod.spec)
    return float(kunc.log_lik(prod.arrange(x[None, :])[0], th, prod.spec, prod.prior, toff))


def assert_mean(sample: np.ndarray, expected: float) -> None:
    """The sample mean within 5 standard errors of the expected value."""
    se = sample.std() / math.sqrt(sample.shape[0])
    assert abs(sample.mean() - expected) < 5 * se + 1e-12, (sample.mean(), expected, se)


def assert_ks(sample: np.ndarray, dist: st.rv_continuous) -> None:
    assert st.kstest(sample, dist.cdf).pvalue > P_MIN


# -- random variates ------------------------------------------------------------------------------


@pytest.mark.parametrize("a", [0.05, 0.7, 1.0, 3.5, 40.0])
def test_gamma_variates_follow_scipy(a: float) -> None:
    state = seed_state(as_seed_sequence(1))
    lg = np.array([kunc.log_gamma_variate(state, a) for _ in range(N_DRAWS)])
    # on the log scale: log G has cdf F_gamma(exp(t)), which stays informative for tiny shapes
    assert st.kstest(lg, lambda t: st.gamma(a).cdf(np.exp(t))).pvalue > P_MIN
    z = np.array([kunc.std_normal(state) for _ in range(N_DRAWS)])
    assert_ks(z, st.norm())


# -- posterior draws, family by family ------------------------------------------------------------


def test_normal_wishart_draws_match_the_posterior() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(7, 2)) @ np.array([[1.0, 0.0], [0.6, 0.5]]) + [1.0, -2.0]
    m0, c0, B0, a0 = np.array([0.5, 0.0]), 0.7, np.array([[2.0, 0.3], [0.3, 1.0]]), 4.0
    fam = F.GaussianNW(m0=m0, c0=c0, B0=B0, a0=a0)
    # eq. B.1 of Raykov et al. 2016, from the records
    n = X.shape[0]
    xbar = X.mean(axis=0)
    S = (X - xbar).T @ (X - xbar)
    ck, ak = c0 + n, a0 + n
    mk = (c0 * m0 + n * xbar) / ck
    Bk = np.linalg.inv(np.linalg.inv(B0) + S + c0 * n / ck * np.outer(xbar - m0, xbar - m0))
    th = draws(fam, X)
    d = 2
    mu = th[:, :d]
    Ls = th[:, d : d + d * d].reshape(-1, d, d)
    Lam = Ls @ np.transpose(Ls, (0, 2, 1))
    # E[Lambda] = a_k B_k; Lambda_jj ~ B_jj chi2(a_k); E[mu] = m_k
    for i in range(d):
        assert_ks(Lam[:, i, i], st.gamma(ak / 2, scale=2 * Bk[i, i]))
        assert_mean(mu[:, i], mk[i])
        for j in range(d):
            assert_mean(Lam[:, i, j], ak * Bk[i, j])
    # mu given Lambda is N(m_k, (c_k Lambda)^{-1}): the whitened deviations are standard normal
    w = np.einsum("nji,nj->ni", Ls, mu - mk) * math.sqrt(ck)
    assert_ks(w[:, 0], st.norm())
    assert_ks(w[:, 1], st.norm())
    np.testing.assert_allclose(th[:, -1], np.log(np.diagonal(Ls, axis1=1, axis2=2)).sum(axis=1))
    x = np.array([0.3, -1.1])
    ref = st.multivariate_normal(mu[0], np.linalg.inv(Lam[0])).logpdf(x)
    assert log_lik(fam, x, th[0]) == pytest.approx(ref, rel=1e-10)


def test_normal_gamma_draws_match_the_posterior() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal([1.0, -3.0], [0.5, 2.0], size=(6, 2))
    m0, c0, a0, b0 = np.array([0.0, 1.0]), np.array([0.5, 2.0]), np.array([2.0, 1.5]), 1.3
    fam = F.NormalGamma(m0=m0, c0=c0, a0=a0, b0=b0)
    th = draws(fam, X)
    n = X.shape[0]
    xbar = X.mean(axis=0)
    cn, an = c0 + n, a0 + n / 2
    mn = (c0 * m0 + n * xbar) / cn
    bn = b0 + 0.5 * ((X - xbar) ** 2).sum(axis=0) + c0 * n * (xbar - m0) ** 2 / (2 * cn)
    for j in range(2):
        tau, mu = th[:, 2 + j], th[:, j]
        assert_ks(tau, st.gamma(an[j], scale=1 / bn[j]))
        assert_ks((mu - mn[j]) * np.sqrt(cn[j] * tau), st.norm())
    x = np.array([0.2, 4.0])
    ref = st.norm(th[0, :2], 1 / np.sqrt(th[0, 2:])).logpdf(x).sum()
    assert log_lik(fam, x, th[0]) == pytest.approx(ref, rel=1e-10)


def test_dirichlet_draws_match_the_posterior() -> None:
    alpha = np.array([0.2, 1.0, 3.0, 0.5])
    X = np.array([[0.0], [2.0], [2.0], [1.0], [2.0]])
    fam = F.Categorical(alpha=alpha)
    th = draws(fam, X)
    post = alpha + np.bincount(X[:, 0].astype(int), minlength=4)
    theta = np.exp(th)
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, rtol=1e-12)
    for c in range(4):
        # the Dirichlet's marginals are Beta(post_c, sum post - post_c)
        assert_ks(theta[:, c], st.beta(post[c], post.sum() - post[c]))
    assert log_lik(fam, np.array([3.0]), th[0]) == pytest.approx(th[0, 3])
    assert log_lik(fam, np.array([4.0]), th[0]) == -np.inf


def test_poisson_draws_match_the_posterior() -> None:
    X = np.array([[3.0, 0.0], [5.0, 1.0], [2.0, 0.0]])
    a, b = np.array([2.0, 0.5]), np.array([1.0, 3.0])
    fam = F.Poisson(a=a, b=b)
    th = draws(fam, X)
    for j in range(2):
        assert_ks(th[:, j], st.gamma(a[j] + X[:, j].sum(), scale=1 / (b[j] + 3)))
    x = np.array([4.0, 2.0])
    assert log_lik(fam, x, th[0]) == pytest.approx(st.poisson(th[0]).logpmf(x).sum(), rel=1e-10)


def test_exponential_draws_match_the_posterior() -> None:
    X = np.array([[0.3], [1.7], [0.2], [0.9]])
    fam = F.Exponential(a=1.5, b=2.0)
    th = draws(fam, X)
    assert_ks(th[:, 0], st.gamma(1.5 + 4, scale=1 / (2.0 + X.sum())))
    x = np.array([0.6])
    ref = st.expon(scale=1 / th[0, 0]).logpdf(x).sum()
    assert log_lik(fam, x, th[0]) == pytest.approx(ref, rel=1e-10)


def test_binomial_draws_match_the_posterior() -> None:
    X = np.array([[1.0, 0.0], [3.0, 1.0], [2.0, 1.0], [0.0, 1.0]])
    N = np.array([3.0, 1.0])
    a, b = np.array([0.5, 2.0]), np.array([1.5, 0.3])
    fam = F.Binomial(n_trials=N, a=a, b=b)
    th = draws(fam, X)
    for j in range(2):
        u = X[:, j].sum()
        theta = np.exp(th[:, j])
        assert_ks(theta, st.beta(a[j] + u, b[j] + 4 * N[j] - u))
        np.testing.assert_allclose(np.exp(th[:, 2 + j]), 1 - theta, atol=1e-12)
    x = np.array([2.0, 1.0])
    ref = st.binom(N.astype(int), np.exp(th[0, :2])).logpmf(x).sum()
    assert log_lik(fam, x, th[0]) == pytest.approx(ref, rel=1e-10)


def test_geometric_draws_match_the_posterior() -> None:
    X = np.array([[0.0], [4.0], [2.0]])
    fam = F.Geometric(a=1.2, b=0.8)
    th = draws(fam, X)
    assert_ks(np.exp(th[:, 0]), st.beta(1.2 + 3, 0.8 + 6))
    x = np.array([3.0])
    # failures before the first success: SciPy's geom counts trials, x + 1
    ref = st.geom(np.exp(th[0, 0])).logpmf(x + 1).sum()
    assert log_lik(fam, x, th[0]) == pytest.approx(ref, rel=1e-10)


# -- the chain against the exact posterior over partitions ---------------------------------------


def exact_partition_posterior(
    X: np.ndarray, fam: F.Family | F.ProductFamily, alpha: float
) -> tuple[dict[tuple[int, ...], int], np.ndarray]:
    """p(partition | X) of every set partition (restricted growth strings) by enumeration:
    alpha^K prod_k Gamma(n_k) p(X_k) (Xu et al. 2009, eq. 5), normalised."""
    prod = F.as_product(fam)
    rgs = restricted_growth_strings(X.shape[0]).astype(np.int64)
    Xa = prod.arrange(X)
    logp = np.empty(rgs.shape[0])
    for i, a in enumerate(rgs):
        K = int(a.max()) + 1
        blocks = prod.stats_of(Xa, a, K)
        logp[i] = K * math.log(alpha) + sum(
            math.lgamma(s[0]) + prod.log_marginal_stats(s) for s in blocks
        )
    return {tuple(a): i for i, a in enumerate(rgs)}, np.exp(logp - logsumexp(logp))


def tv_distance(samples: np.ndarray, index: dict[tuple[int, ...], int], probs: np.ndarray) -> float:
    freq = np.zeros_like(probs)
    for row, c in Counter(map(tuple, samples)).items():
        freq[index[row]] += c
    freq /= freq.sum()
    return 0.5 * float(np.abs(freq - probs).sum())


def _case(name: str) -> tuple[np.ndarray, F.Family | F.ProductFamily]:
    if name == "normal-wishart":
        X = np.array([[0.0, 0.1], [0.3, -0.2], [1.2, 1.0], [1.0, 1.4], [0.7, 0.5]])
        return X, F.GaussianNW(m0=[0.6, 0.6], c0=0.5, B0=np.eye(2) * 3.0, a0=3.0)
    if name == "poisson-bernoulli-categorical":
        X = np.array([[0, 1, 2], [1, 0, 0], [5, 1, 1], [7, 1, 2], [4, 0, 1]], dtype=float)
        fam = F.ProductFamily(
            [
                (F.Poisson(a=2.0, b=0.5), [0]),
                (F.Bernoulli(a=1.0, b=1.0), [1]),
                (F.Categorical(alpha=[0.5, 0.5, 0.5]), [2]),
            ]
        )
        return X, fam
    X = np.array(
        [[0.1, 0.5, 0, 2], [0.4, 0.2, 1, 3], [2.0, 3.1, 6, 0], [2.5, 1.9, 4, 1], [1.0, 0.8, 2, 2]]
    )
    fam = F.ProductFamily(
        [
            (F.NormalGamma(m0=1.0, c0=0.5, a0=2.0, b0=0.5), [0]),
            (F.Exponential(a=2.0, b=2.0), [1]),
            (F.Geometric(a=1.0, b=1.0), [2]),
            (F.Binomial(n_trials=3, a=1.0, b=1.0), [3]),
        ]
    )
    return X, fam


@pytest.mark.parametrize(
    "case", ["normal-wishart", "poisson-bernoulli-categorical", "normalgamma-exp-geom-binomial"]
)
def test_chain_matches_exact_posterior(case: str) -> None:
    """Partition frequencies of 40,000 scans vs enumeration (Bell(5) = 52): TV < 0.05."""
    X, fam = _case(case)
    alpha = 1.0
    index, probs = exact_partition_posterior(X, fam, alpha)
    est = UncollapsedGibbs(alpha=alpha, family=fam, n_iter=40_500, burn_in=500, random_state=1)
    est.fit(X)
    assert est.samples_.shape == (40_000, 5)
    tv = tv_distance(est.samples_, index, probs)
    assert tv < TV_MAX, f"{case}: TV = {tv:.4f}"
    # the kept labels are the visited partition with the highest log p(X, z)
    best = index[tuple(est.labels_)]
    visited = {index[tuple(r)] for r in est.samples_}
    assert probs[best] == pytest.approx(max(probs[list(visited)]))


def test_fitted_attributes_and_prediction() -> None:
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(0, 1, (60, 2)), rng.normal(8, 1, (60, 2))])
    est = UncollapsedGibbs(family="gaussian", n_iter=60, burn_in=10, random_state=0).fit(X)
    assert est.n_clusters_ == 2
    assert est.cluster_params_.shape == (2, 2 + 4 + 1)
    # the sampled means sit near the two centres
    centres = np.sort(est.cluster_params_[:, 0])
    np.testing.assert_allclose(centres, [0.0, 8.0], atol=0.6)
    assert est.log_joint_.shape == (60,) and est.samples_.shape == (50, 120)
    assert est.objective_ == pytest.approx(-est.log_joint_[10:].max())
    assert np.array_equal(est.predict(X), est.labels_)
    assert np.isfinite(est.score(X))
    again = UncollapsedGibbs(family="gaussian", n_iter=60, burn_in=10, random_state=0).fit(X)
    assert np.array_equal(again.samples_, est.samples_)
    with pytest.raises(ValueError, match="alpha"):
        UncollapsedGibbs(alpha=-1.0).fit(X)
    with pytest.raises(ValueError, match="n_iter"):
        UncollapsedGibbs(n_iter=0).fit(X)
