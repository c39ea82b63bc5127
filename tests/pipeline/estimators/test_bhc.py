"""BHC, its bounds, Bayes K-means BHC and the exact DPM marginal (Xu et al. 2009).

References, each at a stated tolerance:
- eq. 5 by explicit partitions written out by hand (3 leaves) or by a recursive set-partition
  generator (4 leaves), in probability space with math.gamma: 1e-10 in log;
- eq. 9 <= Theorem 1 <= eq. 5 on 50 random data sets, equality of Theorem 1 and eq. 5 at three
  leaves (Section 6.2: "For 3 points, the alternative tree algorithm sums over all partitions"):
  1e-9 in log;
- r_k, d_k, pi_k, p(D_k | T_k) against a slow pure-Python BHC in probability space: 1e-9;
- a two-summary tree worked by hand (d = alpha Gamma(n), pi = 1 at the leaves): 1e-12;
- partitions of well-separated blobs: NMI = ARI = 1;
- the predictive density integrates to one in 1-D: 1e-3.
"""

from __future__ import annotations

import math
from itertools import combinations, pairwise

import numpy as np
import pytest
from scipy.cluster.hierarchy import dendrogram, is_monotonic, is_valid_linkage
from scipy.special import logsumexp
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from kernels import bhc as kbhc
from pipeline.estimators.bhc import BHC
from pipeline.families import GaussianNW, ProductFamily
from pipeline.models.exact import exact_log_marginal, restricted_growth_strings
from tests.reference import dpm_log_joint

# -- helpers -------------------------------------------------------------------------------


def gaussian(X: np.ndarray) -> ProductFamily:
    return GaussianNW.empirical_bayes(X).as_product()


def blobs(n_per: int = 20, sd: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    y = np.repeat(np.arange(3), n_per)
    return centres[y] + sd * rng.normal(size=(y.size, 2)), y


def one_record_stats(X: np.ndarray, fam: ProductFamily) -> np.ndarray:
    Xa = fam.arrange(X)
    return fam.stats_of(Xa, np.arange(len(X)), len(X))


def set_partitions(items: list[int]) -> list[list[list[int]]]:
    """Every set partition, by inserting the first item into each block of the rest's."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for p in set_partitions(rest):
        out.append([[first], *p])
        for b in range(len(p)):
            out.append([*p[:b], [first, *p[b]], *p[b + 1 :]])
    return out


def brute_force_log_marginal(X: np.ndarray, fam: ProductFamily, alpha: float, partitions) -> float:
    """Eq. 5 in probability space: sum_v alpha^m prod Gamma(n_l) Gamma(alpha)/Gamma(n+alpha)
    prod p(D_l)."""
    n = len(X)
    total = 0.0
    for v in partitions:
        term = alpha ** len(v) * math.gamma(alpha) / math.gamma(n + alpha)
        for block in v:
            term *= math.gamma(len(block)) * math.exp(fam.log_marginal(X[block]))
        total += term
    return math.log(total)


def slow_bhc(X: np.ndarray, fam: ProductFamily, alpha: float) -> list[dict]:
    """Heller & Ghahramani's greedy BHC written directly from eqs. 6-8, in probability space."""
    nodes = {(i,): {"d": alpha, "p": math.exp(fam.log_marginal(X[[i]]))} for i in range(len(X))}
    merges = []
    while len(nodes) > 1:
        best = None
        for a, b in combinations(sorted(nodes), 2):
            k = tuple(sorted(a + b))
            nk = len(k)
            d = alpha * math.gamma(nk) + nodes[a]["d"] * nodes[b]["d"]
            pi = alpha * math.gamma(nk) / d
            ph1 = math.exp(fam.log_marginal(X[list(k)]))
            p = pi * ph1 + (1 - pi) * nodes[a]["p"] * nodes[b]["p"]
            r = pi * ph1 / p
            if best is None or r > best["r"]:
                best = {"a": a, "b": b, "k": k, "d": d, "pi": pi, "p": p, "r": r, "ph1": ph1}
        del nodes[best["a"]], nodes[best["b"]]
        nodes[best["k"]] = {"d": best["d"], "p": best["p"]}
        merges.append(best)
    return merges


def leaves_below(tree, k: int) -> tuple[int, ...]:
    if tree.left[k] < 0:
        return (k,)
    return tuple(sorted(leaves_below(tree, tree.left[k]) + leaves_below(tree, tree.right[k])))


# -- the exact marginal (eq. 5) --------------------------------------------------------------


def test_restricted_growth_strings_are_the_set_partitions():
    for m in range(1, 8):
        rgs = restricted_growth_strings(m)
        as_sets = {
            frozenset(frozenset(np.flatnonzero(row == b)) for b in range(m) if np.any(row == b))
            for row in rgs
        }
        by_insertion = {frozenset(frozenset(b) for b in p) for p in set_partitions(list(range(m)))}
        assert len(as_sets) == len(rgs) == len(by_insertion)
        assert as_sets == by_insertion


@pytest.mark.parametrize("alpha", [0.3, 1.0, 4.0])
def test_exact_three_records_matches_the_five_partitions(alpha):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 2))
    fam = gaussian(X)
    five = [
        [[0, 1, 2]],
        [[0, 1], [2]],
        [[0, 2], [1]],
        [[1, 2], [0]],
        [[0], [1], [2]],
    ]
    ref = brute_force_log_marginal(X, fam, alpha, five)
    assert exact_log_marginal(X, alpha, fam) == pytest.approx(ref, abs=1e-10)


