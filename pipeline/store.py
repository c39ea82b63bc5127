"""The run's zarr store: ingest of the records, their labels and the checkpoints.

Layout of ``OUT/store.zarr`` (a zarr v3 group; rows chunked by ``chunk_rows``)
-------------------------------------------------------------------------
``X`` (N, D) float64
    The encoded records, columns in the family's group order (``ProductFamily.arrange``), so a
    chunk is handed to the kernels as it is read.
``holdout`` (N,) bool
    Held-out rows: ``row_uniform(i, HOLDOUT_SALT) < holdout`` (a hash of the row index, so the
    split does not depend on the chunking, the workers or the run).
``z0``, ``z1`` (N,) int64
    Double-buffered labels: pass p reads the buffer pass p - 1 wrote and writes the other one,
    so a re-executed chunk task reads the same input and writes the same output.
``info.pkl``
    What ingest learned (``StoreInfo``: schema, family, sizes, data moments, the prior's sample),
    written last: its presence means ingest completed.
``checkpoint.pkl`` / ``checkpoint.json``
    The driver's state after the last completed pass (``pipeline.distributed.PassState``),
    replaced atomically after every pass.

Ingest runs as Dask tasks, one per piece of the input: a piece is read, validated with the rules
and messages of ``pipeline.schema`` / the families (prefixed with the file and the row in that
file), encoded and written by the task; the driver only adds the pieces' row counts and
additive moments (count, sum, sum of outer products, minimum and maximum over the training rows)
and never holds the whole input. Sources of known length (``.npy``, zarr, numpy / pandas /
dask arrays) are read one output chunk per task; CSV, Parquet and dask DataFrames, whose pieces
have unknown lengths, are first written to a staging area, then gathered into chunks.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import pickle
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import zarr
from numpy.typing import NDArray

from pipeline.config import DEFAULT_CHUNK_ROWS, PRIOR_SAMPLE
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.schema import Schema, as_frame

CSV_BLOCK_BYTES = 32 * 2**20
HOLDOUT_SALT = 0x5EED_0001
SAMPLE_SALT = 0x5EED_0002
PLOT_SALT = 0x5EED_0003
NO_ROWS = "X has no rows (0 samples); at least 1 is required"

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]


# -- hashing of row indices ------------------------------------------------------------------


def row_uniform(rows: IntArray, salt: int) -> FloatArray:
    """A uniform number in [0, 1) for each row index: splitmix64 of (row, salt).

    Depends on the row index only, so any chunking of the rows draws the same numbers.
    """
    offset = (int(salt) * 0xD1B54A32D192ED03 + 0x9E3779B97F4A7C15) % 2**64
    z = np.asarray(rows, dtype=np.uint64) + np.uint64(offset)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def holdout_mask(start: int, stop: int, fraction: float) -> BoolArray:
    """Held-out flags of rows start..stop-1 (see the module docstring)."""
    return holdout_mask_of(np.arange(start, stop), fraction)


def holdout_mask_of(rows: IntArray, fraction: float) -> BoolArray:
    """Held-out flags of the given row indices."""
    if fraction <= 0.0:
        return np.zeros(np.shape(rows), dtype=bool)
    return row_uniform(rows, HOLDOUT_SALT) < fraction


# -- moments -------------------------------------------------------------------------------


@dataclass
class Moments:
    """Additive data moments of encoded rows (columns in the store's order): the sum of two
    chunks' moments is the moments of their union (min / max combine as min / max)."""

    n: float
    total: FloatArray
    outer: FloatArray
    lo: FloatArray
    hi: FloatArray

    @classmethod
    def of(cls, X: FloatArray) -> Moments:
        d = X.shape[1]
        if X.shape[0] == 0:
            return cls(0.0, np.zeros(d), np.zeros((d, d)), np.full(d, np.inf), np.full(d, -np.inf))
        return cls(float(X.shape[0]), X.sum(axis=0), X.T @ X, X.min(axis=0), X.max(axis=0))

    def __add__(self, other: Moments) -> Moments:
        return Moments(
            self.n + other.n,
            self.total + other.total,
            self.outer + other.outer,
            np.minimum(self.lo, other.lo),
            np.maximum(self.hi, other.hi),
        )

    @property
    def mean(self) -> FloatArray:
        return self.total / max(self.n, 1.0)

    @property
    def cov(self) -> FloatArray:
        """Unbiased covariance (as ``np.cov``)."""
        m = self.mean
        return (self.outer - self.n * np.outer(m, m)) / max(self.n - 1.0, 1.0)


# -- what ingest learned --------------------------------------------------------------------


@dataclass
class StoreInfo:
    """Everything later steps need to know about the ingested records."""

    source: str
    n_rows: int
    n_cols: int
    chunk_rows: int
    holdout: float
    schema: Schema
    family: ProductFamily
    n_train: int
    moments: Moments
    sample: FloatArray  # rows of the prior's sample, schema column order
    sample_rows: IntArray
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    label_column: str | None = None

    @property
    def n_chunks(self) -> int:
        return max(1, -(-self.n_rows // self.chunk_rows))

    def chunk_bounds(self, c: int) -> tuple[int, int]:
        a = c * self.chunk_rows
        return a, min(a + self.chunk_rows, self.n_rows)

    @property
    def names(self) -> list[str]:
        """Column names in the store's (arranged) order."""
        return [self.schema.columns[j] for j in self.family.column_order]


class Store:
    """A run's zarr store (module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    # arrays ---------------------------------------------------------------------------------
    def array(self, name: str, mode: str = "r") -> Any:
        return zarr.open_array(str(self.path / name), mode=mode)

    def create_arrays(
        self, n_rows: int, n_cols: int, chunk_rows: int, labels: bool = False
    ) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        zarr.open_group(str(self.path), mode="a")
        zarr.create_array(
            str(self.path / "X"),
            shape=(n_rows, n_cols),
            chunks=(chunk_rows, n_cols),
            dtype="float64",
            compressors=None,
            overwrite=True,
        )
        zarr.create_array(
            str(self.path / "holdout"),
            shape=(n_rows,),
            chunks=(chunk_rows,),
            dtype="bool",
            fill_value=False,
            overwrite=True,
        )
        for name in ("z0", "z1", *(("y",) if labels else ())):
            zarr.create_array(
                str(self.path / name),
                shape=(n_rows,),
                chunks=(chunk_rows,),
                dtype="int64",
                fill_value=-1,
                overwrite=True,
            )

    # small files, replaced atomically -------------------------------------------------------
    def _write_atomic(self, name: str, data: bytes) -> None:
        tmp = self.path / f".{name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path / name)

    def save(self, name: str, obj: Any) -> None:
        self._write_atomic(name, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def load(self, name: str) -> Any:
        with open(self.path / name, "rb") as fh:
            return pickle.load(fh)

    def exists(self, name: str) -> bool:
        return (self.path / name).exists()

    def save_text(self, name: str, text: str) -> None:
        self._write_atomic(name, text.encode())

    @property
    def info(self) -> StoreInfo:
        info = self.load("info.pkl")
        assert isinstance(info, StoreInfo)
        return info


# -- input sources ---------------------------------------------------------------------------


from pipeline.errors import InputError  # noqa: E402  (re-exported: the ingest raises it)

_ROW = re.compile(r"\brow (\d+)\b")


def _shift_row(msg: str, offset: int) -> str:
    """The first "row N" of a message as "row N + offset"."""
    return _ROW.sub(lambda m: f"row {int(m.group(1)) + offset}", msg, count=1)


def _located(label: str, row0: int | None, err: Exception) -> InputError:
    """``err``'s message (one line) with the file prefixed and chunk-local rows made file rows."""
    msg = " ".join(str(err).split())
    if row0:
        msg = _shift_row(msg, row0)
    return InputError(f"{label}: {msg}")


@dataclass
class Piece:
    """One ingest task's share of the input: rows [row0, row0 + n) of file ``label``
    (``n`` None when unknown before reading) and how to read them."""

    index: int
    label: str
    kind: str
    args: tuple[Any, ...]
    row0: int | None = None
    n: int | None = None


def _npy_source(path: Path) -> tuple[int, int]:
    arr = np.load(path, mmap_mode="r")
    if arr.ndim != 2:
        raise InputError(f"{path}: expected a 2-D array (n_samples, n_features), got {arr.shape}")
    return int(arr.shape[0]), int(arr.shape[1])


def _csv_blocks(path: Path, block: int) -> list[tuple[int, int]]:
    """Byte ranges of the data lines of a CSV file, split at line ends near multiples of
    ``block`` (quoted fields holding line breaks are not supported)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.readline()
        start = len(header)
        bounds = [start]
        pos = start + block
        while pos < size:
            fh.seek(pos)
            fh.readline()
            nxt = fh.tell()
            if nxt >= size:
                break
            if nxt > bounds[-1]:
                bounds.append(nxt)
            pos = nxt + block
    bounds.append(size)
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a] or [(start, start)]


def _parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if not files:
            raise InputError(f"{path}: no .parquet files in this directory")
        return files
    return [path]


IN_MEMORY = ("frame", "array", "delayed")


def read_piece(
    piece: Piece, columns: Sequence[str] | None, data: Any = None
) -> tuple[pd.DataFrame, bool]:
    """The piece's rows as a DataFrame and whether they came with column names.

    ``data`` is the piece's in-memory rows for the kinds in ``IN_MEMORY`` (a worker receives
    them as a scattered or computed future); by default they are taken from the piece itself.
    """
    kind = piece.kind
    try:
        if kind == "npy":
            path, a, b = piece.args
            arr = np.load(path, mmap_mode="r")[a:b]
            return as_frame(np.asarray(arr), columns)[0], False
        if kind == "zarr":
            path, a, b = piece.args
            arr = zarr.open_array(path, mode="r")[a:b]
            return as_frame(np.asarray(arr), columns)[0], False
        if kind == "csv":
            path, a, b = piece.args
            with open(path, "rb") as fh:
                header = fh.readline()
                fh.seek(a)
                body = fh.read(b - a)
            if not header.strip():
                raise InputError(f"{piece.label}: the file is empty (no header line)")
            df = pd.read_csv(io.BytesIO(header + body))
            return df, True
        if kind == "parquet":
            import pyarrow.parquet as pq

            path, rg = piece.args
            table = pq.ParquetFile(path).read_row_group(rg)
            return table.to_pandas(), True
        if kind in IN_MEMORY:
            obj = data
            if obj is None:
                (obj,) = piece.args
                if kind == "delayed":
                    obj = obj.compute(scheduler="sync")
            if isinstance(obj, pd.DataFrame):
                return as_frame(obj)
            return as_frame(np.asarray(obj), columns)[0], False
    except InputError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError) as err:
        msg = " ".join(str(err).split())
        raise InputError(
            f"{piece.label}: rows from {piece.row0 or 0} cannot be read: {msg}"
        ) from err
    except Exception as err:  # pyarrow / pandas parser / codec errors
        raise InputError(
            f"{piece.label}: rows from {piece.row0 or 0} cannot be read "
            f"({type(err).__name__}: {' '.join(str(err).split())})"
        ) from err
    raise AssertionError(kind)


@dataclass
class Source:
    """An input, cut into pieces. ``aligned`` pieces are the output chunks themselves."""

    description: str
    pieces: list[Piece]
    aligned: bool
    from_frame: bool


def open_source(obj: Any, chunk_rows: int) -> Source:
    """Cut an input into ingest pieces.

    ``obj`` is a path (CSV; Parquet file or directory; ``.npy``; a zarr array) or, from Python,
    a numpy array, pandas DataFrame, dask array or dask DataFrame.
    """
    # a dask collection can only come from an imported dask; importing dask.array and
    # dask.dataframe just to test for one costs the driver most of a second
    da = sys.modules.get("dask.array")
    dd = sys.modules.get("dask.dataframe")
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        name = path.name.lower()
        if name.endswith(".npy"):
            n, _d = _npy_source(path)
            return _aligned(str(path), n, chunk_rows, "npy", str(path), from_frame=False)
        if (path / "zarr.json").exists() or (path / ".zarray").exists():
            try:
                arr = zarr.open_array(str(path), mode="r")
            except Exception as err:
                raise InputError(f"{path}: not a readable zarr array ({err})") from err
            if arr.ndim != 2:
                raise InputError(f"{path}: expected a 2-D zarr array, got shape {arr.shape}")
            return _aligned(str(path), int(arr.shape[0]), chunk_rows, "zarr", str(path), False)
        if name.endswith((".parquet", ".pq")) or path.is_dir():
            import pyarrow.parquet as pq

            pieces: list[Piece] = []
            for f in _parquet_files(path):
                try:
                    meta = pq.ParquetFile(f).metadata
                except Exception as err:  # pyarrow raises its own errors
                    raise InputError(f"{f}: not a readable Parquet file ({err})") from err
                row0 = 0
                for rg in range(meta.num_row_groups):
                    n = meta.row_group(rg).num_rows
                    pieces.append(Piece(len(pieces), str(f), "parquet", (str(f), rg), row0, n))
                    row0 += n
            if not pieces or sum(p.n or 0 for p in pieces) == 0:
                raise InputError(f"{path}: {NO_ROWS}")
            return Source(str(path), pieces, aligned=False, from_frame=True)
        if name.endswith((".csv", ".csv.txt", ".txt", ".tsv")) or path.is_file():
            if path.stat().st_size == 0:
                raise InputError(f"{path}: the file is empty")
            blocks = _csv_blocks(path, CSV_BLOCK_BYTES)
            pieces = [
                Piece(i, str(path), "csv", (str(path), a, b), 0 if i == 0 else None)
                for i, (a, b) in enumerate(blocks)
            ]
            return Source(str(path), pieces, aligned=False, from_frame=True)
        raise InputError(f"{path}: unrecognised input (expected CSV, Parquet, .npy or zarr)")
    if da is not None and isinstance(obj, da.Array):
        if obj.ndim != 2:
            raise InputError(f"dask array: expected 2-D (n_samples, n_features), got {obj.shape}")
        if any(math.isnan(c) for c in obj.chunks[0]):
            raise InputError("dask array: the row chunk sizes must be known (compute_chunk_sizes)")
        arr = obj.rechunk((chunk_rows, obj.shape[1]))
        blocks = arr.to_delayed().ravel()
        pieces = [
            Piece(i, "dask array", "delayed", (b,), i * chunk_rows, arr.chunks[0][i])
            for i, b in enumerate(blocks)
        ]
        return Source("dask array", pieces, aligned=True, from_frame=False)
    if dd is not None and isinstance(obj, dd.DataFrame):
        parts = obj.to_delayed()
        pieces = [Piece(i, "dask DataFrame", "delayed", (p,)) for i, p in enumerate(parts)]
        pieces[0].row0 = 0
        return Source("dask DataFrame", pieces, aligned=False, from_frame=True)
    if isinstance(obj, pd.DataFrame):
        n = obj.shape[0]
        pieces = [
            Piece(
                i, "DataFrame", "frame", (obj.iloc[a : a + chunk_rows],), a, min(chunk_rows, n - a)
            )
            for i, a in enumerate(range(0, max(n, 1), chunk_rows))
        ]
        return Source("DataFrame", pieces, aligned=True, from_frame=True)
    arr_ = np.asarray(obj)
    if arr_.ndim != 2:
        raise InputError(f"array: expected 2-D (n_samples, n_features), got shape {arr_.shape}")
    n = arr_.shape[0]
    pieces = [
        Piece(i, "array", "array", (arr_[a : a + chunk_rows],), a, min(chunk_rows, n - a))
        for i, a in enumerate(range(0, max(n, 1), chunk_rows))
    ]
    return Source("array", pieces, aligned=True, from_frame=False)


def _aligned(label: str, n: int, chunk_rows: int, kind: str, path: str, from_frame: bool) -> Source:
    if n == 0:
        raise InputError(f"{label}: {NO_ROWS}")
    pieces = [
        Piece(i, label, kind, (path, a, min(a + chunk_rows, n)), a, min(chunk_rows, n - a))
        for i, a in enumerate(range(0, n, chunk_rows))
    ]
    return Source(label, pieces, aligned=True, from_frame=from_frame)


# -- the ingest tasks ------------------------------------------------------------------------


def label_codes(values: Any) -> IntArray:
    """int64 codes of true labels that agree across chunks: an integral finite number is its
    value, anything else (strings, NaN, fractions) a 64-bit hash of its text."""
    ser = pd.Series(values)
    out = np.empty(ser.shape[0], dtype=np.int64)
    if pd.api.types.is_numeric_dtype(ser.dtype) and not pd.api.types.is_bool_dtype(ser.dtype):
        v = ser.to_numpy(dtype=np.float64, na_value=np.nan)
        whole = np.isfinite(v) & (v == np.round(v)) & (np.abs(v) < 2**62)
        out[whole] = v[whole].astype(np.int64)
        rest = ~whole
        if rest.any():
            text = np.asarray([str(x) for x in v[rest]], dtype=object)
            out[rest] = pd.util.hash_array(text).view(np.int64)
        return out
    text = np.asarray([str(x) for x in ser.to_numpy(dtype=object)], dtype=object)
    return np.asarray(pd.util.hash_array(text).view(np.int64), dtype=np.int64)


@dataclass
class Encoder:
    """What every ingest task needs to validate and encode its rows (sent to the workers)."""

    schema: Schema
    checker: ProductFamily  # families fitted to the first piece: only their support checks
    from_frame: bool
    label_column: str | None = None

    def take_labels(self, df: pd.DataFrame, label: str) -> IntArray | None:
        """Remove the label column from ``df`` (in place) and return its codes
        (``label_codes``); None without a label column."""
        if self.label_column is None:
            return None
        if self.label_column not in df.columns:
            raise InputError(f"{label}: no label column {self.label_column!r}")
        return label_codes(df.pop(self.label_column))

    def encode(self, df: pd.DataFrame, label: str, row0: int | None) -> FloatArray:
        """Encoded rows (n, D) in the store's column order, or an ``InputError`` naming the
        file and the row."""
        try:
            df = self.schema.check_columns(df, self.from_frame, "the first chunk")
            Xe = self.schema.encode(df, fitting=False)
            self.schema.check_values(self.checker, Xe)
        except ValueError as err:
            raise _located(label, row0, err) from err
        return self.checker.arrange(Xe)


def _chunk_summary(
    Xa: FloatArray, a: int, holdout: float, sample_rate: float, unarrange: IntArray
) -> tuple[BoolArray, Moments, FloatArray, IntArray]:
    """Held-out flags, training moments and prior-sample rows of chunk rows a.. (arranged)."""
    n = Xa.shape[0]
    hold = holdout_mask(a, a + n, holdout)
    train = Xa[~hold]
    rows = np.arange(a, a + n)[~hold]
    pick = row_uniform(rows, SAMPLE_SALT) < sample_rate
    return hold, Moments.of(train), train[pick][:, unarrange], rows[pick]


@dataclass
class PieceResult:
    index: int
    n: int
    error: str | None = None
    moments: Moments | None = None
    sample: FloatArray | None = None
    sample_rows: IntArray | None = None


def _write_chunk(
    store: str, a: int, Xa: FloatArray, hold: BoolArray, y: IntArray | None = None
) -> None:
    zarr.open_array(f"{store}/X", mode="r+")[a : a + Xa.shape[0]] = Xa
    zarr.open_array(f"{store}/holdout", mode="r+")[a : a + Xa.shape[0]] = hold
    if y is not None:
        zarr.open_array(f"{store}/y", mode="r+")[a : a + Xa.shape[0]] = y


def ingest_aligned_task(
    store: str, piece: Piece, enc: Encoder, holdout: float, sample_rate: float, data: Any = None
) -> PieceResult:
    """Read, validate, encode and write one output chunk; its moments and sample rows."""
    try:
        df, _ = read_piece(piece, enc.schema.columns, data)
        y = enc.take_labels(df, piece.label)
        Xa = enc.encode(df, piece.label, piece.row0)
    except InputError as err:
        return PieceResult(piece.index, 0, error=str(err))
    a = int(piece.row0 or 0)
    hold, mom, sample, rows = _chunk_summary(
        Xa, a, holdout, sample_rate, np.argsort(enc.checker.column_order)
    )
    _write_chunk(store, a, Xa, hold, y)
    return PieceResult(piece.index, Xa.shape[0], None, mom, sample, rows)


def stage_piece_task(store: str, piece: Piece, enc: Encoder, data: Any = None) -> PieceResult:
    """Read, validate and encode a piece of unknown length into ``staging/<index>``."""
    try:
        df, _ = read_piece(piece, enc.schema.columns, data)
        if df.shape[0] == 0:
            return PieceResult(piece.index, 0)
        y = enc.take_labels(df, piece.label)
        Xa = enc.encode(df, piece.label, piece.row0)
    except InputError as err:
        return PieceResult(piece.index, -1, error=str(err))
    zarr.create_array(
        f"{store}/staging/{piece.index}",
        data=Xa,
        chunks=Xa.shape,
        compressors=None,
        overwrite=True,
    )
    if y is not None:
        zarr.create_array(f"{store}/staging/y{piece.index}", data=y, chunks=y.shape, overwrite=True)
    return PieceResult(piece.index, Xa.shape[0])


def gather_chunk_task(
    store: str,
    a: int,
    b: int,
    spans: list[tuple[int, int, int]],
    holdout: float,
    sample_rate: float,
    unarrange: IntArray,
    labels: bool = False,
) -> PieceResult:
    """Copy staged rows [a, b) into X (spans: (piece, start, stop) within each staged piece)."""
    parts = [
        np.asarray(zarr.open_array(f"{store}/staging/{p}", mode="r")[s:e]) for p, s, e in spans
    ]
    Xa = np.concatenate(parts) if len(parts) > 1 else parts[0]
    y = None
    if labels:
        y = np.concatenate(
            [
                np.asarray(zarr.open_array(f"{store}/staging/y{p}", mode="r")[s:e])
                for p, s, e in spans
            ]
        )
    hold, mom, sample, rows = _chunk_summary(Xa, a, holdout, sample_rate, unarrange)
    _write_chunk(store, a, Xa, hold, y)
    return PieceResult(a, b - a, None, mom, sample, rows)


# -- the driver of ingest ----------------------------------------------------------------------


def _first_error(results: Sequence[PieceResult]) -> None:
    for r in sorted(results, key=lambda r: r.index):
        if r.error is not None:
            raise InputError(r.error)


def _infer(
    first: pd.DataFrame, from_frame: bool, family: Any, label: str
) -> tuple[Schema, ProductFamily, ProductFamily | None]:
    """Schema from the first piece, the checker families, and the fixed family if given."""
    fixed: ProductFamily | None = None
    try:
        if isinstance(family, (Family, ProductFamily)):
            schema = Schema.infer(first, "gaussian", from_frame)
            fixed = family.as_product() if isinstance(family, Family) else family
            if fixed.n_cols != first.shape[1]:
                raise ValueError(
                    f"X has {first.shape[1]} features, but the family given models {fixed.n_cols}"
                )
            Xe = schema.encode(first, fitting=True)
            schema.check_values(fixed, Xe)
            checker = fixed
        else:
            schema = Schema.infer(first, family, from_frame)
            Xe = schema.encode(first, fitting=True)
            checker = schema.build_family(Xe)
    except ValueError as err:
        raise _located(label, 0, err) from err
    return schema, checker, fixed


def _check_global(schema: Schema, family: ProductFamily, mom: Moments, label: str) -> None:
    """``Schema.check_informative`` over all chunks, from the moments: enough rows, and no
    column of one constant value."""
    n = int(mom.n)
    unarrange = np.argsort(family.column_order)
    extremes = np.vstack([mom.lo, mom.hi])[:, unarrange]
    try:
        if n < 2:
            schema.check_informative(extremes[:n] if n else np.empty((0, extremes.shape[1])))
        schema.check_informative(extremes)
    except (ValueError, IndexError) as err:
        raise InputError(f"{label}: {' '.join(str(err).split())}") from err


def ingest(
    source: Any,
    store: Store,
    *,
    client: Any,
    family: Any = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    holdout: float = 0.0,
    prior_sample: int = PRIOR_SAMPLE,
    progress: Callable[[str, int, int], None] | None = None,
    label_column: str | None = None,
) -> StoreInfo:
    """Validate, encode and write ``source`` into ``store`` with Dask tasks; fit the prior.

    Parameters
    ----------
    source : path or array-like
        See ``open_source``.
    store : Store
        Created (or overwritten) here.
    client : distributed.Client
    family : "auto", kind name, {column: kind} mapping, Family or ProductFamily
        As ``MAPDP(family=...)``. The kinds are inferred from the first piece of the input.
    chunk_rows : int
        Rows per chunk of the store (one task per chunk and pass later).
    holdout : float in [0, 1)
        Fraction of rows held out (hash of the row index).
    prior_sample : int
        The empirical-Bayes prior (``Schema.build_family``) is fitted to about this many
        training rows, drawn by a hash of the row index; all of them when there are fewer.
    label_column : str, optional
        A column of true labels (frames, CSV, Parquet): left out of the fit and stored as codes
        (``label_codes``) in ``y`` for the NMI / ARI of the write-out.

    Returns
    -------
    StoreInfo, also saved as ``store/info.pkl``.
    """
    t0 = time.perf_counter()
    if not (0.0 <= holdout < 1.0):
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    chunk_rows = int(chunk_rows)
    src = open_source(source, chunk_rows)
    first, from_frame = read_piece(src.pieces[0], None)
    if first.shape[0] == 0:
        raise InputError(f"{src.pieces[0].label}: {NO_ROWS}")
    if label_column is not None:
        if not from_frame:
            raise InputError(
                f"{src.pieces[0].label}: --label-column {label_column!r} needs an input with "
                "column names (CSV, Parquet, a DataFrame)"
            )
        if label_column not in first.columns:
            raise InputError(
                f"{src.pieces[0].label}: no column {label_column!r} for the labels; columns: "
                + ", ".join(map(str, first.columns))
            )
        first = first.drop(columns=[label_column])
    schema, checker, fixed = _infer(first, from_frame, family, src.pieces[0].label)
    del first
    enc = Encoder(schema, checker, from_frame, label_column)
    unarrange = np.argsort(checker.column_order)
    D = len(schema.columns)
    if store.path.exists():
        shutil.rmtree(store.path)

    def tell(what: str, done: int, total: int) -> None:
        if progress is not None:
            progress(what, done, total)

    if src.aligned:
        n_rows = sum(int(p.n or 0) for p in src.pieces)
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        store.create_arrays(n_rows, D, chunk_rows, labels=label_column is not None)
        rate = min(1.0, prior_sample / max(n_rows * (1.0 - holdout), 1.0))
        enc_f = client.scatter(enc, broadcast=True, hash=False)
        futs = [
            client.submit(
                ingest_aligned_task,
                str(store.path),
                _bare(p),
                enc_f,
                holdout,
                rate,
                _piece_data(client, p),
                pure=False,
            )
            for p in src.pieces
        ]
        results = _gather(client, futs, "ingest", tell)
        _first_error(results)
    else:
        enc_f = client.scatter(enc, broadcast=True, hash=False)
        futs = [
            client.submit(
                stage_piece_task,
                str(store.path),
                _bare(p),
                enc_f,
                _piece_data(client, p),
                pure=False,
            )
            for p in src.pieces
        ]
        staged = _gather(client, futs, "read", tell)
        _first_staged_error(src, staged)
        counts = [r.n for r in sorted(staged, key=lambda r: r.index)]
        n_rows = int(sum(counts))
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        store.create_arrays(n_rows, D, chunk_rows, labels=label_column is not None)
        rate = min(1.0, prior_sample / max(n_rows * (1.0 - holdout), 1.0))
        ends = np.cumsum(counts)
        starts = ends - np.asarray(counts)
        futs = []
        for a in range(0, n_rows, chunk_rows):
            b = min(a + chunk_rows, n_rows)
            spans = [
                (i, int(max(a, s) - s), int(min(b, e) - s))
                for i, (s, e) in enumerate(zip(starts, ends))
                if e > a and s < b
            ]
            futs.append(
                client.submit(
                    gather_chunk_task,
                    str(store.path),
                    a,
                    b,
                    spans,
                    holdout,
                    rate,
                    unarrange,
                    label_column is not None,
                    pure=False,
                )
            )
        results = _gather(client, futs, "chunk", tell)
        shutil.rmtree(store.path / "staging", ignore_errors=True)
    results = sorted(results, key=lambda r: r.index)
    mom = results[0].moments
    assert mom is not None
    for r in results[1:]:
        assert r.moments is not None
        mom = mom + r.moments
    _check_global(schema, checker, mom, src.description)
    sample = np.concatenate([r.sample for r in results if r.sample is not None])
    sample_rows = np.concatenate([r.sample_rows for r in results if r.sample_rows is not None])
    if fixed is not None:
        prod = fixed
    else:
        try:
            prod = schema.build_family(sample)
        except ValueError as err:
            raise InputError(f"{src.description}: {' '.join(str(err).split())}") from err
    notes = []
    if sample.shape[0] < mom.n:
        notes.append(
            f"empirical-Bayes prior fitted to a hash sample of {sample.shape[0]} of "
            f"{int(mom.n)} training rows"
        )
    info = StoreInfo(
        source=src.description,
        n_rows=n_rows,
        n_cols=D,
        chunk_rows=chunk_rows,
        holdout=float(holdout),
        schema=schema,
        family=prod,
        n_train=int(mom.n),
        moments=mom,
        sample=sample,
        sample_rows=sample_rows,
        seconds=time.perf_counter() - t0,
        notes=notes,
        label_column=label_column,
    )
    store.save("info.pkl", info)
    return info


def _bare(piece: Piece) -> Piece:
    """The piece without its in-memory rows (they travel as a future, ``_piece_data``)."""
    if piece.kind in IN_MEMORY:
        return Piece(piece.index, piece.label, piece.kind, (), piece.row0, piece.n)
    return piece


def _piece_data(client: Any, piece: Piece) -> Any:
    """A future of an in-memory piece's rows, so that no data is embedded in the task graph."""
    if piece.kind not in IN_MEMORY:
        return None
    (obj,) = piece.args
    if piece.kind == "delayed":
        return client.compute(obj)
    return client.scatter(obj, hash=False)


def _first_staged_error(src: Source, staged: Sequence[PieceResult]) -> None:
    """Raise the first piece's error, with the row counted from the start of its file."""
    staged = sorted(staged, key=lambda r: r.index)
    row_in_file: dict[str, int] = {}
    for piece, r in zip(src.pieces, staged):
        off = piece.row0 if piece.row0 is not None else row_in_file.get(piece.label, 0)
        if r.error is not None:
            msg = r.error
            if off and piece.row0 is None:
                # the task counted rows from its own start: shift them to the file's rows
                head = f"{piece.label}: "
                body = msg[len(head) :] if msg.startswith(head) else msg
                body = _shift_row(body, off)
                body = body.replace("rows from 0 ", f"rows from {off} ")
                msg = head + body
            raise InputError(msg)
        row_in_file[piece.label] = off + max(r.n, 0)


def _gather(
    client: Any, futs: list[Any], what: str, tell: Callable[[str, int, int], None]
) -> list[Any]:
    from distributed import as_completed

    out = []
    for done, fut in enumerate(as_completed(futs), start=1):
        out.append(fut.result())
        tell(what, done, len(futs))
    return out


def iter_chunks(info: StoreInfo) -> Iterator[tuple[int, int, int]]:
    """(chunk index, first row, end row) of every chunk."""
    for c in range(info.n_chunks):
        a, b = info.chunk_bounds(c)
        yield c, a, b
