"""ASUGS, ASUGS-PM and SUGS (Tsiligkaridis and Forsythe 2015): the estimator and its kernels against
references.

The reference for the Normal-Wishart is Tsiligkaridis and Forsythe 2015's own parameterisation,
written here from the paper and nothing else: the prior (mu0, c0, delta0, Sigma0) with the precision
Wishart of 2 delta0 degrees of freedom and Sigma = V^{-1} / (2 delta) (Section 3), the recursive
updates eqs. 4-7 and the conditional likelihood eq. 8, whose constant the paper leaves out
("propto"); the normalised density is eq. 8 times pi^{-d/2} (a multivariate Student-t with 2 delta +
1 - d degrees of freedom). The project's family has (m0, c0, B0, a0) of Raykov et al. 2016, Appendix
B, so a0 = 2 delta0 and B0 = V0 = Sigma0^{-1} / a0.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import gammaln
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import normalized_mutual_info_score

from kernels.alloc import crp
from kernels.obs import product
from pipeline import ASUGS
from pipeline.core.config import ALPHA_PRIOR
from pipeline.families import GaussianNW, Poisson, ProductFamily
from pipeline.models.asugs import PRIOR_SCALE


def grid16(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Section 6.1's problem: 16 equally likely 2-D Gaussians of variance 0.025 (means on a
    4 x 4 grid of spacing 1, the paper gives none)."""
    rng = np.random.default_rng(seed)
    g = np.arange(4.0) - 1.5
    means = np.array([(a, b) for a in g for b in g])
    y = rng.integers(0, 16, n)
    return means[y] + rng.normal(scale=math.sqrt(0.025), size=(n, 2)), y


def paper_prior(
    d: int, seed: int
) -> tuple[GaussianNW, tuple[np.ndarray, float, float, np.ndarray]]:
    """A random prior as the project's family and as (mu0, c0, delta0, Sigma0) of Tsiligkaridis and
    Forsythe 2015."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    Sigma0 = A @ A.T / d + 0.5 * np.eye(d)
    mu0 = rng.normal(size=d)
    c0 = float(rng.uniform(0.05, 2.0))
    delta0 = float(d / 2 + rng.uniform(0.5, 3.0))
    a0 = 2.0 * delta0
    B0 = np.linalg.inv(Sigma0) / a0
    return GaussianNW(m0=mu0, c0=c0, B0=0.5 * (B0 + B0.T), a0=a0), (mu0, c0, delta0, Sigma0)


def eq8(y: np.ndarray, mu: np.ndarray, c: float, delta: float, Sigma: np.ndarray) -> float:
    """log L(y) of Tsiligkaridis and Forsythe 2015, eq. 8, normalised (times pi^{-d/2})."""
    d = y.shape[0]
    r = c / (1.0 + c)
    rho = math.exp(gammaln(delta + 0.5) - gammaln(delta + (1.0 - d) / 2.0))
    dev = y - mu
    quad = float(dev @ np.linalg.solve(Sigma, dev))
    return (
        0.5 * d * math.log(r / (2.0 * delta))
        + math.log(rho)
        - 0.5 * np.linalg.slogdet(Sigma)[1]
        - (delta + 0.5) * math.log1p(r / (2.0 * delta) * quad)
        - 0.5 * d * math.log(math.pi)
    )


def eqs4to7(
    y: np.ndarray, mu: np.ndarray, c: float, delta: float, Sigma: np.ndarray
) -> tuple[np.ndarray, float, float, np.ndarray]:
    """One record's recursive update of Tsiligkaridis and Forsythe 2015, eqs. 4-7."""
    dev = y - mu
    mu_new = y / (1.0 + c) + c / (1.0 + c) * mu
    Sigma_new = (2 * delta) / (1 + 2 * delta) * Sigma + 1.0 / (1 + 2 * delta) * c / (
        1 + c
    ) * np.outer(dev, dev)
    return mu_new, c + 1.0, delta + 0.5, Sigma_new