def test_exact_four_records_matches_recursive_enumeration():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(4, 1))
    fam = gaussian(X)
    parts = set_partitions([0, 1, 2, 3])
    assert len(parts) == 15
    ref = brute_force_log_marginal(X, fam, 1.5, parts)
    assert exact_log_marginal(X, 1.5, fam) == pytest.approx(ref, abs=1e-10)
    # the default family is the same empirical-Bayes Gaussian
    assert exact_log_marginal(X, 1.5) == pytest.approx(ref, abs=1e-10)


def test_exact_over_summaries_keeps_each_summary_whole():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(6, 2))
    fam = gaussian(X)
    groups = [[0, 1, 2], [3], [4, 5]]
    z = np.zeros(6, dtype=np.int64)
    for g, rows in enumerate(groups):
        z[rows] = g
    stats = fam.stats_of(fam.arrange(X), z, 3)
    alpha = 0.7
    ref = []
    for v in set_partitions([0, 1, 2]):
        # a block of summaries is the union of their records: the sum of their rows
        records = [[i for g in b for i in groups[g]] for b in v]
        block_stats = np.stack([fam.stats_of(fam.arrange(X[r]))[0] for r in records])
        np.testing.assert_allclose(block_stats, np.stack([stats[b].sum(axis=0) for b in v]))
        ref.append(dpm_log_joint(block_stats, fam, alpha))
    assert exact_log_marginal(stats=stats, alpha=alpha, family=fam) == pytest.approx(
        float(logsumexp(ref)), abs=1e-10
    )
    # a restriction of eq. 5's sum: below the marginal over every partition of the records
    assert exact_log_marginal(stats=stats, alpha=alpha, family=fam) < exact_log_marginal(
        X, alpha, fam
    )


def test_exact_rejects_bad_input():
    X = np.random.default_rng(0).normal(size=(4, 2))
    fam = gaussian(X)
    with pytest.raises(ValueError, match="NaN"):
        exact_log_marginal(np.array([[0.0, np.nan], [1.0, 2.0]]), 1.0, fam)
    with pytest.raises(ValueError, match="limited to 12"):
        exact_log_marginal(np.zeros((13, 2)) + np.arange(13)[:, None], 1.0, fam)
    with pytest.raises(ValueError, match="alpha"):
        exact_log_marginal(X, -1.0, fam)
    with pytest.raises(ValueError, match="exactly one"):
        exact_log_marginal(X, 1.0, fam, stats=one_record_stats(X, fam))
    with pytest.raises(ValueError, match="columns"):
        exact_log_marginal(np.zeros((3, 3)), 1.0, fam)


# -- the bounds (eq. 9, Theorem 1) -----------------------------------------------------------


