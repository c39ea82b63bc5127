"""Tree-guided MCMC (Lee and Choi 2015): partition priors, IBHC trees, and the exactness of every
sampler.

The samplers are checked against the exact posterior over all set partitions of a few leaves,
computed here by enumeration with the slow references of ``tests/reference.py`` (Normal-Wishart
marginal likelihood from the member records, CRP formula) and, for the NGGP, by integrating
Theorem 1's joint (Lee and Choi 2015, eq. 4) over u with ``scipy.integrate.quad``. A chain whose
transition probabilities are wrong visits partitions with the wrong frequencies: a copy of the
global moves using the paper's one-pick forward merge probability reached TV = 0.11, and local
moves chosen through the trees but not corrected reached TV = 0.47, against < 0.05 here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.signal import lfilter
from scipy.special import gammaln, logsumexp
from sklearn.metrics import adjusted_rand_score

from kernels import alloc as priors
from kernels import ibhc as ibhc_kernels
from kernels import tgmcmc as tg_kernels
from kernels.alloc import crp, nggp
from pipeline.estimators.tgmcmc import TreeGuidedMCMC
from pipeline.families import GaussianNW
from pipeline.models.ibhc import leaf_log_marginals, prior_array, run_ibhc
from pipeline.models.tgmcmc import coclustering, effective_sample_size
from tests.reference import log_crp, nw_log_marginal
from tests.tgmcmc_wall import fit_for
from tests.tree_invariants import check_state, check_tree

TV_MAX = 0.05


# -------------------------------------------------------------------------------------------------
# references


def set_partitions(m: int) -> list[tuple[int, ...]]:
    """Every set partition of m items as a restricted growth string (Bell(m) of them)."""
    out: list[tuple[int, ...]] = []

    def rec(i: int, a: list[int], k: int) -> None:
        if i == m:
            out.append(tuple(a))
            return
        for b in range(k + 1):
            a.append(b)
            rec(i + 1, a, max(k, b + 1))
            a.pop()

    rec(0, [], 0)
    return out


def nggp_log_eppf_quad(sizes: list[float], alpha: float, sigma: float) -> float:
    """log of int_0^inf u^(n-1) e^(-psi(u)) / Gamma(n) prod_c kappa(|c|, u) du (eqs. 4-5) by quad,
    over t = log u, with kappa(m, u) = alpha Gamma(m - sigma) / Gamma(1 - sigma) (1 + u)^(sigma - m)
    and psi(u) = alpha / sigma ((1 + u)^sigma - 1)."""
    n = float(sum(sizes))
    K = len(sizes)
    const = sum(
        math.log(alpha) + gammaln(m - sigma) - gammaln(1.0 - sigma) for m in sizes
    ) - gammaln(n)

    def g(t: float) -> float:
        L = np.logaddexp(0.0, t)
        return n * t - alpha / sigma * math.expm1(sigma * L) + (K * sigma - n) * L

    ts = np.linspace(-40.0, 40.0, 8001)
    gs = np.array([g(t) for t in ts])
    t0 = float(ts[np.argmax(gs)])
    gmax = float(gs.max())
    val, _ = quad(lambda t: math.exp(g(t) - gmax), t0 - 40.0, t0 + 40.0, points=[t0], limit=400,
                  epsabs=0.0, epsrel=1e-12)  # fmt: skip
    return const + gmax + math.log(val)


def log_eppf_reference(sizes: list[float], prior: str, alpha: float, sigma: float) -> float:
    if prior == "dp":
        return log_crp(sizes, alpha)
    return nggp_log_eppf_quad(sizes, alpha, sigma)


def exact_posterior(
    leaves: list[np.ndarray], fam: GaussianNW, prior: str, alpha: float, sigma: float
) -> tuple[dict[tuple[int, ...], int], np.ndarray]:
    """Posterior over the partitions of the leaves, each leaf a (n_i, d) array of records."""
    parts = set_partitions(len(leaves))
    logp = np.empty(len(parts))
    eppf_cache: dict[tuple[float, ...], float] = {}
    for p, a in enumerate(parts):
        K = max(a) + 1
        blocks = [np.vstack([leaves[i] for i in range(len(a)) if a[i] == k]) for k in range(K)]
        sizes = tuple(sorted(float(b.shape[0]) for b in blocks))
        if sizes not in eppf_cache:
            eppf_cache[sizes] = log_eppf_reference(list(sizes), prior, alpha, sigma)
        logp[p] = eppf_cache[sizes] + sum(
            nw_log_marginal(b, fam.m0, fam.c0, fam.B0, fam.a0) for b in blocks
        )
    probs = np.exp(logp - logsumexp(logp))
    return {a: p for p, a in enumerate(parts)}, probs


def tv_distance(samples: np.ndarray, index: dict[tuple[int, ...], int], probs: np.ndarray) -> float:
    freq = np.zeros_like(probs)
    for row, c in Counter(map(tuple, samples)).items():
        freq[index[row]] += c
    freq /= freq.sum()
    return 0.5 * float(np.abs(freq - probs).sum())


# -------------------------------------------------------------------------------------------------
# the two small problems: five 1-D records, and five 2-D leaves two of which summarise two records


def records_1d() -> tuple[list[np.ndarray], GaussianNW]:
    x = [-1.0, -0.8, 0.1, 0.9, 1.2]
    return [np.array([[v]]) for v in x], GaussianNW(m0=[0.0], c0=0.5, B0=[[4.0]], a0=2.0)


def summaries_2d() -> tuple[list[np.ndarray], GaussianNW]:
    leaves = [
        np.array([[0.0, 0.1]]),
        np.array([[0.3, -0.2], [0.1, 0.2]]),
        np.array([[1.2, 1.0]]),
        np.array([[1.0, 1.4], [1.5, 1.1]]),
        np.array([[0.7, 0.5]]),
    ]
    fam = GaussianNW(m0=[0.6, 0.6], c0=0.5, B0=np.eye(2) * 3.0, a0=3.0)
    return leaves, fam


def leaf_stats(leaves: list[np.ndarray], fam: GaussianNW) -> np.ndarray:
    prod = fam.as_product()
    X = np.vstack(leaves)
    owner = np.concatenate([np.full(len(b), i) for i, b in enumerate(leaves)]).astype(np.int64)
    return prod.stats_of(prod.arrange(X), owner, len(leaves))


PRIORS = {"dp": (1.0, 0.0), "nggp": (1.0, 0.4)}

# (method, moves, n_iter, extra parameters): enough iterations for TV < 0.05, small G to stay fast.
# The tgMCMC variants cover each move type alone and every option that changes a transition
# probability: tree kind, d between clusters, SeqInsert depth, two-way splits, fixed order.
SAMPLERS = {
    "tgmcmc": ("tgmcmc", "all", 10000, {"G": 5, "n_local": 3}),
    "tgmcmc-global": ("tgmcmc", "global", 25000, {"G": 5}),
    "tgmcmc-global-depth1": ("tgmcmc", "global", 25000, {"G": 5, "max_depth": 1}),
    "tgmcmc-global-cascade-dh": (
        "tgmcmc",
        "global",
        25000,
        {"G": 5, "tree": "cascade", "dissimilarity": "hypothesis"},
    ),
    "tgmcmc-global-2way-fixed": (
        "tgmcmc",
        "global",
        25000,
        {"G": 5, "split_new": False, "redraw": False},
    ),
    "tgmcmc-local-tree": ("tgmcmc", "local", 12000, {"n_local": 6, "local": "tree"}),
    "tgmcmc-local-uniform": ("tgmcmc", "local", 12000, {"n_local": 6, "local": "uniform"}),
    "gibbs": ("gibbs", "all", 15000, {}),
    "split-merge": ("split-merge", "all", 12000, {"G": 3, "n_launch": 2}),
    "split-merge-global": ("split-merge", "global", 12000, {"G": 3, "n_launch": 2}),
}


def run_sampler(name: str, prior: str, stats: np.ndarray, fam: GaussianNW, seed: int = 7):
    method, moves, n_iter, extra = SAMPLERS[name]
    alpha, sigma = PRIORS[prior]
    est = TreeGuidedMCMC(
        prior=prior, alpha=alpha, sigma=sigma, family=fam, method=method, moves=moves,
        n_iter=n_iter, burn_in=200, init="one", random_state=seed, **extra,
    )  # fmt: skip
    return est.fit_summaries(stats)


# -------------------------------------------------------------------------------------------------
# priors


def log_eppf(sizes: np.ndarray, K: int, pp: np.ndarray) -> float:
    """log EPPF of a partition with these block sizes: the CRP's, or for the NGGP eq. 4 with u
    integrated out, sum_c log kappa(|c|, 0) + ``nggp.log_u_integral``."""
    if pp[0] == priors.DP:
        return float(crp.log_eppf(sizes, K, pp[1]))
    lk = sum(nggp.log_kappa(sizes[k], 0.0, pp[1], pp[2]) for k in range(K))
    return lk + float(nggp.log_u_integral(float(sizes[:K].sum()), float(K), pp[1], pp[2]))


def test_dp_log_eppf_is_the_crp() -> None:
    pp = prior_array("dp", 1.7, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = rng.integers(1, 30, size=rng.integers(1, 6)).astype(float)
        got = log_eppf(sizes, sizes.shape[0], pp)
        assert got == pytest.approx(log_crp(sizes, 1.7), abs=1e-10)


@pytest.mark.parametrize("sizes", [[1.0], [2.0, 3.0], [1.0, 1.0, 1.0, 4.0], [40.0, 7.0, 3.0]])
@pytest.mark.parametrize(("alpha", "sigma"), [(1.0, 0.4), (3.0, 0.1), (0.5, 0.8)])
def test_nggp_log_eppf_against_quad(sizes: list[float], alpha: float, sigma: float) -> None:
    pp = prior_array("nggp", alpha, sigma)
    got = log_eppf(np.array(sizes), len(sizes), pp)
    assert got == pytest.approx(nggp_log_eppf_quad(sizes, alpha, sigma), abs=1e-8)


@pytest.mark.parametrize("prior", ["dp", "nggp"])
def test_eppf_sums_to_one_over_partitions_of_five(prior: str) -> None:
    pp = prior_array(prior, 1.3, 0.35)
    total = []
    for a in set_partitions(5):
        K = max(a) + 1
        sizes = np.array([float(a.count(k)) for k in range(K)])
        total.append(log_eppf(sizes, K, pp))
    assert math.exp(logsumexp(total)) == pytest.approx(1.0, abs=1e-10)


def test_nggp_kappa_and_psi_against_quad() -> None:
    """kappa(n, u) = int w^n e^(-uw) rho(dw) and psi(u) = int (1 - e^(-uw)) rho(dw) (eq. 5)."""
    alpha, sigma = 1.5, 0.4
    pp = prior_array("nggp", alpha, sigma)

    def rho(w: float) -> float:
        return alpha / math.gamma(1.0 - sigma) * w ** (-1.0 - sigma) * math.exp(-w)

    for u in (0.3, 4.0):
        for n in (1, 3):
            k, _ = quad(
                lambda w, n=n, u=u: w**n * math.exp(-u * w) * rho(w), 0.0, np.inf, limit=200
            )
            assert priors.log_kappa(float(n), u, pp) == pytest.approx(math.log(k), abs=1e-7)
        p1, _ = quad(lambda w, u=u: -math.expm1(-u * w) * rho(w), 0.0, 1.0, limit=200)
        p2, _ = quad(lambda w, u=u: -math.expm1(-u * w) * rho(w), 1.0, np.inf, limit=200)
        assert nggp.psi(u, alpha, sigma) == pytest.approx(p1 + p2, rel=1e-7)


# -------------------------------------------------------------------------------------------------
# exactness: visited-partition frequencies against the enumerated posterior


# records: every sampler; summaries (leaves summarising two records are atomic blocks of size 2
# in the EPPF): the tree-guided samplers and the reference samplers
EXACTNESS_CASES = [("records", name) for name in SAMPLERS] + [
    ("summaries", name)
    for name in ["tgmcmc", "tgmcmc-local-tree", "tgmcmc-local-uniform", "gibbs", "split-merge"]
]


@pytest.mark.parametrize("prior", ["dp", "nggp"])
@pytest.mark.parametrize(("data", "name"), EXACTNESS_CASES)
def test_sampler_matches_exact_posterior(data: str, name: str, prior: str) -> None:
    leaves, fam = records_1d() if data == "records" else summaries_2d()
    alpha, sigma = PRIORS[prior]
    index, probs = exact_posterior(leaves, fam, prior, alpha, sigma)
    est = run_sampler(name, prior, leaf_stats(leaves, fam), fam)
    tv = tv_distance(est.samples_, index, probs)
    assert tv < TV_MAX, f"{name}/{prior}: TV = {tv:.4f}"


def test_log_joint_trace_matches_reference() -> None:
    """log_joint_marginal_ of a kept sample = log EPPF + sum of log marginals, by the references."""
    leaves, fam = summaries_2d()
    for prior in ("dp", "nggp"):
        est = run_sampler("tgmcmc", prior, leaf_stats(leaves, fam), fam)
        alpha, sigma = PRIORS[prior]
        last = est.samples_[-1]
        K = int(last.max()) + 1
        blocks = [
            np.vstack([leaves[i] for i in range(len(last)) if last[i] == k]) for k in range(K)
        ]
        ref = log_eppf_reference([float(len(b)) for b in blocks], prior, alpha, sigma) + sum(
            nw_log_marginal(b, fam.m0, fam.c0, fam.B0, fam.a0) for b in blocks
        )
        assert est.log_joint_marginal_[-1] == pytest.approx(ref, abs=1e-7)


# -------------------------------------------------------------------------------------------------
# IBHC trees and the chain's trees


def blobs(seed: int, n: int = 90, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0], [6.0, 6.0]])[:k]
    y = rng.integers(k, size=n)
    return centers[y] + rng.normal(scale=0.6, size=(n, 2)), y


def blob_family(X: np.ndarray) -> GaussianNW:
    return GaussianNW(m0=X.mean(axis=0), c0=0.1, B0=np.eye(2) / (0.5 * 4.0), a0=4.0)


@pytest.mark.parametrize("prior", ["dp", "nggp"])
@pytest.mark.parametrize("mode", ["ibhc", "no-split", "top"])
def test_ibhc_tree_invariants(prior: str, mode: str) -> None:
    X, y = blobs(1)
    fam = blob_family(X)
    prod = fam.as_product()
    st = prod.stats_of(prod.arrange(X), np.arange(len(X)), len(X))
    res = run_ibhc(st, fam, prior, 1.0, 0.5, mode=mode, random_state=3)
    tree = res.tree
    L = len(X)
    # every leaf appears exactly once, as node i, and every node reaches a root
    assert np.all(tree["n_leaves_below"][:L] == 1)
    assert np.all(tree["left"][:L] == -1)
    internal = tree[L:]
    children = np.concatenate([internal["left"], internal["right"]])
    assert np.array_equal(np.sort(children[children < L]), np.arange(L)[tree["parent"][:L] >= 0])
    assert len(np.unique(children)) == len(children)
    roots = np.flatnonzero(tree["parent"] < 0)
    assert len(roots) == res.labels.max() + 1
    np.testing.assert_array_equal(tree.roots, roots)
    # the same table format as BHC's: statistics beside it, a pandas view of its fields
    np.testing.assert_allclose(tree.stats[tree.roots].sum(axis=0), st.sum(axis=0), rtol=1e-9)
    assert list(tree.to_pandas().columns) == list(tree.fields)
    assert {"node", "parent", "left", "right", "n", "log_d", "log_phi"} <= set(tree.fields)
    assert tree["n_leaves_below"][roots].sum() == L
    # counts add up, potentials follow eqs. 8-9
    pp = prior_array(prior, 1.0, 0.5)
    for j in range(L, len(tree)):
        lc, rc = tree["left"][j], tree["right"][j]
        assert tree["parent"][lc] == j and tree["parent"][rc] == j
        assert tree["n"][j] == tree["n"][lc] + tree["n"][rc]
        assert tree["n_leaves_below"][j] == tree["n_leaves_below"][lc] + tree["n_leaves_below"][rc]
        prod_lr = tree["log_phi"][lc] + tree["log_phi"][rc]
        log_h = prod_lr - tree["log_d"][j]
        assert tree["log_phi"][j] == pytest.approx(np.logaddexp(log_h, prod_lr), abs=1e-8)
        assert log_h == pytest.approx(
            priors.log_kappa(tree["n"][j], res.u, pp) + _log_marginal_of(j, tree, X, fam, L),
            abs=1e-7,
        )
    if mode == "ibhc":
        assert adjusted_rand_score(y, res.labels) > 0.9


def _log_marginal_of(j: int, tree: Any, X: np.ndarray, fam: GaussianNW, L: int) -> float:
    stack, members = [j], []
    while stack:
        v = stack.pop()
        if v < L:
            members.append(v)
        else:
            stack += [tree["left"][v], tree["right"][v]]
    return nw_log_marginal(X[members], fam.m0, fam.c0, fam.B0, fam.a0)


def test_ibhc_kernel_statistics_are_sums_of_children() -> None:
    X, _ = blobs(2, n=60)
    fam = blob_family(X)
    prod = fam.as_product()
    st = prod.stats_of(prod.arrange(X), np.arange(len(X)), len(X))
    lm = leaf_log_marginals(st, prod)
    pp = prior_array("nggp", 1.0, 0.5)
    order = np.random.default_rng(0).permutation(len(X)).astype(np.int64)
    ni, nf, fst, _free, _meta, roots = ibhc_kernels.ibhc(
        st, lm, order, 30.0, pp, prod.spec, prod.prior, ibhc_kernels.SEQ_SPLIT, 4 * len(X)
    )
    work = np.empty(4 * len(X) + 8, dtype=np.int64)
    for r in roots:
        assert check_tree(r, ni, nf, fst, 30.0, pp, prod.spec, prod.prior, work, 1e-9) == 0
    z = ibhc_kernels.forest_labels(roots, ni, len(X))
    assert np.all(z >= 0)


@pytest.mark.parametrize("prior", ["dp", "nggp"])
def test_chain_trees_stay_consistent(prior: str) -> None:
    """After many moves every cluster's tree holds its leaves once, with consistent statistics."""
    X, y = blobs(4, n=80, k=4)
    fam = blob_family(X)
    est = TreeGuidedMCMC(prior=prior, family=fam, n_iter=30, burn_in=10, G=20, init="top",
                         random_state=1).fit(X)  # fmt: skip
    ch = est._chain
    assert check_state(ch.C, ch.F, ch.P, float(ch.fu[0])) == 0
    assert adjusted_rand_score(y, est.labels_) > 0.9
    assert est.acceptance_rate_["split"] >= 0.0