def reference_asugs(
    Y: np.ndarray, prior: tuple[np.ndarray, float, float, np.ndarray], lam: float
) -> tuple[list[int], list[float]]:
    """Algorithm 1 (greedy) in Tsiligkaridis and Forsythe 2015's parameterisation: labels and
    alpha_i per record."""
    mu0, c0, delta0, Sigma0 = prior
    classes: list[list[Any]] = []  # [m, mu, c, delta, Sigma]
    labels, alphas = [], []
    for i, y in enumerate(Y, start=1):
        if i == 1:
            h = 0
        else:
            alpha = len(classes) / (lam + math.log(i - 1))  # (a)
            w = [math.log(cl[0]) + eq8(y, *cl[1:]) for cl in classes]
            w.append(math.log(alpha) + eq8(y, mu0, c0, delta0, Sigma0))
            h = int(np.argmax(w))  # (b)
        if h == len(classes):
            classes.append([0, mu0, c0, delta0, Sigma0])
        cl = classes[h]
        cl[1:] = eqs4to7(y, *cl[1:])  # (c)
        cl[0] += 1
        labels.append(h)
        alphas.append(len(classes) / (lam + math.log(i)))
    return labels, alphas


# -- the Normal-Wishart update and eq. 8 ---------------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 4])
def test_the_projects_normal_wishart_update_gives_eq_8(d: int) -> None:
    fam, (mu, c, delta, Sigma) = paper_prior(d, seed=d)
    prod = fam.as_product()
    rng = np.random.default_rng(10 + d)
    Y = rng.normal(size=(25, d)) * 2.0 + 1.0
    s = np.zeros(prod.n_stats)
    cache = prod.empty_cache().copy()
    probe = rng.normal(size=(5, d))
    for y in Y:
        for x in probe:
            got = product.log_predictive(x, s, cache, prod.spec, prod.prior)
            assert got == pytest.approx(eq8(x, mu, c, delta, Sigma), rel=1e-10, abs=1e-10)
        # the project's recursive update: statistics plus a rank-one Cholesky update
        product.update(y, s, cache, prod.spec, prod.prior, 1.0)
        mu, c, delta, Sigma = eqs4to7(y, mu, c, delta, Sigma)


def test_the_streams_add_record_is_the_familys_update() -> None:
    """``gaussian_nw.add_record`` (L and L^{-1} updated together, determinant lemma, no
    allocation) and the kernel ``update`` of a record joining a cluster (the same algebra)
    against ``refresh`` of the same statistics."""
    from kernels.obs import gaussian_nw

    fam, _ = paper_prior(3, seed=3)
    prod = fam.as_product()
    rng = np.random.default_rng(4)
    s1, s2 = np.zeros(prod.n_stats), np.zeros(prod.n_stats)
    c1, c2 = prod.empty_cache().copy(), prod.empty_cache().copy()
    work = np.empty(12)
    for x in rng.normal(size=(200, 3)) * 3.0:
        product.update(x, s1, c1, prod.spec, prod.prior, 1.0)
        gaussian_nw.add_record(x, s2, c2, prod.prior, work)
        np.testing.assert_array_equal(s1, s2)
        want = prod.cache_of(s2)[0]
        np.testing.assert_allclose(c1, want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c2, want, rtol=1e-10, atol=1e-12)


def test_a_stream_without_its_factor_ends_with_the_familys_cache() -> None:
    """``add_record`` with factor=False changes U, b and the constants as with the factor (L is
    read only by its own update), and ``restore_factor`` gives back L; ``ASUGS``'s stream, which
    adds records that way, ends with the caches of its statistics."""
    from kernels.obs import gaussian_nw

    fam, _ = paper_prior(3, seed=3)
    prod = fam.as_product()
    d = 3
    s1, s2 = np.zeros(prod.n_stats), np.zeros(prod.n_stats)
    c1, c2 = prod.empty_cache().copy(), prod.empty_cache().copy()
    work = np.empty(4 * d)
    for x in np.random.default_rng(5).normal(size=(100, d)) * 3.0:
        gaussian_nw.add_record(x, s1, c1, prod.prior, work)
        gaussian_nw.add_record(x, s2, c2, prod.prior, work, None, False)
        np.testing.assert_array_equal(c1[d * d :], c2[d * d :])
    gaussian_nw.restore_factor(c2, d)
    np.testing.assert_allclose(c2, c1, rtol=1e-10, atol=1e-12)
    X, _ = grid16(400, seed=6)
    fam2 = GaussianNW.empirical_bayes(X, scale=0.1)
    est = ASUGS(family=fam2).fit(X)
    want = fam2.as_product().cache_of(est.cluster_stats_)
    np.testing.assert_allclose(est._cache, want, rtol=1e-9, atol=1e-12)


