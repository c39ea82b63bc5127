"""The packed, cluster-major predictives of Normal-Wishart clusters (``gaussian_nw.pack_column``,
``packed_log_predictives``) that MAP-DP's sweep and ``predict`` use for Normal-Wishart-only
records: each column is the Student-t of Appendix B (``gaussian_nw.log_predictive``, against
SciPy's multivariate t too), a free slot's column is never read, and a sweep whose slots outgrow
their arrays repacks them without changing a result.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from kernels import mapdp as kmapdp
from kernels.obs import gaussian_nw, product
from pipeline.families import GaussianNW, ProductFamily


def _clusters(seed: int, d: int, K: int, n: int = 40) -> tuple[np.ndarray, ProductFamily]:
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(6.0 * k, 1.0 + 0.3 * k, (n, d)) for k in range(K)])
    return X, GaussianNW.empirical_bayes(X).as_product()


def _caches(X: np.ndarray, fam: ProductFamily, z: np.ndarray, K: int):
    stats = product.build_stats(X, z, K, fam.spec, fam.n_stats)
    cache = np.zeros((K, fam.n_cache))
    for k in range(K):
        product.refresh(stats[k], cache[k], fam.spec, fam.prior)
    empty_c = np.zeros(fam.n_cache)
    product.refresh(np.zeros(fam.n_stats), empty_c, fam.spec, fam.prior)
    return stats, cache, empty_c


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(1, 6), K=st.integers(1, 5))
def test_each_packed_column_is_the_cluster_predictive(seed: int, d: int, K: int) -> None:
    X, fam = _clusters(seed, d, K, n=12)
    z = np.repeat(np.arange(K), 12).astype(np.int64)
    stats, cache, empty_c = _caches(X, fam, z, K)
    P = kmapdp.pack_slots(cache, K, empty_c, d)
    assert P.shape == (d * (d + 1) // 2 + d + 3, K + 1)
    rng = np.random.default_rng(seed + 1)
    acc, qv, lp = np.empty(K + 1), np.empty(K + 1), np.empty(K + 1)
    for x in rng.normal(3.0 * K, 4.0 * K, (5, d)):
        gaussian_nw.packed_log_predictives(x, P, K + 1, acc, qv, lp)
        want = [gaussian_nw.log_predictive(x, stats[k], cache[k], fam.prior) for k in range(K)]
        want.append(gaussian_nw.log_predictive(x, np.zeros(fam.n_stats), empty_c, fam.prior))
        # reassociated sums of d^2 / 2 products: rounding only
        np.testing.assert_allclose(lp, want, rtol=1e-12, atol=1e-12)


def test_a_packed_column_is_the_student_t_of_appendix_b() -> None:
    # the prior predictive (the empty statistics): Student-t with nu = a0 - d + 1, mean m0 and
    # precision c0 nu / (c0 + 1) B0 (Appendix B, below B.2), SciPy's shape its inverse
    X, fam = _clusters(3, 3, 2)
    nw = fam.groups[0][0]
    assert isinstance(nw, GaussianNW)
    d = 3
    _, _, empty_c = _caches(X, fam, np.zeros(X.shape[0], dtype=np.int64), 1)
    P = np.empty((d * (d + 1) // 2 + d + 3, 1))
    gaussian_nw.pack_column(P, 0, empty_c, d)
    nu = nw.a0 - d + 1.0
    shape = (nw.c0 + 1.0) / (nw.c0 * nu) * np.linalg.inv(nw.B0)
    acc, qv, lp = np.empty(1), np.empty(1), np.empty(1)
    for x in X[::17]:
        gaussian_nw.packed_log_predictives(x, P, 1, acc, qv, lp)
        want = sps.multivariate_t(loc=nw.m0, shape=shape, df=nu).logpdf(x)
        np.testing.assert_allclose(lp[0], want, rtol=1e-10)


def test_predict_never_reads_a_free_slot() -> None:
    X, fam = _clusters(5, 4, 3)
    z = np.repeat(np.arange(3), 40).astype(np.int64)
    stats, cache, empty_c = _caches(X, fam, z, 3)
    labels, logdens = kmapdp.predict(
        X, stats, cache, stats[:, 0].copy(), fam.spec, fam.prior, empty_c, 0.7
    )
    # the same clusters with a free slot between them whose cache is NaN
    stats2 = np.insert(stats, 1, 0.0, axis=0)
    cache2 = np.insert(cache, 1, np.nan, axis=0)
    labels2, logdens2 = kmapdp.predict(
        X, stats2, cache2, stats2[:, 0].copy(), fam.spec, fam.prior, empty_c, 0.7
    )
    np.testing.assert_array_equal(logdens2, logdens)
    np.testing.assert_array_equal(labels2, np.where(labels >= 1, labels + 1, labels))


def _sweep(X, fam, cap, alpha=1.0):
    n = X.shape[0]
    empty_c = np.zeros(fam.n_cache)
    product.refresh(np.zeros(fam.n_stats), empty_c, fam.spec, fam.prior)
    order = np.random.default_rng(0).permutation(n).astype(np.int64)
    z = np.full(n, -1, dtype=np.int64)
    stats = np.zeros((cap, fam.n_stats))
    cache = np.zeros((cap, fam.n_cache))
    nk = np.zeros(cap)
    logdens = np.full(n, np.nan)
    out = kmapdp.sweep(
        X, order, z, stats, cache, nk, 0, fam.spec, fam.prior, empty_c, alpha, logdens
    )
    return out, z, logdens


def test_a_sweep_whose_slots_grow_repacks_them_without_changing_a_result() -> None:
    # 16 tight clusters on a grid: from one slot, the slots double twice (1 -> 8 -> 16)
    rng = np.random.default_rng(7)
    grid = np.array([(a, b) for a in range(4) for b in range(4)], dtype=float) * 40.0
    X = np.vstack([rng.normal(m, 0.5, (15, 2)) for m in grid])
    # a prior of tight clusters (precision about 4), so that each square is one
    fam = GaussianNW(m0=X.mean(axis=0), c0=1e-3, B0=4.0 * np.eye(2), a0=4.0).as_product()
    (st1, ca1, nk1, n1, ch1), z1, ld1 = _sweep(X, fam, cap=1)
    (st2, ca2, nk2, n2, ch2), z2, ld2 = _sweep(X, fam, cap=64)
    assert st1.shape[0] == 16 and st2.shape[0] == 64
    assert n1 == n2 == 16 and ch1 == ch2 == X.shape[0]
    np.testing.assert_array_equal(z1, z2)
    np.testing.assert_array_equal(st1[:n1], st2[:n2])
    np.testing.assert_array_equal(ca1[:n1], ca2[:n2])
    np.testing.assert_array_equal(nk1[:n1], nk2[:n2])
    np.testing.assert_array_equal(ld1, ld2)  # the first record only: every record moves
    # and the confirming sweep from there scores every record as ``predict`` does
    empty_c = np.zeros(fam.n_cache)
    product.refresh(np.zeros(fam.n_stats), empty_c, fam.spec, fam.prior)
    logdens = np.full(X.shape[0], np.nan)
    order = np.arange(X.shape[0], dtype=np.int64)
    z = z1.copy()
    *_, changed = kmapdp.sweep(
        X,
        order,
        z,
        st1.copy(),
        ca1.copy(),
        nk1.copy(),
        n1,
        fam.spec,
        fam.prior,
        empty_c,
        1.0,
        logdens,
    )
    assert changed == 0
    labels, want = kmapdp.predict(
        X, st1[:n1], ca1[:n1], nk1[:n1].copy(), fam.spec, fam.prior, empty_c, 1.0
    )
    np.testing.assert_array_equal(logdens, want)
    np.testing.assert_array_equal(labels, z1)


def test_pruned_eq_3_4_is_the_full_mixture_ties_to_the_lowest_slot() -> None:
    """``predict``'s eq. 3.4-3.5 (pruned: a logarithm only for the columns whose term can
    count, the terms' arg max found along the way) against the full mixture of every cluster's
    Student-t (``gaussian_nw.log_predictive``, log-sum-exp in NumPy): densities to 1e-12
    relative, labels equal; a cluster present twice ties, and the lower slot wins."""
    X, fam = _clusters(11, 3, 4, n=30)
    z = np.repeat(np.arange(4), 30).astype(np.int64)
    stats, cache, empty_c = _caches(X, fam, z, 4)
    # slot 4 is slot 2 again: every record of cluster 2 ties between slots 2 and 4
    stats = np.vstack([stats, stats[2:3]])
    cache = np.vstack([cache, cache[2:3]])
    nk = stats[:, 0].copy()
    alpha = 0.5
    rng = np.random.default_rng(3)
    Xq = np.vstack([X, rng.normal(X.mean(axis=0), 25.0, (40, 3))])  # far records: new clusters
    labels, logdens = kmapdp.predict(Xq, stats, cache, nk, fam.spec, fam.prior, empty_c, alpha)
    p = fam.prior
    lp = np.array(
        [
            [gaussian_nw.log_predictive(x, stats[k], cache[k], p) for k in range(5)]
            + [gaussian_nw.log_predictive(x, np.zeros(fam.n_stats), empty_c, p)]
            for x in Xq
        ]
    )
    w = np.log(np.append(nk, alpha)) - np.log(alpha + nk.sum())
    terms = lp + w
    want = np.logaddexp.reduce(terms, axis=1)
    np.testing.assert_allclose(logdens, want, rtol=1e-12)
    best = np.argmax(terms, axis=1)  # the first of equal maxima
    np.testing.assert_array_equal(labels, np.where(best < 5, best, -1))
    assert np.all(labels[60:90] == 2) and np.any(labels == -1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(1, 12), K=st.integers(1, 6))
def test_leading_rows_bound_the_quadratic_forms_and_finish_to_them(
    seed: int, d: int, K: int
) -> None:
    """The quadratic forms' leading rows (``leading_quad_forms``) are lower bounds of the full
    forms (each row adds a square), and ``finish_quad_form`` completes a column to exactly the
    value ``quad_forms`` gives, for every number of leading rows."""
    X, fam = _clusters(seed, d, K, n=15)
    z = np.repeat(np.arange(K), 15).astype(np.int64)
    _, cache, empty_c = _caches(X, fam, z, K)
    P = np.empty((d * (d + 1) // 2 + d + 3, K + 1))
    gaussian_nw.pack_columns(P, cache, K, empty_c, d)
    acc, full, part = np.empty(K + 1), np.empty(K + 1), np.empty(K + 1)
    rng = np.random.default_rng(seed)
    for x in (X[0], X[-1], rng.normal(0.0, 10.0, d)):
        gaussian_nw.quad_forms(x, P, K + 1, d, acc, full)
        for rows in range(d + 1):
            gaussian_nw.leading_quad_forms(x, P, K + 1, d, rows, acc, part)
            assert np.all(part <= full * (1 + 1e-12) + 1e-300)
            done = [gaussian_nw.finish_quad_form(x, P, h, d, rows, part[h]) for h in range(K + 1)]
            np.testing.assert_allclose(done, full, rtol=1e-12, atol=1e-300)
    assert 1 <= gaussian_nw.leading_rows(d) <= d


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    scale=st.sampled_from([1e-12, 1e-3, 1.0, 1e3, 1e8]),
)
def test_the_bounds_are_upper_bounds_of_the_packed_predictives_within_their_slack(
    seed: int, n: int, scale: float
) -> None:
    """``packed_log_predictive_bounds`` (exponent and mantissa from the bits): at least the
    exact Student-t of every column, by at most 1.3e-5 (nu + d) / 2 plus its rounding margin, on
    quadratic forms from 0 through powers of two to 1e8 times a spread of scales."""
    rng = np.random.default_rng(seed)
    d = 3
    e0 = d * (d + 1) // 2 + d
    P = np.zeros((e0 + 3, n))
    P[e0] = rng.normal(0.0, 50.0, n)
    P[e0 + 1] = rng.uniform(0.01, 1.0, n)
    P[e0 + 2] = rng.uniform(2.0, 5e4, n)
    qv = rng.exponential(scale, n)
    qv[0] = 0.0
    if n > 2:
        qv[1] = 2.0 ** rng.integers(-20, 40) / P[e0 + 1, 1] - 1.0 / P[e0 + 1, 1]
        qv[1] = max(qv[1], 0.0)
    ub = np.empty(n)
    gaussian_nw.packed_log_predictive_bounds(qv, P, n, e0, ub)
    exact = P[e0] - P[e0 + 2] * np.log1p(qv * P[e0 + 1])
    slack = 1.3e-5 * P[e0 + 2] + 1e-9 * (np.abs(P[e0]) + np.abs(exact)) + 1e-9
    assert np.all(ub >= exact)
    assert np.all(ub - exact <= slack)


def test_float_bits_are_numpys_views() -> None:
    """``kernels.arrays.float_bits`` / ``bits_float``: the int64 view of a float64 and back,
    as NumPy's ``view`` gives them, for signs, zeros, subnormals, infinities and NaN."""
    from numba import njit

    from kernels.arrays import bits_float, float_bits

    @njit
    def both(x, out_bits, out_back):
        for i in range(x.shape[0]):
            out_bits[i] = float_bits(x[i])
            out_back[i] = bits_float(out_bits[i])

    x = np.array([0.0, -0.0, 1.0, -2.5, 5e-324, 1e308, np.inf, -np.inf, np.nan, 3.14159])
    bits, back = np.empty(x.shape[0], dtype=np.int64), np.empty(x.shape[0])
    both(x, bits, back)
    np.testing.assert_array_equal(bits, x.view(np.int64))
    np.testing.assert_array_equal(back.view(np.int64), x.view(np.int64))


