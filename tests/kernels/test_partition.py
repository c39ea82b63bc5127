"""The pieces every clustering kernel shares: the allocation models (``kernels.alloc``), the merge
gap, the greedy merge and the canonical relabelling (``kernels.partition``), and the one Bayes
K-means (``kernels.bayes_kmeans``).

Each prior piece is checked against the whole-partition EPPF it is a ratio of (seed 000 eq. 2.3,
seed 004 eqs. 4-6), and the merge gap against the MAP-DP objective (seed 000 eq. 3.3) it is the
change of.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels import alloc, bayes_kmeans, mapdp, partition
from kernels.alloc import crp, nggp
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
def test_nggp_pieces_are_ratios_of_kappa(u):
    alpha, sigma = 1.3, 0.4
    pp = np.array([float(alloc.NGGP), alpha, sigma])
    for n in (1.0, 2.0, 9.0):
        ratio = nggp.log_kappa(n + 1.0, u, alpha, sigma) - nggp.log_kappa(n, u, alpha, sigma)
        assert nggp.log_join(n, u, sigma) == pytest.approx(ratio, abs=1e-10)
        assert alloc.log_join(n, u, pp) == nggp.log_join(n, u, sigma)
    gap = (
        nggp.log_kappa(7.0, u, alpha, sigma)
        - nggp.log_kappa(3.0, u, alpha, sigma)
        - nggp.log_kappa(4.0, u, alpha, sigma)
    )
    assert nggp.merge_gap(3.0, 4.0, u, alpha, sigma) == pytest.approx(gap, abs=1e-12)
    assert alloc.merge_gap(3.0, 4.0, u, pp) == pytest.approx(gap, abs=1e-12)
    assert alloc.log_new(u, pp) == pytest.approx(nggp.log_kappa(1.0, u, alpha, sigma), abs=1e-12)


def test_dispatch_of_the_dp_is_the_crp():
    alpha = 2.2
    pp = np.array([float(alloc.DP), alpha, 0.0])
    la = math.log(alpha)
    assert alloc.log_kappa(6.0, 3.0, pp) == crp.log_kappa(6.0, la)
    assert alloc.log_join(6.0, 3.0, pp) == crp.log_join(6.0)
    assert alloc.log_new(3.0, pp) == crp.log_new(la)
    assert alloc.merge_gap(6.0, 2.0, 3.0, pp) == crp.merge_gap(6.0, 2.0, la)
    sizes = np.array([6.0, 2.0, 1.0])
    assert alloc.log_eppf(sizes, 3, pp) == crp.log_eppf(sizes, 3, alpha)


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
