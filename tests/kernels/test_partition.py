"""The pieces every clustering kernel shares: the allocation models (``kernels.alloc``), the merge
gap, the greedy merge and the canonical relabelling (``kernels.partition``), and the one Bayes
K-means (``kernels.bayes_kmeans``).

Each prior piece is checked against the whole-partition EPPF it is a ratio of (Raykov et al. 2016,
eq. 2.3, Lee and Choi 2015, eqs. 4-6), and the merge gap against the MAP-DP objective (Raykov et al.
2016, eq. 3.3) it is the change of.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import alloc, bayes_kmeans, mapdp, partition
from kernels.alloc import crp, nggp
from kernels.obs import gaussian_nw
from pipeline.families import GaussianNW, ProductFamily
from tests.reference import log_crp


def gaussian(X: np.ndarray) -> ProductFamily:
    return GaussianNW.empirical_bayes(X).as_product()


def blobs(n_per: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]])
    return np.vstack([rng.normal(c, 0.6, (n_per, 2)) for c in centres])


# -- allocation models ----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.3, 1.0, 4.5])
def test_crp_pieces_are_ratios_of_the_eppf(alpha):
    la = math.log(alpha)
    sizes = np.array([5.0, 3.0, 1.0, 7.0])
    e = crp.log_eppf(sizes, 4, alpha)
    assert e == pytest.approx(log_crp(sizes, alpha), abs=1e-10)
    # empty slots count for nothing
    assert crp.log_eppf(np.array([5.0, 0.0, 3.0, 1.0, 7.0]), 5, alpha) == pytest.approx(
        e, abs=1e-12
    )
    # one more record in block 0 (eq. 2.3's normaliser Gamma(N + alpha) moves too)
    grown = sizes + np.array([1.0, 0.0, 0.0, 0.0])
    step = crp.log_eppf(grown, 4, alpha) - e + math.log(sizes.sum() + alpha)
    assert crp.log_join(5.0) == pytest.approx(step, abs=1e-10)
    opened = np.append(sizes, 1.0)
    step = crp.log_eppf(opened, 5, alpha) - e + math.log(sizes.sum() + alpha)
    assert crp.log_new(la) == pytest.approx(step, abs=1e-10)
    merged = np.array([8.0, 1.0, 7.0])
    gap = crp.log_eppf(merged, 3, alpha) - e
    assert crp.merge_gap(5.0, 3.0, la) == pytest.approx(gap, abs=1e-10)
    assert crp.log_kappa(4.0, la) == pytest.approx(la + math.log(6.0), abs=1e-12)


@pytest.mark.parametrize("u", [0.0, 0.7, 12.0])
def test_nggp_merge_gap_is_a_ratio_of_kappa(u):
    alpha, sigma = 1.3, 0.4
    pp = np.array([float(alloc.NGGP), alpha, sigma])
    gap = (
        nggp.log_kappa(7.0, u, alpha, sigma)
        - nggp.log_kappa(3.0, u, alpha, sigma)
        - nggp.log_kappa(4.0, u, alpha, sigma)
    )
    assert nggp.merge_gap(3.0, 4.0, u, alpha, sigma) == pytest.approx(gap, abs=1e-12)
    assert alloc.merge_gap(3.0, 4.0, u, pp) == pytest.approx(gap, abs=1e-12)


def test_dispatch_of_the_dp_is_the_crp():
    alpha = 2.2
    pp = np.array([float(alloc.DP), alpha, 0.0])
    la = math.log(alpha)
    assert alloc.log_kappa(6.0, 3.0, pp) == crp.log_kappa(6.0, la)
    assert alloc.merge_gap(6.0, 2.0, 3.0, pp) == crp.merge_gap(6.0, 2.0, la)


# -- canonical relabelling ------------------------------------------------------------------------


def test_canonical_labels_number_blocks_by_first_appearance():
    z = np.array([7, 7, 2, 9, 2, 0, 9], dtype=np.int64)
    out = np.empty_like(z)
    assert partition.canonical_labels(z, out) == 4
    np.testing.assert_array_equal(out, [0, 0, 1, 2, 1, 3, 2])
    # in place, and idempotent
    partition.canonical_labels(out, out)
    np.testing.assert_array_equal(out, [0, 0, 1, 2, 1, 3, 2])


def test_canonical_labels_reject_negative_ids():
    z = np.array([0, -1, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="labels must be >= 0"):
        partition.canonical_labels(z, np.empty_like(z))


# -- merge gap and greedy merge ------------------------------------------------------------------


def test_merge_gap_is_the_decrease_of_the_mapdp_objective():
    X = blobs(10, seed=1)
    fam = gaussian(X)
    z = np.repeat(np.arange(3), 10)
    stats = fam.stats_of(X, z, 3)
    alpha = 0.8
    nk = np.ascontiguousarray(stats[:, 0])
    before = mapdp.objective(stats, nk, 3, fam.spec, fam.prior, alpha)
    merged = np.vstack([stats[0] + stats[1], stats[2]])
    after = mapdp.objective(
        merged, np.ascontiguousarray(merged[:, 0]), 2, fam.spec, fam.prior, alpha
    )
    gap = partition.merge_gap(stats[0], stats[1], fam.spec, fam.prior, math.log(alpha))
    assert gap == pytest.approx(before - after, abs=1e-9)
    assert gap < 0.0  # two far-apart blobs do not want to merge


def test_greedy_merge_rejoins_an_over_split_partition():
    X = blobs(12, seed=2)
    fam = gaussian(X)
    # every blob cut into four pieces of three records
    z = np.arange(36) // 3
    stats = fam.stats_of(X, z, 12)
    la = 0.0
    target, merged, n_merges = partition.greedy_merge(
        stats, np.ascontiguousarray(stats[:, 0]), fam.spec, fam.prior, la
    )
    assert n_merges == 9 and merged.shape[0] == 3
    np.testing.assert_array_equal(target, np.repeat(np.arange(3), 4))
    np.testing.assert_allclose(merged.sum(axis=0), stats.sum(axis=0), rtol=1e-12)
    # stopped because no merge raises the joint any more
    for a in range(3):
        for b in range(a + 1, 3):
            assert partition.merge_gap(merged[a], merged[b], fam.spec, fam.prior, la) <= 0.0


def _two_clusters(seed: int, d: int, cells: bool) -> tuple[np.ndarray, np.ndarray, ProductFamily]:
    """Two clusters of 1-40 records at a random distance (0 to 8 spreads), on a grid of step 1
    when ``cells`` (the prior then records H > 0)."""
    rng = np.random.default_rng(seed)
    na, nb = rng.integers(1, 41, size=2)
    shift = rng.uniform(0.0, 8.0) * rng.normal(size=d)
    Xa = rng.normal(size=(na, d)) * rng.uniform(0.3, 3.0, size=d)
    Xb = rng.normal(size=(nb, d)) * rng.uniform(0.3, 3.0, size=d) + shift
    if cells:
        Xa, Xb = np.round(4 * Xa), np.round(4 * Xb)
    X = np.vstack([Xa, Xb])
    fam = GaussianNW.empirical_bayes(X).as_product()
    z = np.repeat([0, 1], [na, nb])
    return fam.stats_of(fam.arrange(X), z, 2), X, fam


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 100_000), d=st.sampled_from([1, 2, 3, 6]), cells=st.booleans())
def test_the_merged_log_marginal_bound_bounds_it(seed: int, d: int, cells: bool) -> None:
    """``merged_logdet_lower`` (determinant lemma and Minkowski's inequality) is below the
    merged clusters' log|T_ab| and ``merged_log_marginal_bound`` with it above their log
    marginal, from either cluster's factor (1e-9 of the terms for rounding, plus d kappa eps
    for log-determinants of matrices of condition number kappa: a prior fitted on six records
    in d = 6 has an eigenvalue near 1e-9 of the others, and both sides then move by 1e-7)."""
    stats, _, fam = _two_clusters(seed, d, cells)
    p = fam.prior
    # True: ``product.nw_paths``' value for a Normal-Wishart spec, its fast path compiled
    nw, T, m, lmv0, fac = partition._marginal_scratch(stats[0], 2, fam.spec, p, True)
    assert nw
    Ls, ms, scal, y, _ = fac
    for k in range(2):
        partition._log_marginal(stats[k], fam.spec, p, nw, T, m, lmv0, True)
        partition._keep_factor(k, stats[k], p, T, m, fac)
    s_ab = stats[0] + stats[1]
    exact = gaussian_nw.log_marginal(s_ab, p)
    T_ab, m_ab = np.empty((d, d)), np.empty(d)
    _, ak = gaussian_nw.posterior_inverse_scale(s_ab, p, T_ab, m_ab)
    logdet_ab = np.linalg.slogdet(T_ab)[1]
    top, scale = gaussian_nw.merged_log_marginal_bound(s_ab[0], d, p, lmv0)
    kappa = max(np.linalg.cond(T_ab), *(np.linalg.cond(Ls[k] @ Ls[k].T) for k in range(2)))
    slack = d * kappa * np.finfo(np.float64).eps
    for u, v in ((0, 1), (1, 0)):
        low = gaussian_nw.merged_logdet_lower(
            stats[v], scal[v, 2], Ls[u], ms[u], scal[u, 0], scal[u, 1], y
        )
        assert low <= logdet_ab + 1e-9 * abs(logdet_ab) + 1e-12 + slack
        bound = top - 0.5 * ak * low
        assert bound >= exact - 1e-9 * (scale + abs(0.5 * ak * low)) - 0.5 * ak * slack


def _greedy_merge_reference(stats: np.ndarray, fam: ProductFamily, la: float) -> np.ndarray:
    """Every pair's ``merge_gap`` recomputed after each merge, the largest positive merged
    (ties: the first pair in row-major order): the final group of each row."""
    groups = [[k] for k in range(stats.shape[0])]
    rows = [r.copy() for r in stats]
    while True:
        best, pair = 0.0, None
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                g = partition.merge_gap(rows[a], rows[b], fam.spec, fam.prior, la)
                if g > best:
                    best, pair = g, (a, b)
        if pair is None:
            break
        a, b = pair
        rows[a] = rows[a] + rows[b]
        groups[a] += groups.pop(b)
        rows.pop(b)
    target = np.empty(stats.shape[0], dtype=np.int64)
    for g, members in enumerate(groups):
        target[members] = g
    return target


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), pieces=st.integers(1, 4), la=st.sampled_from([-2.0, 0.0, 3.0]))
def test_greedy_merge_is_the_full_evaluations(seed: int, pieces: int, la: float) -> None:
    """The pairs whose bound proves their gap negative are left out without changing a merge:
    ``greedy_merge`` merges as the full evaluation of every gap after every merge does, on
    blobs cut into up to four pieces at random (some pieces far apart, some to rejoin)."""
    rng = np.random.default_rng(seed)
    X = blobs(int(rng.integers(4, 13)), seed=seed)
    fam = gaussian(X)
    z = rng.integers(0, 3 * pieces, size=X.shape[0])
    z = np.unique(z, return_inverse=True)[1].astype(np.int64)
    K = int(z.max()) + 1
    stats = fam.stats_of(X, z, K)
    target, _, n_merges = partition.greedy_merge(
        stats, np.ascontiguousarray(stats[:, 0]), fam.spec, fam.prior, la
    )
    want = _greedy_merge_reference(stats, fam, la)
    np.testing.assert_array_equal(target, want)
    assert n_merges == K - (int(want.max()) + 1)


# -- Bayes K-means --------------------------------------------------------------------------------


@pytest.mark.parametrize("sweeps", [0, 3])
def test_bayes_kmeans_finds_the_blobs_and_leaves_no_positive_merge(sweeps):
    X = blobs(15, seed=3)
    fam = gaussian(X)
    leaves = fam.stats_of(X, np.arange(45), 45)
    order = np.random.default_rng(0).permutation(45).astype(np.int64)
    z, cl = bayes_kmeans.bayes_kmeans(leaves, fam.spec, fam.prior, 0.0, order, 7, sweeps)
    np.testing.assert_array_equal(z, np.repeat(np.arange(3), 15))
    for k in range(cl.shape[0]):
        np.testing.assert_allclose(cl[k], leaves[z == k].sum(axis=0), rtol=1e-9, atol=1e-9)
    for a in range(cl.shape[0]):
        for b in range(a + 1, cl.shape[0]):
            assert partition.merge_gap(cl[a], cl[b], fam.spec, fam.prior, 0.0) <= 0.0