def test_greedy_asugs_equals_algorithm_1_in_the_papers_parameterisation() -> None:
    fam, prior = paper_prior(2, seed=7)
    Y, _ = grid16(300, seed=1)
    lam = 0.7
    labels, alphas = reference_asugs(Y, prior, lam)
    m = ASUGS(lam=lam, prune_merge=False, family=fam).fit(Y)
    np.testing.assert_array_equal(m.labels_, labels)
    np.testing.assert_allclose(m.alpha_history_, alphas, rtol=1e-13)
    assert m.n_clusters_ == max(labels) + 1


# -- the concentration ----------------------------------------------------------------------------


@pytest.mark.parametrize("prune_merge", [False, True])
def test_alpha_i_is_k_i_over_lambda_plus_log_i(prune_merge: bool) -> None:
    X, _ = grid16(400, seed=2)
    lam = 2.5
    m = ASUGS(
        lam=lam,
        prune_merge=prune_merge,
        pm_interval=20,
        family=GaussianNW.empirical_bayes(X, scale=PRIOR_SCALE),
    )
    k = []
    for x in X:
        m.partial_fit(x[None, :])
        k.append(m.n_clusters_)
        assert m.alpha_ == m.n_clusters_ / (lam + math.log(m.n_seen_))
    i = np.arange(1, X.shape[0] + 1)
    np.testing.assert_allclose(m.alpha_history_, np.asarray(k) / (lam + np.log(i)), rtol=1e-14)
    assert m.n_seen_ == X.shape[0]
    if prune_merge:
        assert m.n_merged_ + m.n_pruned_ > 0


def test_sugs_keeps_its_fixed_alpha() -> None:
    X, _ = grid16(200, seed=3)
    m = ASUGS(lam=None, alpha=0.3, prune_merge=False).fit(X)
    assert m.alpha_ == 0.3
    np.testing.assert_array_equal(m.alpha_history_, np.full(200, 0.3))


# -- streams: batches, order, additivity, chain rule ----------------------------------------


@given(cuts=st.lists(st.integers(1, 599), max_size=6), select=st.sampled_from(["greedy", "sample"]))
@settings(max_examples=15, deadline=None)
def test_partial_fit_in_batches_equals_fit_on_the_concatenation(
    cuts: list[int], select: str
) -> None:
    X, _ = grid16(600, seed=4)
    fam = GaussianNW.empirical_bayes(X)
    whole = ASUGS(family=fam, select=select, random_state=3, pm_interval=25).fit(X)
    parts = ASUGS(family=fam, select=select, random_state=3, pm_interval=25)
    bounds = [0, *sorted(set(cuts)), 600]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            parts.partial_fit(X[a:b])
    np.testing.assert_array_equal(parts.cluster_stats_, whole.cluster_stats_)
    np.testing.assert_array_equal(parts.alpha_history_, whole.alpha_history_)
    np.testing.assert_array_equal(parts.pruned_stats_, whole.pruned_stats_)
    # summed per batch: equal up to the order of the floating-point additions
    assert parts.log_joint_ == pytest.approx(whole.log_joint_, rel=1e-12)
    tail = parts.labels_.shape[0]
    np.testing.assert_array_equal(parts.labels_, whole.labels_[-tail:])
    np.testing.assert_array_equal(parts.predict(X[:50]), whole.predict(X[:50]))


def test_fit_then_partial_fit_continues_the_stream() -> None:
    X, _ = grid16(300, seed=5)
    fam = GaussianNW.empirical_bayes(X)
    a = ASUGS(family=fam).fit(X[:100]).partial_fit(X[100:])
    b = ASUGS(family=fam).fit(X)
    np.testing.assert_array_equal(a.cluster_stats_, b.cluster_stats_)
    # fit starts a new stream
    c = ASUGS(family=fam).fit(X[:100]).fit(X)
    assert c.n_seen_ == 300
    np.testing.assert_array_equal(c.cluster_stats_, b.cluster_stats_)