def test_a_borrowed_array_is_the_same_array_without_an_owner() -> None:
    """``kernels.arrays.borrowed``: the same data, shape and strides (writes go through to the
    owner's array, a row view reads the owner's row), in a jitted function."""
    from numba import njit

    from kernels.arrays import borrowed

    @njit
    def fill(a, v):
        b = borrowed(a)
        row = b[1]
        for j in range(row.shape[0]):
            row[j] = v + j
        return b.shape[0], b.shape[1], b[1, 2]

    a = np.zeros((3, 4))
    assert fill(a, 5.0) == (3, 4, 7.0)
    np.testing.assert_array_equal(a[1], [5.0, 6.0, 7.0, 8.0])
    np.testing.assert_array_equal(a[[0, 2]], 0.0)
    col = np.zeros((4, 3))[:, 1]
    assert not col.flags.c_contiguous
    assert njit(lambda v: borrowed(v)[2])(np.arange(6.0)[::2]) == 4.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(1, 12), K=st.integers(1, 6))
def test_a_block_of_quadratic_forms_is_each_records_own(seed: int, d: int, K: int) -> None:
    """``block_quad_forms`` over a block of records equals ``quad_form`` of each record bit for
    bit (a sweep recomputes a changed column one record at a time and mixes both), and
    ``quad_forms`` up to rounding."""
    X, fam = _clusters(seed, d, K, n=15)
    z = np.repeat(np.arange(K), 15).astype(np.int64)
    _, cache, empty_c = _caches(X, fam, z, K)
    P = np.empty((d * (d + 1) // 2 + d + 3, K + 1))
    gaussian_nw.pack_columns(P, cache, K, empty_c, d)
    B = X.shape[0]
    Q = np.empty((K + 1, B))
    gaussian_nw.block_quad_forms(np.ascontiguousarray(X.T), 0, B, P, K + 1, d, np.empty(B), Q)
    acc, qv = np.empty(K + 1), np.empty(K + 1)
    for r in range(0, B, 7):
        one = [gaussian_nw.quad_form(X[r], P, h, d) for h in range(K + 1)]
        np.testing.assert_array_equal(Q[:, r], one)
        gaussian_nw.quad_forms(X[r], P, K + 1, d, acc, qv)
        np.testing.assert_allclose(Q[:, r], qv, rtol=1e-11)
