"""The dataset store's fast paths against the slow ones they replace: ``read_rows`` against
zarr's own read, ``Moments.of`` (one kernel pass) against NumPy's reductions, and
``folds_of_uniform`` against ``np.searchsorted`` — equal bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.data.store import Moments, folds_of_uniform, read_rows, record_codec


@pytest.mark.parametrize("dtype", ["float64", "float32", "bool", "int16"])
@pytest.mark.parametrize("codec", ["none", "record"])
def test_read_rows_equals_zarr(tmp_path: Path, dtype: str, codec: str) -> None:
    n, cr = 250, 100
    shape: tuple[int, ...] = (n, 3) if dtype.startswith("float") else (n,)
    arr = zarr.create_array(
        str(tmp_path / "a"),
        shape=shape,
        chunks=(cr, *shape[1:]),
        dtype=dtype,
        fill_value=0,
        compressors=None if codec == "none" else record_codec(),
    )
    rng = np.random.default_rng(0)
    # rows 100..199 never written (the fill value); the last chunk is partial
    arr[:100] = (rng.normal(size=(100, *shape[1:])) * 5).astype(dtype)
    arr[200:] = (rng.normal(size=(50, *shape[1:])) * 5).astype(dtype)
    for a, b in [(0, 100), (100, 200), (200, 250), (200, 230), (50, 150), (0, 250), (7, 7)]:
        got = read_rows(str(tmp_path / "a"), a, b)
        want = np.asarray(arr[a:b])
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)


def test_moments_of_equal_numpy_reductions() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, 6)) * [1, 10, 1e-3, 1e4, 1, 1]
    for Xt in (X, np.where(rng.random(X.shape) < 0.1, np.nan, X)):
        m = Moments.of(Xt)
        miss = np.isnan(Xt)
        X0 = np.where(miss, 0.0, Xt)
        assert m.n == Xt.shape[0]
        assert np.array_equal(m.total, X0.sum(axis=0))
        assert np.array_equal(m.outer, X0.T @ X0)
        assert np.array_equal(m.lo, np.where(miss, np.inf, Xt).min(axis=0))
        assert np.array_equal(m.hi, np.where(miss, -np.inf, Xt).max(axis=0))
        assert m.n_missing is not None
        assert np.array_equal(m.n_missing, miss.sum(axis=0))
    empty = Moments.of(np.zeros((0, 2)))
    assert empty.n == 0 and np.all(empty.lo == np.inf) and np.all(empty.hi == -np.inf)
    assert not empty.total.any() and not empty.outer.any()


@pytest.mark.parametrize("n_folds", [1, 2, 3, 5, 7, 10])
def test_folds_of_uniform_equal_searchsorted(n_folds: int) -> None:
    u = np.random.default_rng(2).random(20_000)
    # the interval edges themselves and the floats just below them
    edges = np.arange(1, n_folds, dtype=np.float64) / float(n_folds)
    u = np.concatenate([u, edges, np.nextafter(edges, 0.0), [0.0]])
    want = np.searchsorted(edges, u, side="right").astype(np.int16)
    got = folds_of_uniform(u, n_folds)
    assert got.dtype == np.int16
    assert np.array_equal(got, want)