# -------------------------------------------------------------------------------------------------
# the estimator


def test_estimator_attributes_and_reproducibility() -> None:
    X, _ = blobs(5, n=40)
    fam = blob_family(X)
    kw = dict(prior="nggp", family=fam, n_iter=25, burn_in=5, thin=2, G=5, random_state=11)
    a = TreeGuidedMCMC(**kw).fit(X)
    b = TreeGuidedMCMC(**kw).fit(X)
    np.testing.assert_array_equal(a.samples_, b.samples_)
    np.testing.assert_array_equal(a.log_joint_, b.log_joint_)
    assert a.samples_.shape == (10, 40)
    assert a.log_joint_.shape == a.n_clusters_trace_.shape == (25,)
    assert set(a.acceptance_rate_) == {"split", "merge", "local"}
    assert a.coclustering_.shape == (40, 40)
    np.testing.assert_allclose(a.coclustering_, a.coclustering_.T)
    assert np.all(np.diag(a.coclustering_) == 1.0)
    assert 0.0 < a.ess_n_clusters_ <= 10 * 10
    assert a.labels_.shape == (40,)
    assert np.all(np.isfinite(a.log_joint_marginal_))


def test_fit_equals_fit_summaries_of_single_records() -> None:
    X, _ = blobs(6, n=30)
    fam = blob_family(X)
    prod = fam.as_product()
    st = prod.stats_of(prod.arrange(X), np.arange(30), 30)
    for method in ("tgmcmc", "gibbs", "split-merge"):
        kw = dict(family=fam, method=method, n_iter=8, burn_in=2, random_state=4)
        a = TreeGuidedMCMC(**kw).fit(X)
        b = TreeGuidedMCMC(**kw).fit_summaries(st)
        np.testing.assert_array_equal(a.samples_, b.samples_)