@pytest.mark.parametrize("prune_merge", [False, True])
def test_order_changes_the_clusters_but_statistics_stay_additive(prune_merge: bool) -> None:
    X, _ = grid16(500, seed=6)
    fam = GaussianNW.empirical_bayes(X)
    total = fam.as_product().stats_of(X)[0]
    results = []
    for seed in range(4):
        perm = np.random.default_rng(seed).permutation(500)
        m = ASUGS(family=fam, prune_merge=prune_merge, pm_interval=25).fit(X[perm])
        np.testing.assert_allclose(
            m.cluster_stats_.sum(axis=0) + m.pruned_stats_, total, rtol=1e-10, atol=1e-9
        )
        assert m.cluster_sizes_.sum() + m.pruned_stats_[0] == 500
        assert (m.labels_ >= 0).sum() == m.cluster_sizes_.sum()
        # each class's statistics are those of the records labelled with it
        lab = m.labels_
        for k in range(m.n_clusters_):
            np.testing.assert_allclose(
                m.cluster_stats_[k],
                fam.as_product().stats_of(X[perm][lab == k])[0],
                rtol=1e-10,
                atol=1e-9,
            )
        results.append(m.cluster_stats_)
    # sequential inference depends on the order of the stream
    assert any(r.shape != results[0].shape or not np.allclose(r, results[0]) for r in results[1:])


@pytest.mark.parametrize("family", ["gaussian", "poisson"])
def test_chain_rule_sugs_log_joint_is_log_p_of_x_and_z(family: str) -> None:
    """Without pruning or merging, SUGS's increments log L_{i,gamma_i} pi_{i,gamma_i}(alpha)
    add up to log p(X, z | alpha) = sum_k log p(X_k) + log CRP EPPF (eq. 1 is the CRP's
    sequential form)."""
    rng = np.random.default_rng(8)
    if family == "gaussian":
        X, _ = grid16(300, seed=8)
        fam = GaussianNW.empirical_bayes(X).as_product()
    else:
        X = rng.poisson(rng.choice([1.0, 6.0, 20.0], size=(300, 1)) * np.ones((1, 3))).astype(float)
        fam = Poisson.empirical_bayes(X).as_product()
    alpha = 0.8
    m = ASUGS(lam=None, alpha=alpha, prune_merge=False, family=fam).fit(X)
    lm = product.log_marginals(m.cluster_stats_, fam.spec, fam.prior).sum()
    sizes = m.cluster_stats_[:, 0].copy()
    eppf = crp.log_eppf(sizes, sizes.shape[0], alpha)
    assert m.log_joint_ == pytest.approx(lm + eppf, rel=1e-9)


def test_every_family_streams() -> None:
    rng = np.random.default_rng(9)
    n = 400
    y = rng.integers(0, 3, n)
    df = pd.DataFrame(
        {
            "g1": rng.normal(size=n) + 4 * y,
            "g2": rng.normal(size=n) - 3 * y,
            "visits": rng.poisson(1 + 8 * y).astype(np.int64) + 11 * (y == 5),
            "colour": np.array(["red", "green", "blue"])[y],
            "flag": (y == 1),
        }
    )
    fam = {"visits": "poisson"}
    m = ASUGS(family=fam).fit(df)
    kinds = {type(f).__name__ for f, _ in m.family_.groups}
    assert kinds == {"GaussianNW", "Poisson", "Categorical", "Bernoulli"}
    assert normalized_mutual_info_score(y, m.labels_) > 0.9
    assert np.isfinite(m.score_samples(df)).all()
    # batches of the same stream, with a fixed family
    p = ASUGS(family=m.family_)
    Xa = df.copy()
    Xa["colour"] = Xa["colour"].map({c: i for i, c in enumerate(m.schema_.categories["colour"])})
    Xa["flag"] = Xa["flag"].astype(float)
    Xnum = Xa[m.schema_.columns].to_numpy(dtype=float)
    for a in range(0, n, 97):
        p.partial_fit(Xnum[a : a + 97])
    q = ASUGS(family=m.family_).fit(Xnum)
    np.testing.assert_array_equal(p.cluster_stats_, q.cluster_stats_)