def test_bounds_are_ordered_on_random_small_data_sets():
    rng = np.random.default_rng(20090416)
    gaps = []
    for trial in range(50):
        n = int(rng.integers(3, 10))
        d = int(rng.integers(1, 3))
        if trial % 2:
            X = rng.normal(size=(n, d))
        else:  # two groups, as the paper's Sets I-II
            X = rng.normal(size=(n, d)) * 0.7 + 4.0 * rng.integers(0, 2, size=(n, 1))
        alpha = float(rng.choice([0.5, 1.0, 2.0]))
        fam = gaussian(X)
        m = BHC(alpha=alpha, family=fam).fit(X)
        exact = exact_log_marginal(X, alpha, fam)
        assert m.lower_bound_ <= m.alt_lower_bound_ + 1e-9
        assert m.alt_lower_bound_ <= exact + 1e-9
        # the path-only variant also bounds, between the two
        path, _ = m.alternative_bound(path_only=True)
        assert m.lower_bound_ - 1e-9 <= path <= m.alt_lower_bound_ + 1e-9
        if n == 3:
            assert m.alt_lower_bound_ == pytest.approx(exact, abs=1e-9)
        if n >= 4:
            gaps.append(exact - m.alt_lower_bound_)
    assert any(g > 1e-6 for g in gaps)  # beyond three leaves the bound is not trivially exact


def test_three_summaries_alternative_bound_is_exact():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(7, 2))
    fam = gaussian(X)
    z = np.array([0, 0, 1, 1, 1, 2, 2])
    stats = fam.stats_of(fam.arrange(X), z, 3)
    m = BHC(alpha=1.3, family=fam).fit_summaries(stats)
    exact = exact_log_marginal(stats=stats, alpha=1.3, family=fam)
    assert m.lower_bound_ < exact
    assert m.alt_lower_bound_ == pytest.approx(exact, abs=1e-9)


def test_alternative_start_node_validation_and_monotonicity():
    X, _ = blobs(n_per=4)
    m = BHC().fit(X)
    M = m.tree_.n_leaves
    with pytest.raises(ValueError, match="internal node"):
        m.alternative_bound(start=0)
    # starting later relocates at fewer nodes: the bound can only shrink
    bounds = [m.alternative_bound(start=s)[0] for s in range(M, 2 * M - 1)]
    assert all(b1 >= b2 - 1e-12 for b1, b2 in pairwise(bounds))
    assert bounds[0] == pytest.approx(m.alt_lower_bound_)
    assert bounds[-1] >= m.lower_bound_


# -- the BHC recursion (eqs. 7-8) ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bhc_matches_slow_reference(seed):
    rng = np.random.default_rng(100 + seed)
    X = rng.normal(size=(8, 2)) + 3.0 * rng.integers(0, 2, size=(8, 1))
    alpha = [0.5, 1.0, 3.0][seed]
    fam = gaussian(X)
    ref = slow_bhc(X, fam, alpha)
    m = BHC(alpha=alpha, family=fam).fit(X)
    tree = m.tree_
    M = tree.n_leaves
    for t, step in enumerate(ref):
        k = M + t
        assert leaves_below(tree, k) == step["k"]
        assert tree.n[k] == len(step["k"])
        assert tree.log_r[k] == pytest.approx(math.log(step["r"]), abs=1e-9)
        assert tree.log_d[k] == pytest.approx(math.log(step["d"]), abs=1e-9)
        assert tree.log_pi[k] == pytest.approx(math.log(step["pi"]), abs=1e-9)
        assert tree.log_p[k] == pytest.approx(math.log(step["p"]), abs=1e-9)
        assert tree.log_ph1[k] == pytest.approx(math.log(step["ph1"]), abs=1e-9)
    assert m.log_evidence_ == pytest.approx(math.log(ref[-1]["p"]), abs=1e-9)
    lb = math.log(ref[-1]["d"] * math.gamma(alpha) / math.gamma(8 + alpha) * ref[-1]["p"])
    assert m.lower_bound_ == pytest.approx(lb, abs=1e-9)