def test_fit_for_records_wall_time_trace() -> None:
    X, _ = blobs(7, n=50)
    est = TreeGuidedMCMC(family=blob_family(X), method="gibbs", burn_in=0, random_state=0)
    fit_for(est, 0.2, X)
    trace = est.wall_trace_
    assert trace.shape[1] == 2 and trace.shape[0] >= 1
    assert np.all(np.diff(trace[:, 0]) >= 0)
    assert trace[-1, 0] >= 0.2
    assert est.samples_.shape[0] == trace.shape[0]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"prior": "py"}, "prior"),
        ({"prior": "nggp", "sigma": 1.0}, "sigma"),
        ({"alpha": 0.0}, "alpha"),
        ({"method": "slice"}, "method"),
        ({"method": "gibbs", "moves": "local"}, "moves"),
        ({"burn_in": 10, "n_iter": 10}, "burn_in"),
        ({"init": "kmeans"}, "init"),
    ],
)
def test_validation(kw: dict, match: str) -> None:
    X, _ = blobs(8, n=10)
    with pytest.raises(ValueError, match=match):
        TreeGuidedMCMC(family=blob_family(X), **kw).fit(X)


def test_fit_summaries_rejects_bad_stats() -> None:
    X, _ = blobs(8, n=10)
    fam = blob_family(X)
    with pytest.raises(ValueError, match="shape"):
        TreeGuidedMCMC(family=fam).fit_summaries(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="record"):
        TreeGuidedMCMC(family=fam).fit_summaries(np.zeros((3, fam.as_product().n_stats)))