def test_score_samples_is_eq_3_4_with_the_learned_weights() -> None:
    X, _ = grid16(500, seed=11)
    Xt, _ = grid16(50, seed=12)
    m = ASUGS().fit(X)
    fam = m.family_
    n = m.cluster_sizes_.astype(float)
    a = m.alpha_
    want = []
    for x in fam.arrange(Xt):
        terms = [
            math.log(n[k] / (n.sum() + a))
            + product.log_predictive(x, m.cluster_stats_[k], m._cache[k], fam.spec, fam.prior)
            for k in range(m.n_clusters_)
        ]
        e = np.zeros(fam.n_stats)
        terms.append(
            math.log(a / (n.sum() + a))
            + product.log_predictive(x, e, fam.empty_cache(), fam.spec, fam.prior)
        )
        want.append(np.logaddexp.reduce(terms))
    np.testing.assert_allclose(m.score_samples(Xt), want, rtol=1e-12)
    assert m.score(Xt) == pytest.approx(np.mean(want), rel=1e-12)


def test_asugs_pm_finds_the_16_classes_of_section_6_1() -> None:
    """With a prior that expects a class to hold 1% of the data's variance (the truth: 2%); a
    one-pass method cannot undo what a too broad prior merged early."""
    found = []
    nmis = []
    for seed in range(5):
        X, y = grid16(500, seed=100 + seed)
        m = ASUGS(family=GaussianNW.empirical_bayes(X, shrink=100.0)).fit(X)
        found.append(m.n_clusters_)
        nmis.append(normalized_mutual_info_score(y, m.labels_))
    assert np.median(found) == 16, found
    assert min(nmis) > 0.9, nmis


def test_defaults_find_the_16_classes_of_section_6_1_in_batches() -> None:
    """Issue 36: ``ASUGS()`` as a user runs it, 500 records in 5 ``partial_fit`` batches (the
    prior fitted to the first 100 and chosen by empirical Bayes on them): the 16 classes and a
    test log likelihood per record within 5% of the true mixture's (the fixed scale 0.1 finds
    3-8 classes, 1.41x)."""
    g = np.arange(4.0) - 1.5
    means = np.array([(a, b) for a in g for b in g])
    found, ratios = [], []
    for seed in range(4):
        X, _ = grid16(500, seed=200 + seed)
        Xt, yt = grid16(1000, seed=300 + seed)
        m = ASUGS()
        for b in range(5):
            m.partial_fit(X[100 * b : 100 * (b + 1)])
        d2 = ((Xt[:, None, :] - means[None]) ** 2).sum(axis=2)
        truth = np.logaddexp.reduce(-d2 / 0.05 - math.log(2 * math.pi * 0.025 * 16), axis=1)
        found.append(m.n_clusters_)
        ratios.append(m.score(Xt) / truth.mean())
        assert normalized_mutual_info_score(yt, m.predict(Xt)) > 0.98
    assert sum(k == 16 for k in found) >= 3, found
    assert np.mean(ratios) < 1.05, ratios


def test_with_prior_is_the_empirical_bayes_prior_at_another_scale() -> None:
    """``with_prior`` rescales a prior without the data: at strength 1 it is
    ``empirical_bayes`` at the new scale (both Gaussian kinds); a strength keeps E[precision]."""
    from pipeline.families import NormalGamma
    from pipeline.models.asugs import with_prior

    X, _ = grid16(200, seed=21)
    X = np.column_stack([X, np.round(X[:, 0] * 10.0)])  # a column on a grid (its cells count)
    for kind in (GaussianNW, NormalGamma):
        base = kind.empirical_bayes(X, scale=0.1).as_product()
        got = with_prior(base, 0.1, 0.02, 1.0)
        want = kind.empirical_bayes(X, scale=0.02).as_product()
        np.testing.assert_allclose(got.prior, want.prior, rtol=1e-12, atol=1e-15)
    fam = with_prior(GaussianNW.empirical_bayes(X, scale=0.1).as_product(), 0.1, 0.1, 30.0)
    (g, _cols), (b, _) = (
        fam.groups[0],
        GaussianNW.empirical_bayes(X, scale=0.1).as_product().groups[0],
    )
    assert g.a0 == 3 + 1 + 30.0
    np.testing.assert_allclose(g.a0 * np.asarray(g.B0), b.a0 * np.asarray(b.B0), rtol=1e-12)