def test_two_summaries_by_hand():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(9, 2))
    fam = gaussian(X)
    z = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])
    stats = fam.stats_of(fam.arrange(X), z, 2)
    alpha = 0.8
    m = BHC(alpha=alpha, family=fam).fit_summaries(stats)
    n1, n2 = 4, 5
    p1 = fam.log_marginal(X[:4])
    p2 = fam.log_marginal(X[4:])
    ph1 = fam.log_marginal(X)
    d1, d2 = alpha * math.gamma(n1), alpha * math.gamma(n2)  # leaves: d = alpha Gamma(n)
    d = alpha * math.gamma(9) + d1 * d2
    pi = alpha * math.gamma(9) / d
    p = pi * math.exp(ph1) + (1 - pi) * math.exp(p1 + p2)  # leaves: pi = 1, p(D|T) = p(D|H1)
    tree = m.tree_
    assert list(tree.log_d[:2]) == pytest.approx([math.log(d1), math.log(d2)], abs=1e-12)
    assert list(tree.log_pi[:2]) == [0.0, 0.0]
    assert list(tree.log_p[:2]) == pytest.approx([p1, p2], abs=1e-12)
    assert tree.log_d[2] == pytest.approx(math.log(d), abs=1e-12)
    assert tree.log_pi[2] == pytest.approx(math.log(pi), abs=1e-12)
    assert m.log_evidence_ == pytest.approx(math.log(p), abs=1e-12)
    assert tree.log_r[2] == pytest.approx(math.log(pi) + ph1 - math.log(p), abs=1e-12)
    lb = math.log(d * math.gamma(alpha) / math.gamma(9 + alpha) * p)
    assert m.lower_bound_ == pytest.approx(lb, abs=1e-12)
    # with two leaves the tree holds both partitions: eq. 9 is the exact restricted marginal
    exact = exact_log_marginal(stats=stats, alpha=alpha, family=fam)
    assert m.lower_bound_ == pytest.approx(exact, abs=1e-12)
    assert m.alt_lower_bound_ == m.lower_bound_


def test_one_record_summaries_equal_records():
    X, _ = blobs(n_per=5, seed=3)
    fam = gaussian(X)
    a = BHC(family=fam).fit(X)
    b = BHC().fit_summaries(one_record_stats(X, fam), fam)
    np.testing.assert_array_equal(a.tree_.left, b.tree_.left)
    np.testing.assert_array_equal(a.tree_.right, b.tree_.right)
    np.testing.assert_allclose(a.tree_.log_p, b.tree_.log_p, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.labels_, b.labels_)


@pytest.mark.parametrize("n_top", [1, 2, 5])
def test_candidate_lists_do_not_change_the_tree(n_top):
    """Short lists force the rebuild path; the greedy tree must be the same."""
    rng = np.random.default_rng(6)
    X = np.concatenate([blobs(n_per=15, sd=1.5, seed=6)[0], rng.normal(size=(20, 2)) * 6])
    full = BHC(n_top=200).fit(X)
    short = BHC(n_top=n_top).fit(X)
    np.testing.assert_array_equal(full.tree_.left, short.tree_.left)
    np.testing.assert_array_equal(full.tree_.right, short.tree_.right)
    np.testing.assert_array_equal(full.tree_.log_r, short.tree_.log_r)


def test_parallel_and_serial_scoring_agree():
    """min_parallel=1 sends every pass through the threaded code; 2**62 through none; None
    (what ``BHC(parallel=False)`` passes) through none, with the threaded variants pruned at
    compile time (were they typed, ``n_act >= None`` would not compile)."""
    X = np.concatenate(
        [blobs(n_per=20, sd=1.0, seed=8)[0], np.random.default_rng(8).normal(size=(30, 2)) * 5]
    )
    fam = gaussian(X)
    stats = one_record_stats(X, fam)
    threaded = kbhc.bhc(stats, fam.spec, fam.prior, 0.0, 4, 1)
    serial = kbhc.bhc(stats, fam.spec, fam.prior, 0.0, 4, 2**62)
    pruned = kbhc.bhc(stats, fam.spec, fam.prior, 0.0, 4, None)
    for a, b, c in zip(threaded, serial, pruned):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    m1 = BHC(parallel=False).fit(X)
    m2 = BHC(parallel=True).fit(X)
    np.testing.assert_array_equal(m1.tree_.left, m2.tree_.left)
    assert m1.log_evidence_ == m2.log_evidence_


