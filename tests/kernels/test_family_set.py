"""The family set a spec's integer type selects (``kernels.obs.product``, issue 13's cold start).

A spec whose every group is Gaussian (Normal-Wishart without recording cells, or Normal-Gamma)
is int32 and its kernels contain those two families' kernels only, so that a full and a diagonal
covariance share one compiled sweep; any other spec is int64 and dispatches over all seven
families, without MAP-DP's packed Normal-Wishart paths. The two must give the same results on
Gaussian records (bit for bit but where the packed paths round differently), and typing a caller
for an int32 spec must not compile the other families (observed through the dispatchers'
signatures in a fresh process with an empty numba cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from kernels import mapdp as kmapdp
from kernels.obs import product
from pipeline.families import Categorical, GaussianNW, NormalGamma, ProductFamily
from tests.conftest import COUNT_ONLY


def _gaussian(seed: int = 0, kind: str = "full") -> tuple[np.ndarray, ProductFamily]:
    """(180, 3) records of three blobs and a Gaussian family of ``kind``: full covariance,
    diagonal, or a full block of two columns and a diagonal one."""
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(m, 1.0, (60, 3)) for m in (-3.0, 0.0, 3.0)])
    if kind == "diagonal":
        return X, NormalGamma.empirical_bayes(X).as_product()
    if kind == "both":
        groups = [
            (GaussianNW.empirical_bayes(X[:, :2]), [0, 1]),
            (NormalGamma.empirical_bayes(X[:, 2:]), [2]),
        ]
        return X, ProductFamily(groups)
    return X, GaussianNW.empirical_bayes(X).as_product()


def test_spec_dtype_is_the_family_set() -> None:
    X, fam = _gaussian()
    assert fam.spec.dtype == np.int32
    two_nw = ProductFamily(
        [
            (GaussianNW.empirical_bayes(X[:, :2]), [0, 1]),
            (GaussianNW.empirical_bayes(X[:, 2:]), [2]),
        ]
    )
    assert two_nw.spec.dtype == np.int32
    mixed = ProductFamily(
        [
            (GaussianNW.empirical_bayes(X[:, :2]), [0, 1]),
            (NormalGamma.empirical_bayes(X[:, 2:]), [2]),
        ]
    )
    # a full and a diagonal covariance: the two Gaussian families share the int32 kernels
    assert mixed.spec.dtype == np.int32
    assert NormalGamma.empirical_bayes(X).as_product().spec.dtype == np.int32
    cat = ProductFamily([(Categorical(np.ones(3)), [0])])
    assert cat.spec.dtype == np.int64
    # Normal-Wishart columns recorded on a grid: the Normal-Wishart kernels with the cells'
    # code (int16), unless the offsets outgrow int16 (a full covariance of 200 columns)
    grid = np.round(X)
    assert GaussianNW.empirical_bayes(grid).as_product().spec.dtype == np.int16
    wide = np.random.default_rng(1).integers(0, 9, size=(400, 200)).astype(float)
    assert GaussianNW.empirical_bayes(wide).as_product().spec.dtype == np.int64


def test_only_a_normal_wishart_spec_compiles_the_packed_paths() -> None:
    # ``product.nw_paths``: True for the Normal-Wishart specs, None (the kernels' packed paths
    # dropped before typing) for a spec of any family
    @njit
    def packed(spec):
        return product.nw_paths(spec) is not None

    kinds = [np.dtype(t) for t in (product.GAUSSIAN_DTYPE, product.NW_CELLS_DTYPE)]
    assert all(packed(np.zeros((1, 9), dtype=t)) for t in kinds)
    assert not packed(np.zeros((1, 9), dtype=product.ANY_DTYPE))


def test_signature_does_not_depend_on_the_spec_dtype() -> None:
    # statistics written before the int32 spec (checkpoints, models) still add
    _, fam = _gaussian()
    sig = fam.signature()
    fam.spec = fam.spec.astype(np.int64)
    assert fam.signature() == sig


@pytest.mark.parametrize("kind", ["full", "diagonal", "both"])
def test_gaussian_kernels_are_bit_identical_to_the_dispatch_over_all(kind: str) -> None:
    X, fam = _gaussian(1, kind)
    assert fam.spec.dtype == np.int32
    spec32, prior = fam.spec, fam.prior
    spec64 = spec32.astype(np.int64)
    n = X.shape[0]
    z0 = np.repeat(np.arange(3), n // 3).astype(np.int64)
    order = np.random.default_rng(2).permutation(n).astype(np.int64)
    out = {}
    for name, spec in (("nw", spec32), ("any", spec64)):
        stats = product.build_stats(X, z0, 3, spec, fam.n_stats)
        cache = np.zeros((3, fam.n_cache))
        for k in range(3):
            product.refresh(stats[k], cache[k], spec, prior)
        empty_c = np.zeros(fam.n_cache)
        product.refresh(np.zeros(fam.n_stats), empty_c, spec, prior)
        cap = 8
        st = np.zeros((cap, fam.n_stats))
        st[:3] = stats
        ca = np.zeros((cap, fam.n_cache))
        ca[:3] = cache
        nk = np.zeros(cap)
        nk[:3] = stats[:, 0]
        z = z0.copy()
        z[::7] = -1  # records not yet in a cluster open new ones or join
        logdens = np.full(n, np.nan)
        st, ca, nk, n_slots, changed = kmapdp.sweep(
            X, order, z, st, ca, nk, 3, spec, prior, empty_c, 0.5, logdens
        )
        labels, ld = kmapdp.predict(X, stats, cache, stats[:, 0].copy(), spec, prior, empty_c, 0.5)
        scratch_s, scratch_c = np.empty(fam.n_stats), np.empty(fam.n_cache)
        loo = [
            product.log_predictive_loo(
                X[i], stats[z0[i]], cache[z0[i]], spec, prior, scratch_s, scratch_c
            )
            for i in range(0, n, 11)
        ]
        mean, cov = product.moments(stats[0], spec, prior, X.shape[1])
        out[name] = (
            st,
            ca,
            nk,
            n_slots,
            changed,
            z,
            logdens,
            labels,
            ld,
            np.array(loo),
            product.log_marginals(stats, spec, prior),
            kmapdp.objective(stats, stats[:, 0].copy(), 3, spec, prior, 0.5),
            mean,
            cov,
        )
    for i, (a, b) in enumerate(zip(out["nw"], out["any"], strict=True)):
        if i in (1, 6, 8):
            # the int64 spec's sweep and predict take the generic path, not the packed one
            # (``product.nw_paths``): the caches and densities up to rounding
            np.testing.assert_allclose(a, b, rtol=1e-10)
        else:
            np.testing.assert_array_equal(a, b)  # bit for bit (NaNs in the same places)


def test_samplers_and_trees_take_a_cells_family_widened(tmp_path: Path) -> None:
    """``ProductFamily.widened``: the samplers and BHC take a Normal-Wishart family with
    recording cells as int64 (the int16 kernels exist for MAP-DP's packed paths), with the same
    log terms; MAP-DP keeps int16, a Gaussian family and a given family are not changed, and a
    saved widened family loads widened."""
    from pipeline.core import persist
    from pipeline.estimators.baselines import CollapsedGibbs
    from pipeline.estimators.bhc import BHC
    from pipeline.estimators.mapdp import MAPDP

    X, gauss = _gaussian(3)
    grid = np.round(2.0 * X)
    fam = GaussianNW.empirical_bayes(grid).as_product()
    wide = fam.widened()
    assert (fam.spec.dtype, wide.spec.dtype) == (np.dtype(np.int16), np.dtype(np.int64))
    np.testing.assert_array_equal(wide.spec, fam.spec)
    assert gauss.widened() is gauss and wide.widened() is wide and not fam.is_widened
    z = np.arange(grid.shape[0], dtype=np.int64) % 3
    s16, s64 = fam.stats_of(grid, z, 3), wide.stats_of(grid, z, 3)
    np.testing.assert_array_equal(s16, s64)
    np.testing.assert_array_equal(fam.cache_of(s16), wide.cache_of(s64))
    for k in range(3):
        assert wide.log_marginal_stats(s64[k]) == fam.log_marginal_stats(s16[k])
    assert wide.log_predictive(grid[0], grid[1:]) == fam.log_predictive(grid[0], grid[1:])

    assert MAPDP(random_state=0).fit(grid).family_.spec.dtype == np.int16
    gibbs = CollapsedGibbs(n_iter=4, burn_in=1, random_state=0).fit(grid)
    assert gibbs.family_.spec.dtype == np.int64
    given = BHC(family=fam).fit(grid)
    assert given.family_.spec.dtype == np.int64 and fam.spec.dtype == np.int16
    persist.save(tmp_path, "wide", given.family_)
    persist.save(tmp_path, "own", fam)
    back = persist.load(tmp_path, "wide", ProductFamily)
    assert back.is_widened and back.spec.dtype == np.int64
    assert persist.load(tmp_path, "own", ProductFamily).spec.dtype == np.int16


_PROBE = """
import numpy as np
from kernels.obs import categorical, product
from pipeline.families import Categorical, GaussianNW, NormalGamma, ProductFamily

rng = np.random.default_rng(0)
X = rng.normal(size=(30, 2))
X[:, 1] = X[:, 1] > 0.0  # a category code for the categorical group, a value for the others
for fam in {families}:
    z = np.zeros(30, dtype=np.int64)
    s = product.build_stats(X, z, 1, fam.spec, fam.n_stats)[0]
    c = fam.cache_of(s[None])[0]
    product.log_predictive(X[0], s, c, fam.spec, fam.prior)
    product.update(X[1], s, c, fam.spec, fam.prior, 1.0)
print(len(product._any_log_predictive.signatures), len(product._any_update.signatures),
      len(categorical.log_predictive.signatures), len(categorical.refresh.signatures))
"""


def _compiled_other_families(families: str, tmp_path: Path) -> list[int]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), **COUNT_ONLY}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROBE.format(families=families))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return [int(v) for v in res.stdout.split()]


@pytest.mark.slow
def test_a_gaussian_only_family_compiles_no_other_family(tmp_path: Path) -> None:
    # an empty numba cache, so that every kernel the calls need is compiled (and seen) here
    gauss = (
        "[GaussianNW.empirical_bayes(X).as_product(), NormalGamma.empirical_bayes(X).as_product(),"
        " ProductFamily([(GaussianNW.empirical_bayes(X[:, :1]), [0]),"
        " (NormalGamma.empirical_bayes(X[:, 1:]), [1])])]"
    )
    assert _compiled_other_families(gauss, tmp_path / "a") == [0, 0, 0, 0]
    # the probe can see them: a product with a categorical group compiles the chains
    mixed = (
        "[ProductFamily([(GaussianNW.empirical_bayes(X[:, :1]), [0]),"
        " (Categorical(np.ones(2)), [1])])]"
    )
    assert all(v > 0 for v in _compiled_other_families(mixed, tmp_path / "b"))