def test_the_prior_is_chosen_on_the_first_batch_only() -> None:
    """The choice is made once, on the first batch (a batch too short to choose from keeps the
    fixed scale and the weakest Wishart); a given prior_scale or family is not changed."""
    from pipeline.models.asugs import EB_MIN_RECORDS, PRIOR_SCALE

    X, _ = grid16(400, seed=22)
    m = ASUGS().partial_fit(X[:200])
    fam = m.family_
    m.partial_fit(X[200:])
    assert m.family_ is fam and m.prior_scale_ < PRIOR_SCALE
    short = ASUGS().partial_fit(X[: EB_MIN_RECORDS - 1])
    assert (short.prior_scale_, short.prior_strength_) == (PRIOR_SCALE, 1.0)
    fixed = ASUGS(prior_scale=0.05).fit(X)
    assert (fixed.prior_scale_, fixed.prior_strength_) == (0.05, 1.0)
    want = GaussianNW.empirical_bayes(X, scale=0.05).as_product().prior
    np.testing.assert_allclose(fixed.family_.prior, want, rtol=1e-12)
    given = ASUGS(family=GaussianNW.empirical_bayes(X)).fit(X)
    assert not hasattr(given, "prior_scale_")


def test_sample_selection_is_reproducible() -> None:
    X, _ = grid16(300, seed=13)
    a = ASUGS(select="sample", random_state=4).fit(X)
    b = ASUGS(select="sample", random_state=4).fit(X)
    c = ASUGS(select="sample", random_state=5).fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert not np.array_equal(a.alpha_history_, c.alpha_history_) or not np.array_equal(
        a.labels_, c.labels_
    )


def test_clone_and_params() -> None:
    m = ASUGS(lam=3.0, select="sample", prune_merge=False)
    c = clone(m)
    assert c.get_params() == m.get_params()


# -- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_refused_clearly() -> None:
    X, _ = grid16(100, seed=14)
    bad = X.copy()
    bad[17, 1] = np.nan
    with pytest.raises(ValueError, match=r"x1.*row 17"):
        ASUGS().fit(bad)
    m = ASUGS().fit(X)
    with pytest.raises(ValueError, match=r"row 17"):
        m.partial_fit(bad)
    assert m.n_seen_ == 100  # nothing of the refused batch was streamed
    with pytest.raises(ValueError, match="3 features, but ASUGS is expecting 2"):
        m.partial_fit(np.ones((4, 3)))
    with pytest.raises(ValueError, match="no rows"):
        m.partial_fit(np.ones((0, 2)))
    with pytest.raises(NotFittedError):
        ASUGS().predict(X)
    with pytest.raises(ValueError, match="not both"):
        ASUGS(lam=1.0, alpha=2.0).fit(X)
    with pytest.raises(ValueError, match="needs a fixed alpha"):
        ASUGS(lam=None).fit(X)
    with pytest.raises(ValueError, match="lam must be a positive"):
        ASUGS(lam=-1.0).fit(X)
    with pytest.raises(ValueError, match="select must be one of"):
        ASUGS(select="best").fit(X)
    with pytest.raises(ValueError, match="prune_weight"):
        ASUGS(prune_weight=1.5).fit(X)
    m.set_params(lam=5.0)
    with pytest.raises(ValueError, match="parameters changed"):
        m.partial_fit(X)
    fam = GaussianNW.empirical_bayes(X)
    with pytest.raises(ValueError, match="family given models 2"):
        ASUGS(family=fam).fit(np.ones((5, 3)))
    with pytest.raises(ValueError, match=r"x1.*row 17.*NaN"):
        ASUGS(family=ProductFamily([(fam, [0, 1])])).fit(bad)