def test_tree_table_invariants_and_pandas_view():
    X, _ = blobs(n_per=6)
    m = BHC().fit(X)
    t = m.tree_
    M = t.n_leaves
    assert len(t) == 2 * M - 1 and t.root == 2 * M - 2
    internal = np.arange(M, 2 * M - 1)
    assert np.all(t.left[internal] < internal) and np.all(t.right[internal] < internal)
    assert np.all(t.n[internal] == t.n[t.left[internal]] + t.n[t.right[internal]])
    assert np.all(t.log_r <= 1e-15) and np.all(t.log_pi <= 1e-15)
    assert t.parent[t.root] == -1 and np.all(t.parent[:-1] > np.arange(2 * M - 2))
    # sum_k omega_k n_k = N: each record is in exactly one block of every partition
    assert float(np.sum(np.exp(t.log_omega) * t.n)) == pytest.approx(len(X), rel=1e-12)
    df = t.to_pandas()
    assert len(df) == 2 * M - 1
    assert {"node", "parent", "left", "right", "n", "log_r", "log_p"} <= set(df.columns)
    # one structured array underneath: columns by attribute or by name agree
    arr = t.to_numpy()
    assert arr.dtype.names == t.fields and arr.shape == (2 * M - 1,)
    np.testing.assert_array_equal(t["log_r"], t.log_r)
    np.testing.assert_allclose(t.stats[t.root], t.stats[:M].sum(axis=0), rtol=1e-12)
    with pytest.raises(AttributeError, match="no attribute or field 'bogus'"):
        _ = t.bogus


# -- partitions -----------------------------------------------------------------------------


def test_partition_of_separated_blobs():
    X, y = blobs(n_per=20)
    m = BHC().fit(X)
    assert m.n_clusters_ == 3
    assert normalized_mutual_info_score(y, m.labels_) == 1.0
    assert adjusted_rand_score(y, m.labels_) == 1.0
    # new records from the blobs go to their blob's cluster
    X_new, y_new = blobs(n_per=5, seed=9)
    assert adjusted_rand_score(y_new, m.predict(X_new)) == 1.0
    # the cut is at r = 0.5: the clusters' nodes have r > 0.5, their ancestors do not
    t = m.tree_
    assert np.all(t.log_r[m.cluster_nodes_] > math.log(0.5))
    for k in m.cluster_nodes_:
        a = t.parent[k]
        while a >= 0:
            assert t.log_r[a] <= math.log(0.5)
            a = t.parent[a]


def test_partition_of_blob_summaries():
    X, y = blobs(n_per=20, seed=7)
    fam = gaussian(X)
    # 12 summaries: each blob split in 4 groups of 5 records
    z = np.arange(len(X)) // 5
    stats = fam.stats_of(fam.arrange(X), z, 12)
    m = BHC(family=fam).fit_summaries(stats)
    y_sum = y[::5]
    assert adjusted_rand_score(y_sum, m.labels_) == 1.0


def test_linkage_for_scipy():
    X, _ = blobs(n_per=8)
    m = BHC().fit(X)
    for heights in ("cumulative", "order"):
        Z = m.tree_.linkage(heights=heights)
        assert Z.shape == (len(X) - 1, 4)
        assert is_valid_linkage(Z, throw=True)
        out = dendrogram(Z, no_plot=True)
        assert sorted(out["leaves"]) == list(range(len(X)))
    assert is_monotonic(m.tree_.linkage(heights="order"))
    Z = m.tree_.linkage()
    M = len(X)
    h = np.concatenate([np.zeros(M), Z[:, 2]])
    assert np.all(Z[:, 2] >= h[Z[:, 0].astype(int)]) and np.all(Z[:, 2] >= h[Z[:, 1].astype(int)])
    with pytest.raises(ValueError, match="heights"):
        m.tree_.linkage(heights="bogus")  # type: ignore[arg-type]


# -- Bayes K-means BHC (Section 5) -----------------------------------------------------------


def test_bayes_kmeans_bhc_close_to_bhc_on_blobs():
    X, y = blobs(n_per=30, seed=11)
    full = BHC().fit(X)
    fast = BHC(method="bayes-kmeans", random_state=0).fit(X)
    assert fast.tree_.n_leaves < len(X) // 4
    assert fast.leaf_groups_.shape == (len(X),)
    assert adjusted_rand_score(y, fast.labels_) == 1.0
    # stated tolerance: within 1% of |log p(D | T)| of BHC on records
    assert abs(fast.log_evidence_ - full.log_evidence_) < 0.01 * abs(full.log_evidence_)
    assert abs(fast.lower_bound_ - full.lower_bound_) < 0.01 * abs(full.lower_bound_)
    # Bayes K-means groups are whole summaries: its eq. 9 is a bound over fewer partitions
    assert fast.lower_bound_ <= fast.alt_lower_bound_ + 1e-9


