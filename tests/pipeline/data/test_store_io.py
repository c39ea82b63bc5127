"""The dataset store's fast paths against the slow ones they replace: ``read_rows`` against
zarr's own read, ``Moments.of`` (one kernel pass) against NumPy's reductions, and
``folds_of_uniform`` against ``np.searchsorted`` — equal bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import StorageError
from pipeline.data.chunk_io import CHECKSUM, open_array, read_rows, record_codec, write_rows
from pipeline.data.store import Moments, Store, balanced_chunk_rows, folds_of_uniform


def codecs(name: str) -> list[Any]:
    """The compressors of a test array: "none", "blosc" (read through zarr), "checked" (plain
    bytes and a checksum), "record" (``record_codec``: Blosc and a checksum)."""
    return {"none": [], "blosc": record_codec()[:1], "checked": [CHECKSUM]}.get(
        name, record_codec()
    )


@pytest.mark.parametrize("dtype", ["float64", "float32", "bool", "int16"])
@pytest.mark.parametrize("codec", ["none", "blosc", "checked", "record"])
@pytest.mark.parametrize("reuse", [False, True])
def test_read_rows_equals_zarr(tmp_path: Path, dtype: str, codec: str, reuse: bool) -> None:
    n, cr = 250, 100
    shape: tuple[int, ...] = (n, 3) if dtype.startswith("float") else (n,)
    arr = zarr.create_array(
        str(tmp_path / "a"),
        shape=shape,
        chunks=(cr, *shape[1:]),
        dtype=dtype,
        fill_value=0,
        compressors=codecs(codec),
    )
    rng = np.random.default_rng(0)
    # rows 100..199 never written (the fill value); the last chunk is partial
    arr[:100] = (rng.normal(size=(100, *shape[1:])) * 5).astype(dtype)
    arr[200:] = (rng.normal(size=(50, *shape[1:])) * 5).astype(dtype)
    for a, b in [(0, 100), (100, 200), (200, 250), (200, 230), (50, 150), (0, 250), (7, 7)]:
        got = read_rows(str(tmp_path / "a"), a, b, reuse=reuse)
        want = np.asarray(arr[a:b])
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)


def test_read_rows_reuses_only_an_array_nothing_refers_to(tmp_path: Path) -> None:
    """``read_rows(reuse=True)`` reads into the array of its last read only once nothing
    refers to it: a kept array or a view of it keeps its rows."""
    path = str(tmp_path / "a")
    arr = zarr.create_array(
        path, shape=(200, 3), chunks=(100, 3), dtype="float64", compressors=[CHECKSUM]
    )
    arr[:] = np.random.default_rng(1).normal(size=(200, 3))
    first, second = np.asarray(arr[:100]), np.asarray(arr[100:])

    def address(x: np.ndarray) -> int:
        return int(x.__array_interface__["data"][0])

    x0 = read_rows(path, 0, 100, reuse=True)
    x1 = read_rows(path, 100, 200, reuse=True)  # x0 still held: a new array
    assert address(x1) != address(x0)
    assert np.array_equal(x0, first) and np.array_equal(x1, second)
    held = address(x1)
    del x0, x1
    x2 = read_rows(path, 0, 100, reuse=True)  # nothing refers to the last one: reused
    assert address(x2) == held and np.array_equal(x2, first)
    view = x2[10:20]
    del x2
    x3 = read_rows(path, 100, 200, reuse=True)  # a view keeps it: a new array
    assert address(x3) != held
    assert np.array_equal(view, first[10:20]) and np.array_equal(x3, second)


@pytest.mark.parametrize("dtype", ["float64", "int64", "bool", "int16"])
@pytest.mark.parametrize("codec", ["none", "blosc", "checked", "record"])
def test_write_rows_equals_zarr(tmp_path: Path, dtype: str, codec: str) -> None:
    """Rows written by ``write_rows`` (whole chunks and the last chunk's rows directly, other
    ranges through zarr) read back by zarr and by ``read_rows`` as a NumPy reference holds
    them; a rewrite of a chunk replaces it whole."""
    n, cr = 250, 100
    shape: tuple[int, ...] = (n, 3) if dtype == "float64" else (n,)
    path = str(tmp_path / "a")
    zarr.create_array(
        path,
        shape=shape,
        chunks=(cr, *shape[1:]),
        dtype=dtype,
        fill_value=-1 if dtype.startswith("int") else 0,
        compressors=codecs(codec),
    )
    ref = np.asarray(zarr.open_array(path, mode="r")[:]).copy()
    rng = np.random.default_rng(1)
    for a, b in [(0, 100), (200, 250), (100, 200), (30, 70), (0, 100), (150, 260), (100, 150)]:
        b = min(b, n)
        vals = (rng.normal(size=(b - a, *shape[1:])) * 5).astype(dtype)
        write_rows(path, a, b, vals)
        ref[a:b] = vals
        assert np.array_equal(np.asarray(zarr.open_array(path, mode="r")[:]), ref)
        for ra, rb in [(0, 100), (100, 200), (200, 250), (0, 250)]:
            assert np.array_equal(read_rows(path, ra, rb), ref[ra:rb])
    assert not [f for f in (tmp_path / "a").rglob("*.tmp")]


@pytest.mark.parametrize("codec", ["checked", "record"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
@pytest.mark.parametrize("whole", [True, False])
def test_a_damaged_chunk_is_an_error_naming_it(
    tmp_path: Path, codec: str, damage: str, whole: bool
) -> None:
    """A chunk changed after it was written (one bit flipped, bytes cut off or added) is a
    ``StorageError`` naming the array and chunk, read directly (``whole``) or through zarr;
    the other chunks read as written."""
    path = str(tmp_path / "a")
    vals = np.arange(500.0).reshape(250, 2)
    zarr.create_array(
        path, shape=(250, 2), chunks=(100, 2), dtype="float64", compressors=codecs(codec)
    )
    write_rows(path, 0, 100, vals[:100])
    write_rows(path, 100, 200, vals[100:200])
    f = tmp_path / "a" / "c" / "1" / "0"
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x08
    f.write_bytes(
        bytes(data[:-3])
        if damage == "truncate"
        else bytes(data) + (b"\0" if damage == "extend" else b"")
    )
    a, b = (100, 200) if whole else (150, 160)
    with pytest.raises(
        StorageError, match=f"^{path}: chunk 1 is damaged .* since written; run the command again"
    ):
        read_rows(path, a, b)
    assert np.array_equal(read_rows(path, 0, 100), vals[:100])
    # any read of an array through ``Store.array`` (a whole column, a fancy selection) names the
    # damaged chunk among those it read
    with pytest.raises(StorageError, match=f"^{path}: chunk 1 is damaged \\(checksum\\)"):
        Store(tmp_path).array("a")[:]
    with pytest.raises(StorageError, match="chunk 1 is damaged"):
        Store(tmp_path).array("a").get_orthogonal_selection(([5, 150], slice(None)))
    assert np.array_equal(Store(tmp_path).array("a")[:100], vals[:100])


def test_open_array_sees_an_array_created_again(tmp_path: Path) -> None:
    """The per-process cache of opened arrays never serves an array that was replaced at the
    same path (new shape, new chunks, new values)."""
    path = str(tmp_path / "a")
    zarr.create_array(path, shape=(10,), chunks=(5,), dtype="int64", fill_value=-1)[:] = 1
    assert open_array(path, "r") is open_array(path, "r")
    assert np.array_equal(read_rows(path, 0, 5), np.ones(5))
    arr = zarr.create_array(
        path, shape=(12, 2), chunks=(4, 2), dtype="float64", fill_value=0, overwrite=True
    )
    arr[:] = 2.0
    assert open_array(path, "r").shape == (12, 2)
    assert np.array_equal(read_rows(path, 4, 8), np.full((4, 2), 2.0))
    open_array(path, "r+")[:4] = 3.0
    assert np.array_equal(np.asarray(zarr.open_array(path, mode="r")[:4]), np.full((4, 2), 3.0))


def test_an_array_in_object_storage_opens_without_asking_for_zarr_2_metadata(
    s3_bucket: str, failing_s3: Any
) -> None:
    """zarr left to guess an array's format also asks for version 2's ``.zarray`` and
    ``.zattrs`` and lists their prefixes: 6 requests to open an array on S3 where 2 do, paid by
    every chunk task of every pass. Here every such request would fail, and none is made."""
    path = f"s3://{s3_bucket}/store/X"
    zarr.create_array(path, shape=(100, 3), chunks=(50, 3), dtype="float64", fill_value=0.0)
    values = np.arange(300.0).reshape(100, 3)
    with failing_s3(1.0, kinds=("503",), match=".za") as f:
        write_rows(path, 50, 100, values[50:])
        open_array(path, "r+")[:50] = values[:50]
        got = read_rows(path, 0, 100)
        Store(path.rsplit("/", 1)[0]).array("X")[:]
    assert f.total == 0, f.injected
    assert f.requests > 0
    np.testing.assert_array_equal(got, values)


@given(st.integers(1, 10**9), st.integers(1, 200_000))
def test_balanced_chunk_rows(n_rows: int, chunk_rows: int) -> None:
    """At most ``chunk_rows`` rows a chunk; 32 chunks or more: the count rounded up to a
    multiple of g (the largest power of two at most a quarter of the count), exactly where
    chunks are not tiny, and never more than that."""
    rows = balanced_chunk_rows(n_rows, chunk_rows)
    assert 1 <= rows <= chunk_rows
    plain = -(-n_rows // chunk_rows)
    count = -(-n_rows // rows)
    g = 1 << max(0, (plain // 4).bit_length() - 1)
    if g < 8:
        assert rows == chunk_rows
        return
    target = -(-plain // g) * g
    assert count <= target < plain + g
    # rows = ceil(n / target) gives more than target - target^2 / n chunks: exactly target
    # once a chunk has at least target rows (1,024 chunks of 97,657 rows for 10^8)
    if n_rows >= target * target:
        assert count == target


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
