"""The iHMM kernels (Raykov et al. 2016, Section 6) against brute force: forward and Viterbi over
all paths, the MAP objective's monotonicity over many random data sets, the exact HDP-HMM prior over
state sequences, and the Gibbs sampler of 6.1 against the exact posterior by enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp

from kernels import ihmm as kihmm
from pipeline.families import Categorical, GaussianNW, NormalGamma, Poisson, ProductFamily
from pipeline.models.exact import restricted_growth_strings
from pipeline.models.ihmm import (
    HmmState,
    kappa_step,
    run_gibbs,
    starts_of,
    state_from_labels,
    sweep_state,
)
from pipeline.models.ihmm_map import run_map_ihmm


def random_hmm(rng, K, T_total):
    log_pi = np.log(rng.dirichlet(np.ones(K)))
    log_a = np.log(rng.dirichlet(np.ones(K), size=K))
    log_b = rng.normal(size=(T_total, K))
    return log_pi, log_a, log_b


def brute_paths(log_pi, log_a, log_b):
    """log p(x, path) of every path of one sequence."""
    T, K = log_b.shape
    out = {}
    for path in itertools.product(range(K), repeat=T):
        v = log_pi[path[0]] + log_b[0, path[0]]
        for t in range(1, T):
            v += log_a[path[t - 1], path[t]] + log_b[t, path[t]]
        out[path] = v
    return out


@pytest.mark.parametrize("seed", range(5))
def test_forward_and_viterbi_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    lengths = np.array([1, 4, 5])
    starts = starts_of(lengths, int(lengths.sum()))
    log_pi, log_a, log_b = random_hmm(rng, 3, int(lengths.sum()))
    steps = kihmm.forward_steps(log_b, starts, log_pi, log_a)
    path, best = kihmm.viterbi(log_b, starts, log_pi, log_a)
    for s in range(lengths.shape[0]):
        sl = slice(starts[s], starts[s + 1])
        paths = brute_paths(log_pi, log_a, log_b[sl])
        vals = np.array(list(paths.values()))
        # the chain rule: the filtering terms sum to the sequence's log likelihood
        assert steps[sl].sum() == pytest.approx(logsumexp(vals), rel=1e-12, abs=1e-12)
        assert best[s] == pytest.approx(vals.max(), rel=1e-12, abs=1e-12)
        assert paths[tuple(path[sl])] == pytest.approx(vals.max(), rel=1e-12, abs=1e-12)


# -- the exact HDP-HMM prior over state sequences ---------------------------------------------
def log_stirling1(n: int) -> np.ndarray:
    """log |s(n, m)|, m = 0..n (unsigned Stirling numbers of the first kind)."""
    s = np.zeros((n + 1, n + 1))
    s[0, 0] = 1.0
    for i in range(1, n + 1):
        for m in range(1, i + 1):
            s[i, m] = s[i - 1, m - 1] + (i - 1) * s[i - 1, m]
    with np.errstate(divide="ignore"):
        return np.log(s[n])


def log_prior_hdp_hmm(z, starts, alpha, gamma):
    """log p(z) of the HDP-HMM (start row and every state's row DP(alpha, kappa),
    kappa ~ GEM(gamma)) with kappa and the transition matrix integrated out, for labels z in
    order of first appearance: the Chinese restaurant franchise, summing over the table counts
    m_pk, prod_p Gamma(a) / Gamma(a + N_p.) prod_pk |s(N_pk, m_pk)| a^m_pk times the top-level
    EPPF gamma^K Gamma(gamma) / Gamma(gamma + M) prod_k Gamma(M_k)."""
    K = int(z.max()) + 1
    trans, start, _ = kihmm.count_transitions(np.asarray(z, dtype=np.int64), starts, K)
    counts = np.vstack([start[None, :], trans]).astype(int)
    cells = [(p, k) for p in range(K + 1) for k in range(K) if counts[p, k] > 0]
    total = -np.inf
    for ms in itertools.product(*[range(1, counts[p, k] + 1) for p, k in cells]):
        m = np.zeros_like(counts)
        lp = 0.0
        for (p, k), mm in zip(cells, ms, strict=True):
            m[p, k] = mm
            lp += log_stirling1(int(counts[p, k]))[mm] + mm * math.log(alpha)
        for p in range(K + 1):
            n_p = counts[p].sum()
            if n_p:
                lp += gammaln(alpha) - gammaln(alpha + n_p)
        M = m.sum(axis=0)
        lp += K * math.log(gamma) + gammaln(gamma) - gammaln(gamma + M.sum())
        lp += gammaln(M).sum()
        total = np.logaddexp(total, lp)
    return total


@pytest.mark.parametrize(("lengths", "alpha", "gamma"), [([4], 1.0, 1.0), ([2, 3], 0.7, 2.5)])
def test_exact_prior_sums_to_one(lengths, alpha, gamma):
    """The reference prior of the enumeration test is a distribution over partitions."""
    n = int(sum(lengths))
    starts = starts_of(np.array(lengths), n)
    logs = [
        log_prior_hdp_hmm(np.asarray(z, dtype=np.int64), starts, alpha, gamma)
        for z in restricted_growth_strings(n)
    ]
    assert logsumexp(logs) == pytest.approx(0.0, abs=1e-12)


def test_gibbs_matches_exact_posterior_over_partitions():
    """The Gibbs sampler of 6.1 (eqs. 6.1-6.5) on a length-4 sequence: the frequencies of the
    15 partitions of its time steps against the exact posterior p(z | X) by enumeration,
    p(X | z) p(z). Total variation below 0.02 with 40,000 sweeps (measured 0.005; the Monte Carlo
    error is about that)."""
    X = np.array([[-1.2], [-0.9], [1.1], [1.4]])
    fam = NormalGamma(m0=np.zeros(1), c0=np.ones(1), a0=np.ones(1), b0=np.ones(1)).as_product()
    alpha, gamma = 1.0, 1.5
    starts = starts_of(None, 4)
    parts = [tuple(int(v) for v in z) for z in restricted_growth_strings(4)]
    logp = []
    for z in parts:
        za = np.asarray(z, dtype=np.int64)
        K = int(za.max()) + 1
        stats = fam.stats_of(X, za, K)
        lm = sum(fam.log_marginal_stats(stats[k]) for k in range(K))
        logp.append(lm + log_prior_hdp_hmm(za, starts, alpha, gamma))
    exact = np.exp(np.array(logp) - logsumexp(logp))
    index = {p: i for i, p in enumerate(parts)}
    counts = np.zeros(len(parts))
    burn = 500

    def record(i, z, st):
        if i >= burn:
            # canonical labels: order of first appearance
            _, first = np.unique(z, return_index=True)
            relabel = np.empty(int(z.max()) + 1, dtype=np.int64)
            relabel[z[np.sort(first)]] = np.arange(first.shape[0])
            counts[index[tuple(int(v) for v in relabel[z])]] += 1

    run_gibbs(X, starts, fam, alpha, gamma, 40_500, np.random.SeedSequence(7), record)
    freq = counts / counts.sum()
    tv = 0.5 * np.abs(freq - exact).sum()
    assert tv < 0.02, (tv, np.round(freq, 3), np.round(exact, 3))


# -- MAP: the objective never increases -------------------------------------------------------
FAMILIES = {
    "gaussian": lambda X: GaussianNW.empirical_bayes(X).as_product(),
    "normal-gamma": lambda X: NormalGamma.empirical_bayes(X).as_product(),
    "poisson": lambda X: Poisson(a=np.ones(X.shape[1]), b=np.ones(X.shape[1])).as_product(),
    "categorical": lambda X: Categorical(alpha=np.ones(4)).as_product(),
}


def random_sequences(rng, family, n_seq):
    K = int(rng.integers(2, 5))
    lengths = rng.integers(2, 40, size=n_seq)
    z = []
    for n in lengths:
        k = int(rng.integers(K))
        for _ in range(n):
            if rng.random() < 0.1:
                k = int(rng.integers(K))
            z.append(k)
    z = np.asarray(z)
    if family in ("gaussian", "normal-gamma"):
        X = rng.normal(size=(z.shape[0], 2)) + 2.0 * z[:, None]
    elif family == "poisson":
        X = rng.poisson(1.0 + 3.0 * z[:, None], size=(z.shape[0], 2)).astype(float)
    else:
        X = ((z[:, None] + (rng.random((z.shape[0], 1)) < 0.3)) % 4).astype(float)
    return X, lengths


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_map_objective_never_increases(family):
    """Every step of a run (sweeps of eq. 6.7, kappa step, Viterbi, merge and split moves) over
    many random data sets, every family as emissions: the objective history never rises, and
    its last value is the objective of the final state recomputed from the labels."""
    rng = np.random.default_rng(hash(family) % 2**32)
    for rep in range(12):
        X, lengths = random_sequences(rng, family, int(rng.integers(1, 5)))
        fam = FAMILIES[family](X)
        Xa = fam.arrange(X)
        starts = starts_of(lengths, X.shape[0])
        alpha, gamma = float(rng.uniform(0.3, 5)), float(rng.uniform(1.0, 4.0))
        res = run_map_ihmm(
            Xa, starts, fam, alpha, gamma, 100, 0.0, "expectation", np.array([rep], np.uint64)
        )
        h = np.asarray(res.history)
        assert np.all(np.diff(h) <= 1e-9 * np.abs(h[:-1])), (rep, h)
        st = res.state
        again = state_from_labels(Xa, res.labels, starts, st.n_states, fam, st.kappa, st.ku)
        np.testing.assert_allclose(again.stats, st.stats, atol=1e-8)
        np.testing.assert_array_equal(again.trans, st.trans)
        np.testing.assert_array_equal(again.start, st.start)
        assert again.objective(fam, alpha, gamma) == pytest.approx(h[-1], rel=1e-9)


def test_sweep_costs_are_exact_objective_changes():
    """One MAP sweep from a random labelling: the objective after it, recomputed from the labels,
    is never above the objective before it (each q_{t,k} is an exact change of E)."""
    rng = np.random.default_rng(3)
    for _rep in range(20):
        X, lengths = random_sequences(rng, "gaussian", 3)
        fam = FAMILIES["gaussian"](X)
        starts = starts_of(lengths, X.shape[0])
        z = rng.integers(0, 4, size=X.shape[0])
        z = np.unique(z, return_inverse=True)[1].astype(np.int64)
        K = int(z.max()) + 1
        kappa = rng.dirichlet(np.ones(K + 1))
        st = state_from_labels(X, z, starts, K, fam, kappa[:K], kappa[K])
        e0 = st.objective(fam, 1.3, 2.0)
        st1, _ = sweep_state(X, starts, z, st, fam, 1.3, 2.0, False, np.array([1], np.uint64))
        e1 = st1.objective(fam, 1.3, 2.0)
        assert e1 <= e0 + 1e-9 * abs(e0)
        again = state_from_labels(X, z, starts, st1.n_states, fam, st1.kappa, st1.ku)
        assert again.objective(fam, 1.3, 2.0) == pytest.approx(e1, rel=1e-10)


def test_kappa_step_is_eq_6_6_with_expected_counts():
    """The expected table counts against the Polya urn's mean (eq. 6.2) by simulation, and the
    kappa mode against its closed form."""
    trans = np.array([[5.0, 1.0], [2.0, 1200.0]])
    start = np.array([1.0, 0.0])
    kappa = np.array([0.3, 0.5])
    M = kihmm.table_counts(trans, start, kappa, 2.0, np.zeros(1, np.uint64), False)
    draws = np.array(
        [
            kihmm.table_counts(trans, start, kappa, 2.0, np.array([s], np.uint64), True)
            for s in range(2000)
        ]
    )
    np.testing.assert_allclose(M, draws.mean(axis=0), rtol=0.02)
    st = HmmState(np.zeros((2, 3)), trans, start, kappa, 0.2)
    st2 = kappa_step(st, 2.0, 3.0, "expectation", np.array([0], np.uint64))
    np.testing.assert_allclose(st2.kappa, M / (M.sum() + 2.0))
    assert st2.ku == pytest.approx(2.0 / (M.sum() + 2.0))


def test_product_family_emissions():
    """A product family (Gaussian and categorical columns) as emissions: a run is monotone."""
    rng = np.random.default_rng(0)
    X, lengths = random_sequences(rng, "categorical", 3)
    Xg = rng.normal(size=(X.shape[0], 1)) + X[:, :1]
    Xm = np.hstack([Xg, X[:, :1]])
    fam = ProductFamily(
        [
            (NormalGamma.empirical_bayes(Xg), [0]),
            (Categorical(alpha=np.ones(4)), [1]),
        ]
    )
    starts = starts_of(lengths, Xm.shape[0])
    res = run_map_ihmm(
        fam.arrange(Xm), starts, fam, 1.0, 2.0, 100, 0.0, "expectation", np.zeros(1, np.uint64)
    )
    h = np.asarray(res.history)
    assert np.all(np.diff(h) <= 1e-9 * np.abs(h[:-1]))
    assert res.state.n_states >= 2


def test_merge_deltas_equal_full_objective_differences():
    """The O(K) merge change of E against the objective recomputed after each merge."""
    from pipeline.models.ihmm_map import merge_states

    rng = np.random.default_rng(11)
    for _rep in range(10):
        X, lengths = random_sequences(rng, "gaussian", 3)
        fam = FAMILIES["gaussian"](X)
        starts = starts_of(lengths, X.shape[0])
        z = np.unique(rng.integers(0, 5, size=X.shape[0]), return_inverse=True)[1]
        K = int(z.max()) + 1
        kappa = rng.dirichlet(np.ones(K + 1))
        st = state_from_labels(X, z.astype(np.int64), starts, K, fam, kappa[:K], kappa[K])
        e0 = st.objective(fam, 1.7, 2.5)
        d = kihmm.merge_deltas(
            st.stats, st.trans, st.start, st.kappa, fam.spec, fam.prior, 1.7, 2.5
        )
        for a in range(K):
            for b in range(a + 1, K):
                e1 = merge_states(st, a, b).objective(fam, 1.7, 2.5)
                assert d[a, b] == pytest.approx(e1 - e0, rel=1e-9, abs=1e-8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tempered_map_objective_never_increases(family):
    """The tempered run (every record's emission counting w < 1, ``MAPiHMM(temper=w)``): every
    step lowers the tempered objective, and its last value is the tempered objective of the
    final state recomputed from the labels."""
    rng = np.random.default_rng(sorted(FAMILIES).index(family) + 40)
    for rep in range(6):
        X, lengths = random_sequences(rng, family, int(rng.integers(1, 5)))
        fam = FAMILIES[family](X)
        Xa = fam.arrange(X)
        starts = starts_of(lengths, X.shape[0])
        alpha, gamma = float(rng.uniform(0.3, 5)), float(rng.uniform(1.0, 4.0))
        w = float(rng.uniform(0.05, 0.9))
        res = run_map_ihmm(
            Xa,
            starts,
            fam,
            alpha,
            gamma,
            100,
            0.0,
            "expectation",
            np.array([rep], np.uint64),
            temper=w,
        )
        h = np.asarray(res.history)
        assert np.all(np.diff(h) <= 1e-9 * np.abs(h[:-1])), (rep, h)
        st = res.state
        again = state_from_labels(Xa, res.labels, starts, st.n_states, fam, st.kappa, st.ku)
        assert again.objective(fam, alpha, gamma, w) == pytest.approx(h[-1], rel=1e-9)


def test_tempered_marginal_is_the_power_likelihood():
    """The tempered emission marginal log p(w S) of ``kernels.ihmm`` against
    log int prior(mu, tau) prod_i N(x_i | mu, 1 / tau)^w by numerical integration (SciPy), for
    a Normal-Gamma state at 1e-9; the Normal-Wishart of the same prior gives the same value;
    the tempered predictives chain to it; w = 1 is the untempered predictive at 1e-10."""
    from scipy import integrate

    from kernels.obs import product

    m0, c0, a0, b0 = 0.5, 1.3, 2.0, 1.5
    x = np.array([0.3, -1.2, 2.0])
    w = 0.4
    ng = NormalGamma(m0=m0, c0=c0, a0=a0, b0=b0).as_product()
    nw = GaussianNW(m0=[m0], c0=c0, B0=[[1.0 / (2.0 * b0)]], a0=2.0 * a0).as_product()

    def integrand(u, tau):
        # mu = m0 + u / sqrt(tau): the prior's spread of mu at small tau stays in range
        mu = m0 + u / math.sqrt(tau)
        log_prior = (
            a0 * math.log(b0)
            - math.lgamma(a0)
            + (a0 - 1) * math.log(tau)
            - b0 * tau
            + 0.5 * math.log(c0 / (2 * math.pi))
            - 0.5 * c0 * u * u
        )
        log_lik = w * (
            0.5 * x.size * math.log(tau / (2 * math.pi)) - 0.5 * tau * ((x - mu) ** 2).sum()
        )
        return math.exp(log_prior + log_lik)

    ref, _err = integrate.dblquad(integrand, 0.0, 60.0, -40.0, 40.0, epsabs=1e-13, epsrel=1e-11)
    X = x[:, None]
    z = np.zeros(3, dtype=np.int64)
    scratch = np.empty(ng.n_stats)
    got = {}
    for name, fam in (("ng", ng), ("nw", nw)):
        s = fam.stats_of(X, z, 1)[0]
        got[name] = kihmm.tempered_log_marginal(s, np.empty(fam.n_stats), fam.spec, fam.prior, w)
        assert got[name] == pytest.approx(math.log(ref), abs=1e-9)
    assert got["nw"] == pytest.approx(got["ng"], abs=1e-10)
    # the chain of tempered predictives, record by record
    s = np.zeros(ng.n_stats)
    chain = 0.0
    for i in range(3):
        lm = kihmm.tempered_log_marginal(s, scratch, ng.spec, ng.prior, w)
        xi = x[i : i + 1]
        chain += kihmm.tempered_log_predictive(xi, s, lm, scratch, ng.spec, ng.prior, w)
        product.add_stats(xi, s, ng.spec, 1.0)
    assert chain == pytest.approx(got["ng"], abs=1e-10)
    # w = 1: the emission matrix of the caches
    rng = np.random.default_rng(2)
    Xr = rng.normal(size=(30, 2))
    fam = FAMILIES["gaussian"](Xr)
    zr = rng.integers(0, 3, size=30)
    stats = fam.stats_of(Xr, zr, 3)
    plain = kihmm.emission_matrix(
        Xr, stats, fam.cache_of(stats), fam.spec, fam.prior, fam.empty_cache()
    )
    tempered = kihmm.emission_matrix_tempered(Xr, stats, fam.spec, fam.prior, 1.0)
    np.testing.assert_allclose(tempered, plain, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("w", [0.3, 0.7])
@pytest.mark.parametrize("data", ["continuous", "grid"])
def test_tempered_emissions_equal_the_ratio_of_tempered_marginals(data, w):
    """``emission_matrix_tempered`` entry by entry against log p(w (S_k + g(x))) - log p(w S_k)
    of the generic kernels: on continuous columns it reads the caches of the weighted statistics
    (``gaussian_nw.tempered_log_predictive``, a rank-one change), on a grid the cells keep the
    ratio of marginals; 4 states, one empty, and the new-state column."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.3], [0.0, 0.0, 2.0]])
    if data == "grid":
        X = np.round(X * 2.0) / 2.0
    fam = GaussianNW.empirical_bayes(X).as_product()
    assert bool(fam.groups[0][0].has_cells) == (data == "grid")
    z = rng.integers(0, 3, size=40)
    stats = np.concatenate([fam.stats_of(X, z, 3), np.zeros((1, fam.n_stats))])
    got = kihmm.emission_matrix_tempered(X, stats, fam.spec, fam.prior, w)
    scratch = np.empty(fam.n_stats)
    want = np.empty((40, 5))
    for k in range(5):
        s = stats[k] if k < 4 else np.zeros(fam.n_stats)
        lm = kihmm.tempered_log_marginal(s, scratch, fam.spec, fam.prior, w) if s[0] else 0.0
        for t in range(40):
            want[t, k] = kihmm.tempered_log_predictive(X[t], s, lm, scratch, fam.spec, fam.prior, w)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("w", [0.25, 0.6])
def test_tempered_sweep_of_one_gaussian_group_equals_the_generic_one(w):
    """A tempered sweep of one full-covariance group keeps each state's weighted statistics and
    their cache (rank-one changes); the same family on an int64 spec takes the generic path
    (ratios of log marginals): the same moves, states and statistics, from a start of 3 states
    that leaves states to open and to empty."""
    rng = np.random.default_rng(8)
    X = np.concatenate([rng.normal(m, 1.0, (40, 3)) for m in (-4.0, 0.0, 4.0)])
    X = X @ np.array([[1.0, 0.4, 0.0], [0.0, 1.0, 0.2], [0.0, 0.0, 3.0]])
    starts = np.array([0, 50, 120], dtype=np.int64)
    fam = GaussianNW.empirical_bayes(X).as_product()
    assert fam.spec.dtype == np.int32
    generic = GaussianNW.empirical_bayes(X).as_product()
    generic.spec = generic.spec.astype(np.int64)
    out = []
    for f in (fam, generic):
        z = np.random.default_rng(3).permutation(np.arange(120) % 3).astype(np.int64)
        st = state_from_labels(X, z, starts, 3, f, np.full(3, 0.3), 0.1)
        moved = []
        for _ in range(3):
            st, n = sweep_state(X, starts, z, st, f, 1.3, 2.0, False, np.array([1], np.uint64), w)
            moved.append(n)
        out.append((z.copy(), st, moved))
    (z1, st1, m1), (z2, st2, m2) = out
    assert m1 == m2 and m1[0] > 0
    np.testing.assert_array_equal(z1, z2)
    np.testing.assert_allclose(st1.stats, st2.stats, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(st1.trans, st2.trans)