def test_bayes_kmeans_is_reproducible_and_sweeps_run():
    X, _ = blobs(n_per=10, seed=12)
    a = BHC(method="bayes-kmeans", random_state=5).fit(X)
    b = BHC(method="bayes-kmeans", random_state=5).fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.log_evidence_ == b.log_evidence_
    c = BHC(method="bayes-kmeans", random_state=5, kmeans_sweeps=5, k_init=3).fit(X)
    assert c.labels_.shape == (len(X),)
    assert c.lower_bound_ <= c.alt_lower_bound_ + 1e-9


# -- the predictive density -----------------------------------------------------------------


def test_predictive_density_integrates_to_one_in_1d():
    rng = np.random.default_rng(13)
    X = np.concatenate([rng.normal(-3, 0.5, 12), rng.normal(3, 0.5, 12)])[:, None]
    m = BHC().fit(X)
    # x = tan(theta) maps the line to (-pi/2, pi/2); the Student-t tails make the integrand
    # vanish at both ends
    theta = np.linspace(-np.pi / 2, np.pi / 2, 40001)[1:-1]
    x = np.tan(theta)
    f = np.exp(m.score_samples(x[:, None])) / np.cos(theta) ** 2
    total = float(np.sum(f) * (theta[1] - theta[0]))
    assert total == pytest.approx(1.0, abs=1e-3)
    assert m.score(X) == pytest.approx(float(np.mean(m.score_samples(X))))


def test_predictive_density_of_a_single_leaf_is_the_dpm_predictive():
    rng = np.random.default_rng(14)
    X = rng.normal(size=(5, 2))
    fam = gaussian(X)
    stats = fam.stats_of(fam.arrange(X), np.zeros(5, dtype=np.int64), 1)
    m = BHC(alpha=2.0, family=fam).fit_summaries(stats)
    x = rng.normal(size=2)
    ref = np.logaddexp(
        math.log(5 / 7) + fam.log_predictive(x, X), math.log(2 / 7) + fam.log_predictive(x, X[:0])
    )
    assert m.score_samples(x[None, :])[0] == pytest.approx(ref, abs=1e-10)
    assert m.n_clusters_ == 1 and m.tree_.linkage().shape == (0, 4)


# -- input checks ---------------------------------------------------------------------------


def test_bad_input_raises_value_error():
    X, _ = blobs(n_per=3)
    with pytest.raises(ValueError, match="column 'x0': row 2 is inf"):
        BHC().fit(np.where(np.arange(X.size).reshape(X.shape) == 4, np.inf, X))
    with pytest.raises(ValueError, match="2-D"):
        BHC().fit(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="no rows"):
        BHC().fit(np.zeros((0, 2)))
    with pytest.raises(ValueError, match="method"):
        BHC(method="kmeans").fit(X)
    with pytest.raises(ValueError, match="alpha"):
        BHC(alpha=0.0).fit(X)
    with pytest.raises(ValueError, match="unknown family"):
        BHC(family="poisson-gamma").fit(X)
    with pytest.raises(ValueError, match=r"column 'x0': row 0 .* Poisson counts"):
        BHC(family="poisson").fit(X)
    with pytest.raises(ValueError, match="not fitted"):
        BHC().predict(X)
    m = BHC().fit(X)
    with pytest.raises(ValueError, match="X has 3 features, but BHC is expecting 2"):
        m.predict(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="NaN"):
        m.score_samples(np.array([[0.0, np.nan]]))
    fam = gaussian(X)
    with pytest.raises(ValueError, match="instance"):
        BHC().fit_summaries(one_record_stats(X, fam))
    with pytest.raises(ValueError, match="shape"):
        BHC(family=fam).fit_summaries(np.zeros((3, 4)))
    bad = one_record_stats(X, fam)
    bad[0, 0] = 0.0
    with pytest.raises(ValueError, match="n > 0"):
        BHC(family=fam).fit_summaries(bad)