# -- model updates (``dpmm update``) ----------------------------------------------------------


def test_update_model_streams_new_records_into_a_fitted_mapdp() -> None:
    from pipeline import MAPDP
    from pipeline.estimators.update import update_model

    rng = np.random.default_rng(20)
    means = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0], [8.0, 8.0], [-8.0, -8.0]])
    y1 = rng.integers(0, 4, 800)
    X1 = means[y1] + rng.normal(size=(800, 2))
    y2 = rng.integers(0, 5, 600)  # a fifth cluster appears in the new batch
    X2 = means[y2] + rng.normal(size=(600, 2))
    model = MAPDP(random_state=0).fit(pd.DataFrame(X1, columns=["a", "b"]))
    before = model.cluster_stats_.copy()
    new, stream = update_model(model, pd.DataFrame(X2, columns=["a", "b"]), random_state=0)
    np.testing.assert_array_equal(model.cluster_stats_, before)  # the model is left alone
    assert type(new) is MAPDP and new.n_clusters_ == 5 == stream.n_clusters_
    total = before.sum(axis=0) + model.family_.stats_of(model.family_.arrange(X2))[0]
    np.testing.assert_allclose(
        new.cluster_stats_.sum(axis=0) + stream.pruned_stats_, total, rtol=1e-10
    )
    assert normalized_mutual_info_score(y2, new.labels_) > 0.95
    assert stream.n_seen_ == 1400 and new.cluster_sizes_.sum() == 1400
    # the learned concentration is eq. A.1's mode for the new N and K
    from pipeline.models.concentration import map_concentration

    assert new.alpha_ == pytest.approx(map_concentration(1400, 5, *ALPHA_PRIOR), rel=1e-8)
    Xt = pd.DataFrame(means[[4]] + rng.normal(size=(20, 2)), columns=["a", "b"])
    assert (model.predict(Xt) == -1).mean() > 0.9 and (new.predict(Xt) >= 0).all()
    assert new.score(Xt) > model.score(Xt)
    # one pass in batches is the same pass
    s2 = ASUGS(family=model.family_, random_state=0).start_from(model)
    for a in range(0, 600, 150):
        s2.partial_fit(pd.DataFrame(X2[a : a + 150], columns=["a", "b"]))
    np.testing.assert_array_equal(s2.cluster_stats_, new.cluster_stats_)


def test_update_model_refuses_bad_records() -> None:
    from pipeline import MAPDP
    from pipeline.estimators.update import update_model

    X, _ = grid16(300, seed=21)
    model = MAPDP(random_state=0).fit(pd.DataFrame(X, columns=["a", "b"]))
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        update_model(model, pd.DataFrame({"a": X[:, 0]}))
    bad = pd.DataFrame(X, columns=["a", "b"])
    bad.loc[5, "a"] = np.inf
    with pytest.raises(ValueError, match=r"'a'.*row 5"):
        update_model(model, bad)
    with pytest.raises(ValueError, match="has no cluster_stats_"):
        update_model(MAPDP(), X)


def test_a_model_without_its_stream_goes_on_from_its_clusters() -> None:
    """A model read back from disk keeps its fitted attributes, not the stream: partial_fit
    continues from its clusters (without pruning/merging, exactly as the live stream)."""
    X, _ = grid16(600, seed=22)
    fam = GaussianNW.empirical_bayes(X)
    live = ASUGS(family=fam, prune_merge=False).fit(X[:300])
    loaded = ASUGS(family=fam, prune_merge=False)
    for name in (
        "cluster_stats_",
        "cluster_sizes_",
        "n_clusters_",
        "alpha_",
        "n_seen_",
        "pruned_stats_",
        "schema_",
        "family_",
        "n_features_in_",
    ):
        setattr(loaded, name, getattr(live, name))
    live.partial_fit(X[300:])
    loaded.partial_fit(X[300:])
    np.testing.assert_array_equal(loaded.cluster_stats_, live.cluster_stats_)
    np.testing.assert_array_equal(loaded.labels_, live.labels_)
    assert loaded.n_seen_ == live.n_seen_ == 600 and loaded.alpha_ == live.alpha_