# -------------------------------------------------------------------------------------------------
# summaries of a chain


def test_effective_sample_size() -> None:
    """iid draws: ESS ~ n; AR(1), phi = 0.9: ESS ~ n (1 - phi) / (1 + phi) (mean of 5 chains)."""
    rng = np.random.default_rng(0)
    assert effective_sample_size(rng.normal(size=20000)) == pytest.approx(20000, rel=0.1)
    phi, n = 0.9, 50000
    ess = [
        effective_sample_size(lfilter([1.0], [1.0, -phi], np.random.default_rng(s).normal(size=n)))
        for s in range(5)
    ]
    assert np.mean(ess) == pytest.approx(n * (1 - phi) / (1 + phi), rel=0.1)
    assert effective_sample_size(np.ones(100)) == 100.0


def test_coclustering_against_brute_force() -> None:
    rng = np.random.default_rng(1)
    samples = rng.integers(0, 3, size=(50, 7))
    brute = np.mean([(s[:, None] == s[None, :]) for s in samples], axis=0)
    np.testing.assert_allclose(coclustering(samples), brute, atol=1e-12)


def test_local_selection_probabilities_sum_to_one() -> None:
    """w_i of the local moves (D rounds of SampleSub, then a uniform leaf) is a distribution."""
    X, _ = blobs(9, n=25)
    fam = blob_family(X)
    prod = fam.as_product()
    st = prod.stats_of(prod.arrange(X), np.arange(25), 25)
    lm = leaf_log_marginals(st, prod)
    pp = prior_array("nggp", 1.0, 0.5)
    F, C = tg_kernels.init_chain(st, lm, np.zeros(25, dtype=np.int64), prod.spec, prod.prior)
    W = tg_kernels.make_workspace(25, F[0].shape[0], st.shape[1])
    P = (st, lm, np.arange(25, dtype=np.int64), pp, prod.spec, prod.prior)
    for kind in (tg_kernels.CASCADE, tg_kernels.SEQINSERT):
        cfg = np.array([2, 6, 1, kind], dtype=np.int64)
        root = tg_kernels.ensure_tree(0, C, F, W, P, 3.0, cfg)
        lnode = C[7]
        for D in (0, 1, 2, 3):
            total = sum(math.exp(tg_kernels.log_select(root, lnode[i], D, F, W)) for i in range(25))
            assert total == pytest.approx(1.0, abs=1e-10)
        assert check_state(C, F, P, 3.0) == 0
        tg_kernels._drop_tree(0, C, F, W)
