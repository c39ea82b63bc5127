"""The dataset store: ingest of the records, their folds, groups and true labels.

Layout of a store (a zarr v3 group; rows chunked by ``chunk_rows`` = R)
-------------------------------------------------------------------------
``format.json``
    ``{"format": "dpmm-dataset", "version": FORMAT_VERSION, ...}`` and the ingest options,
    written first: ``Store.open_checked`` refuses a store of another version.
``X`` (n_stored, D) float64
    The encoded records, columns in the family's group order (``ProductFamily.arrange``), so a
    chunk is handed to the kernels as it is read.
``fold`` (n_stored,) int16
    The row's cross-validation fold in 0..F-1 (``fold_of``), from the same hash as ``holdout``.
``holdout`` (n_stored,) bool
    Held-out rows: ``u < holdout`` with ``u = row_uniform(key, HOLDOUT_SALT)``, where the key is
    the row index (or the row's group code, below): the split depends on neither the chunking,
    the workers nor the run. With ``holdout = 1/F`` the held-out rows are those of fold 0.
``group``, ``row`` (n_stored,) int64, grouped stores only
    The row's group code 0..G-1 (groups numbered by first appearance) and its row index in the
    input; -1 on padding.
``y`` (n_stored,) int64, with a label column only
    The true labels' codes (``label_codes``).
``info.json`` + ``info.npz``
    What ingest learned (``StoreInfo``: schema, family, sizes, data moments, the prior's sample,
    the chunk plan of a grouped store), a ``pipeline.persist`` record (JSON plus arrays, never a
    pickle) written last: its presence means ingest completed.

A fit's per-record state (labels, random effects...) and its checkpoints live in the fit's own
state store (``pipeline.dist.loop``), so that many fits share one dataset store.

Chunks and groups
-----------------
Chunk c of a store occupies the stored rows ``[c*R, c*R + n_c)`` (``StoreInfo.chunk_bounds``);
zarr chunks are task chunks, so parallel writers never share a zarr chunk. Without a group
column every chunk but the last is full and stored row i is input row i (``n_stored`` =
``n_rows``). With ``group_column``, all rows of a group land in one chunk, in input order;
groups are packed greedily in their order of first appearance, so ``n_c <= R``, and the stored
rows ``[c*R + n_c, (c+1)*R)`` are padding that no reader touches (``iter_chunks`` yields the
valid bounds only). Fold and held-out flag are drawn per group (the key of the hash is the
group's code), so all rows of a group share them.

Ingest runs as Dask tasks, one per piece of the input: a piece is read, validated with the rules
and messages of ``pipeline.schema`` / the families (prefixed with the file and the row in that
file), encoded and written by the task; the driver only adds the pieces' row counts and
additive moments (count, sum, sum of outer products, minimum and maximum over the training rows)
and never holds the whole input. Sources of known length (``.npy``, zarr, numpy / pandas /
dask arrays) are read one output chunk per task; CSV, Parquet and dask DataFrames, whose pieces
have unknown lengths, are first written to a staging area, then gathered into chunks. A grouped
ingest always stages; the driver then reads only the group column's codes (one int64 per row)
to plan the chunks, and one task per output chunk gathers its rows from the staging area.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import pandas as pd
import zarr
from numpy.typing import NDArray

from pipeline import persist
from pipeline.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.schema import Schema, as_frame

CSV_BLOCK_BYTES = 32 * 2**20
HOLDOUT_SALT = 0x5EED_0001
SAMPLE_SALT = 0x5EED_0002
PLOT_SALT = 0x5EED_0003
NO_ROWS = "X has no rows (0 samples); at least 1 is required"
FORMAT_NAME = "dpmm-dataset"
FORMAT_VERSION = 1
FORMAT_FILE = "format.json"
INFO_FILE = "info"
# rows per zarr chunk of a grouped ingest's staging area: a gathering task reads only the
# blocks that hold its rows, and input sorted by group touches few of them
STAGE_BLOCK_ROWS = 8192
MAX_FOLDS = 2**15 - 1  # fold ids are int16

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]
_T = TypeVar("_T")
FoldArray = NDArray[np.int16]


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
    """Held-out flags of the given row indices (or group codes of a grouped store)."""
    if fraction <= 0.0:
        return np.zeros(np.shape(rows), dtype=bool)
    return row_uniform(rows, HOLDOUT_SALT) < fraction


def folds_of_uniform(u: FloatArray, n_folds: int) -> FoldArray:
    """Fold ids 0..n_folds-1 of hash uniforms ``u`` in [0, 1): the interval [j/F, (j+1)/F) that
    holds u, i.e. ``min(floor(u * F), F - 1)``.

    The interval is found by comparing u with the floats ``j / F`` rather than by rounding
    ``u * F``: then fold 0 is exactly ``u < 1 / F``, the held-out test of ``holdout = 1 / F``,
    bit for bit.
    """
    edges = np.arange(1, int(n_folds), dtype=np.float64) / float(n_folds)
    return np.searchsorted(edges, np.asarray(u, dtype=np.float64), side="right").astype(np.int16)


def fold_of(rows_or_group_codes: IntArray, n_folds: int = N_FOLDS) -> FoldArray:
    """Fold ids (int16, 0..n_folds-1) of row indices, or of group codes in a grouped store.

    Parameters
    ----------
    rows_or_group_codes : (n,) int array
        The hash keys: row indices of an ungrouped store, group codes 0..G-1 of a grouped one.
    n_folds : int
        F >= 1.

    Returns
    -------
    (n,) int16 array, ``min(floor(u * F), F - 1)`` with ``u = row_uniform(key, HOLDOUT_SALT)``,
    so that the rows with ``holdout_mask_of(key, 1 / F)`` are those of fold 0.
    """
    n_folds = _check_folds(n_folds)
    return folds_of_uniform(row_uniform(rows_or_group_codes, HOLDOUT_SALT), n_folds)


def _check_folds(n_folds: Any) -> int:
    if isinstance(n_folds, bool) or int(n_folds) != n_folds or not 1 <= int(n_folds) <= MAX_FOLDS:
        raise ValueError(f"n_folds must be an integer in [1, {MAX_FOLDS}], got {n_folds!r}")
    return int(n_folds)


# -- moments -------------------------------------------------------------------------------


@persist.register
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


@persist.register
@dataclass
class StoreInfo:
    """Everything later steps need to know about the ingested records.

    ``n_rows`` is the number of real rows; every per-row array of the store has ``n_stored``
    rows (more than ``n_rows`` in a grouped store, whose chunks end in padding: module
    docstring). ``sample_rows`` are stored positions.
    """

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
    n_folds: int = N_FOLDS
    group_column: str | None = None
    # the groups' values in the input, indexed by group code (JSON scalars: str, int, float)
    group_ids: list[Any] | None = None
    # real rows of each chunk of a grouped store (None: every chunk full but the last)
    chunk_counts: list[int] | None = None

    @property
    def grouped(self) -> bool:
        return self.group_column is not None

    @property
    def n_groups(self) -> int:
        """Number of groups (0 without a group column)."""
        return len(self.group_ids) if self.group_ids is not None else 0

    @property
    def n_chunks(self) -> int:
        if self.chunk_counts is not None:
            return len(self.chunk_counts)
        return max(1, -(-self.n_rows // self.chunk_rows))

    @property
    def n_stored(self) -> int:
        """Length of every per-row array of the store (real rows and padding)."""
        if self.chunk_counts is not None:
            return (len(self.chunk_counts) - 1) * self.chunk_rows + int(self.chunk_counts[-1])
        return self.n_rows

    def chunk_bounds(self, c: int) -> tuple[int, int]:
        """Stored rows [a, b) of the real rows of chunk c."""
        a = c * self.chunk_rows
        if self.chunk_counts is not None:
            return a, a + int(self.chunk_counts[c])
        return a, min(a + self.chunk_rows, self.n_rows)

    @property
    def names(self) -> list[str]:
        """Column names in the store's (arranged) order."""
        return [self.schema.columns[j] for j in self.family.column_order]


class Store:
    """A dataset store (module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    @classmethod
    def open_checked(cls, path: str | os.PathLike[str]) -> Store:
        """The store at ``path`` after checking its ``format.json``.

        Raises
        ------
        ValueError
            No store there, or one of another format version (the message names the path and
            both versions).
        """
        store = cls(path)
        store.check_format()
        return store

    # the format -----------------------------------------------------------------------------
    def write_format(self, **extra: Any) -> None:
        """Write ``format.json`` (the format name and version, and ``extra``)."""
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **extra}
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_atomic(FORMAT_FILE, (json.dumps(meta, indent=1, default=str) + "\n").encode())

    def read_format(self) -> dict[str, Any]:
        """The contents of ``format.json``, or a ValueError naming the path."""
        f = self.path / FORMAT_FILE
        if not self.path.exists():
            raise ValueError(f"{self.path}: no dataset store here (no such directory)")
        try:
            meta = json.loads(f.read_text())
        except FileNotFoundError:
            raise ValueError(
                f"{self.path}: not a dataset store of format version {FORMAT_VERSION} "
                f"(no {FORMAT_FILE}: written by an older dpmm, or not a store)"
            ) from None
        except (OSError, ValueError) as err:
            raise ValueError(f"{f}: unreadable ({' '.join(str(err).split())})") from err
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise ValueError(f"{f}: not a {FORMAT_NAME} store")
        return meta

    def check_format(self) -> dict[str, Any]:
        """``read_format``, and a ValueError unless the version is ``FORMAT_VERSION``."""
        meta = self.read_format()
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{self.path}: dataset store format version {meta.get('version')!r}, but this "
                f"dpmm reads version {FORMAT_VERSION}; ingest the data again"
            )
        return meta

    # arrays ---------------------------------------------------------------------------------
    def array(self, name: str, mode: str = "r") -> Any:
        return zarr.open_array(str(self.path / name), mode=mode)

    def create_arrays(
        self,
        n_rows: int,
        n_cols: int,
        chunk_rows: int,
        labels: bool = False,
        grouped: bool = False,
    ) -> None:
        """Create the per-row arrays, ``n_rows`` (= ``StoreInfo.n_stored``) rows chunked by
        ``chunk_rows``: X, fold, holdout, and y (``labels``), group and row
        (``grouped``)."""
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
        zarr.create_array(
            str(self.path / "fold"),
            shape=(n_rows,),
            chunks=(chunk_rows,),
            dtype="int16",
            fill_value=-1,
            overwrite=True,
        )
        names = (*(("y",) if labels else ()), *(("group", "row") if grouped else ()))
        for name in names:
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
        persist.write_atomic(self.path / name, data)

    def save(self, name: str, obj: Any) -> None:
        """Write ``obj`` as the record ``name`` (``name.json`` + ``name.npz``, ``persist.save``)."""
        persist.save(self.path, name, obj)

    @overload
    def load(self, name: str, expect: None = None) -> Any: ...

    @overload
    def load(self, name: str, expect: type[_T]) -> _T: ...

    def load(self, name: str, expect: type[Any] | None = None) -> Any:
        """The record ``name`` read back (``persist.load``; ``PersistError`` naming the file)."""
        return persist.load(self.path, name, expect)

    def exists(self, name: str) -> bool:
        """Whether the record ``name`` was completely written."""
        return persist.exists(self.path, name)

    def remove(self, name: str) -> None:
        """Delete the record ``name`` if present."""
        persist.remove(self.path, name)

    def save_text(self, name: str, text: str) -> None:
        self._write_atomic(name, text.encode())

    @property
    def info(self) -> StoreInfo:
        return self.load(INFO_FILE, StoreInfo)


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
    piece: Piece,
    columns: Sequence[str] | None,
    data: Any = None,
    text_columns: Sequence[str] = (),
) -> tuple[pd.DataFrame, bool]:
    """The piece's rows as a DataFrame and whether they came with column names.

    ``data`` is the piece's in-memory rows for the kinds in ``IN_MEMORY`` (a worker receives
    them as a scattered or computed future); by default they are taken from the piece itself.
    ``text_columns`` of a CSV file are read as text: a group key "007" stays "007" in every
    block, whatever the other values of its block look like.
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
            dtype = {c: str for c in text_columns} if text_columns else None
            df = pd.read_csv(io.BytesIO(header + body), dtype=dtype)
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


def _json_scalar(v: Any) -> Any:
    """A group value as a JSON scalar: numbers and strings as they are, anything else as text."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return v
    return str(v)


@dataclass
class Encoder:
    """What every ingest task needs to validate and encode its rows (sent to the workers)."""

    schema: Schema
    checker: ProductFamily  # families fitted to the first piece: only their support checks
    from_frame: bool
    label_column: str | None = None
    group_column: str | None = None

    def take_labels(self, df: pd.DataFrame, label: str) -> IntArray | None:
        """Remove the label column from ``df`` (in place) and return its codes
        (``label_codes``); None without a label column."""
        if self.label_column is None:
            return None
        if self.label_column not in df.columns:
            raise InputError(f"{label}: no label column {self.label_column!r}")
        return label_codes(df.pop(self.label_column))

    def take_groups(
        self, df: pd.DataFrame, label: str, row0: int | None
    ) -> tuple[list[Any], IntArray] | None:
        """Remove the group column from ``df`` (in place); its distinct values in order of
        first appearance (JSON scalars) and each row's index into them. None without a group
        column; an ``InputError`` naming the column and the row for a missing value."""
        if self.group_column is None:
            return None
        col = self.group_column
        if col not in df.columns:
            raise InputError(f"{label}: no group column {col!r}")
        codes, uniques = pd.factorize(df.pop(col), sort=False)
        values = [_json_scalar(v) for v in uniques.tolist()]
        # NaN / None get code -1; a blank text is tested once per distinct value, not per row
        blank = np.asarray([isinstance(v, str) and not v.strip() for v in values], dtype=bool)
        missing = (codes < 0) | (blank[codes] if blank.any() else False)
        if np.any(missing):
            i = int(np.argmax(missing))
            err = ValueError(
                f"column {col!r}: row {i} has no group value (a group key cannot be missing)"
            )
            raise _located(label, row0, err) from None
        return values, codes.astype(np.int64)

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


@dataclass
class ChunkSummary:
    """What ingest writes and returns for one chunk besides X (``_chunk_summary``)."""

    hold: BoolArray
    fold: FoldArray
    moments: Moments
    sample: FloatArray
    sample_rows: IntArray


def _chunk_summary(
    Xa: FloatArray,
    keys: IntArray,
    rows: IntArray,
    positions: IntArray,
    holdout: float,
    n_folds: int,
    sample_rate: float,
    unarrange: IntArray,
) -> ChunkSummary:
    """Held-out flags, folds, training moments and prior-sample rows of a chunk (arranged).

    ``keys`` are the hash keys of fold and held-out flag (row indices, or group codes), ``rows``
    the input row indices (the key of the prior sample's hash) and ``positions`` the stored
    rows reported as ``sample_rows``.
    """
    u = row_uniform(keys, HOLDOUT_SALT)
    hold = u < holdout if holdout > 0.0 else np.zeros(Xa.shape[0], dtype=bool)
    train = Xa[~hold]
    pick = row_uniform(rows[~hold], SAMPLE_SALT) < sample_rate
    return ChunkSummary(
        hold,
        folds_of_uniform(u, n_folds),
        Moments.of(train),
        train[pick][:, unarrange],
        positions[~hold][pick],
    )


@dataclass
class PieceResult:
    index: int
    n: int
    error: str | None = None
    moments: Moments | None = None
    sample: FloatArray | None = None
    sample_rows: IntArray | None = None
    # a grouped ingest's staged piece: the group values in order of first appearance and each
    # row's index into them
    group_values: list[Any] | None = None
    group_index: IntArray | None = None


def _result(index: int, n: int, summ: ChunkSummary) -> PieceResult:
    return PieceResult(index, n, None, summ.moments, summ.sample, summ.sample_rows)


def _write_chunk(
    store: str,
    a: int,
    Xa: FloatArray,
    summ: ChunkSummary,
    y: IntArray | None = None,
    groups: tuple[IntArray, IntArray] | None = None,
) -> None:
    """Write a chunk's rows at stored rows a.. (``groups``: the group codes and input rows)."""
    b = a + Xa.shape[0]
    zarr.open_array(f"{store}/X", mode="r+")[a:b] = Xa
    zarr.open_array(f"{store}/holdout", mode="r+")[a:b] = summ.hold
    zarr.open_array(f"{store}/fold", mode="r+")[a:b] = summ.fold
    if y is not None:
        zarr.open_array(f"{store}/y", mode="r+")[a:b] = y
    if groups is not None:
        zarr.open_array(f"{store}/group", mode="r+")[a:b] = groups[0]
        zarr.open_array(f"{store}/row", mode="r+")[a:b] = groups[1]


def ingest_aligned_task(
    store: str,
    piece: Piece,
    enc: Encoder,
    holdout: float,
    sample_rate: float,
    data: Any = None,
    n_folds: int = N_FOLDS,
) -> PieceResult:
    """Read, validate, encode and write one output chunk; its moments and sample rows."""
    try:
        df, _ = read_piece(piece, enc.schema.columns, data)
        y = enc.take_labels(df, piece.label)
        Xa = enc.encode(df, piece.label, piece.row0)
    except InputError as err:
        return PieceResult(piece.index, 0, error=str(err))
    a = int(piece.row0 or 0)
    rows = np.arange(a, a + Xa.shape[0])
    unarrange = np.argsort(enc.checker.column_order)
    summ = _chunk_summary(Xa, rows, rows, rows, holdout, n_folds, sample_rate, unarrange)
    _write_chunk(store, a, Xa, summ, y)
    return _result(piece.index, Xa.shape[0], summ)


def stage_piece_task(store: str, piece: Piece, enc: Encoder, data: Any = None) -> PieceResult:
    """Read, validate and encode a piece of unknown length into ``staging/<index>`` (and its
    labels into ``staging/y<index>``); a grouped ingest's piece also returns its group column
    (``Encoder.take_groups``)."""
    try:
        groups_as_text = () if enc.group_column is None else (enc.group_column,)
        df, _ = read_piece(piece, enc.schema.columns, data, groups_as_text)
        if df.shape[0] == 0:
            return PieceResult(piece.index, 0, group_values=[], group_index=np.zeros(0, np.int64))
        y = enc.take_labels(df, piece.label)
        groups = enc.take_groups(df, piece.label, piece.row0)
        Xa = enc.encode(df, piece.label, piece.row0)
    except InputError as err:
        return PieceResult(piece.index, -1, error=str(err))
    n = Xa.shape[0]
    # a grouped chunk gathers scattered rows: small blocks let it read only those it needs
    block = n if groups is None else max(1, min(n, STAGE_BLOCK_ROWS))
    zarr.create_array(
        f"{store}/staging/{piece.index}",
        data=Xa,
        chunks=(block, Xa.shape[1]),
        compressors=None,
        overwrite=True,
    )
    if y is not None:
        zarr.create_array(
            f"{store}/staging/y{piece.index}", data=y, chunks=(block,), overwrite=True
        )
    if groups is None:
        return PieceResult(piece.index, n)
    return PieceResult(piece.index, n, group_values=groups[0], group_index=groups[1])


def gather_chunk_task(
    store: str,
    a: int,
    b: int,
    spans: list[tuple[int, int, int]],
    holdout: float,
    sample_rate: float,
    unarrange: IntArray,
    labels: bool = False,
    n_folds: int = N_FOLDS,
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
    rows = np.arange(a, b)
    summ = _chunk_summary(Xa, rows, rows, rows, holdout, n_folds, sample_rate, unarrange)
    _write_chunk(store, a, Xa, summ, y)
    return _result(a, b - a, summ)


def _gather_rows(arr: Any, local: IntArray) -> Any:
    """Rows ``local`` (any order, no repeats) of a zarr array, in that order."""
    order = np.argsort(local, kind="stable")
    sel = (local[order],) + (slice(None),) * (arr.ndim - 1)
    got = np.asarray(arr.get_orthogonal_selection(sel))
    out = np.empty_like(got)
    out[order] = got
    return out


def gather_group_chunk_task(
    store: str,
    c: int,
    a: int,
    rows: IntArray,
    codes: IntArray,
    piece_starts: IntArray,
    holdout: float,
    n_folds: int,
    sample_rate: float,
    unarrange: IntArray,
    labels: bool = False,
) -> PieceResult:
    """Gather a grouped store's chunk c from the staging area and write it at stored rows a...

    Parameters
    ----------
    rows : (n_c,) int64
        The chunk's input row indices in stored order (its groups in order, each group's rows
        in input order).
    codes : (n_c,) int64
        Their group codes: the key of fold and held-out flag.
    piece_starts : (n_pieces,) int64
        The first input row of each staged piece.
    """
    piece = np.searchsorted(piece_starts, rows, side="right") - 1
    Xa = np.empty((rows.shape[0], unarrange.shape[0]), dtype=np.float64)
    y = np.empty(rows.shape[0], dtype=np.int64) if labels else None
    for p in np.unique(piece):
        at = np.flatnonzero(piece == p)
        local = rows[at] - piece_starts[p]
        Xa[at] = _gather_rows(zarr.open_array(f"{store}/staging/{p}", mode="r"), local)
        if y is not None:
            y[at] = _gather_rows(zarr.open_array(f"{store}/staging/y{p}", mode="r"), local)
    positions = np.arange(a, a + rows.shape[0])
    summ = _chunk_summary(Xa, codes, rows, positions, holdout, n_folds, sample_rate, unarrange)
    _write_chunk(store, a, Xa, summ, y, (codes, rows))
    return _result(c, rows.shape[0], summ)


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


def _named_column(first: pd.DataFrame, from_frame: bool, label: str, col: str, what: str) -> None:
    """An ``InputError`` unless the input has column names and a column ``col``."""
    flag = "--label-column" if what == "labels" else "--group-column"
    if not from_frame:
        raise InputError(
            f"{label}: {flag} {col!r} needs an input with column names (CSV, Parquet, a DataFrame)"
        )
    if col not in first.columns:
        raise InputError(
            f"{label}: no column {col!r} for the {what}; columns: "
            + ", ".join(map(str, first.columns))
        )


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
    n_folds: int = N_FOLDS,
    group_column: str | None = None,
    format_extra: dict[str, Any] | None = None,
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
        Fraction of rows held out (hash of the row index, or of the group code).
    prior_sample : int
        The empirical-Bayes prior (``Schema.build_family``) is fitted to about this many
        training rows, drawn by a hash of the row index; all of them when there are fewer.
    label_column : str, optional
        A column of true labels (frames, CSV, Parquet): left out of the fit and stored as codes
        (``label_codes``) in ``y`` for the NMI / ARI of the write-out.
    n_folds : int
        Number F of cross-validation folds of the ``fold`` array (``fold_of``).
    group_column : str, optional
        A column of group keys (frames, CSV, Parquet; a subject, a sequence): not a feature;
        all rows of a group land in one chunk and share their fold and held-out flag (module
        docstring). A group of more than ``chunk_rows`` rows, or a row without a group value,
        is an ``InputError``. The keys of a CSV file are read as text; those of frames and
        Parquet keep their type.
    format_extra : dict, optional
        More entries for ``format.json`` (``pipeline.dataset`` records its key there).

    Returns
    -------
    StoreInfo, also saved as the record ``info`` of the store (``Store.info``).
    """
    t0 = time.perf_counter()
    if not (0.0 <= holdout < 1.0):
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    chunk_rows = int(chunk_rows)
    n_folds = _check_folds(n_folds)
    if group_column is not None and group_column == label_column:
        raise ValueError(f"the group column and the label column are both {group_column!r}")
    src = open_source(source, chunk_rows)
    first, from_frame = read_piece(src.pieces[0], None)
    if first.shape[0] == 0:
        raise InputError(f"{src.pieces[0].label}: {NO_ROWS}")
    for col, what in ((label_column, "labels"), (group_column, "groups")):
        if col is not None:
            _named_column(first, from_frame, src.pieces[0].label, col, what)
            first = first.drop(columns=[col])
    schema, checker, fixed = _infer(first, from_frame, family, src.pieces[0].label)
    del first
    enc = Encoder(schema, checker, from_frame, label_column, group_column)
    unarrange = np.argsort(checker.column_order)
    D = len(schema.columns)
    labels = label_column is not None
    if store.path.exists():
        shutil.rmtree(store.path)
    store.write_format(
        source=src.description,
        family=repr(family),
        chunk_rows=chunk_rows,
        holdout=float(holdout),
        n_folds=n_folds,
        prior_sample=int(prior_sample),
        label_column=label_column,
        group_column=group_column,
        **(format_extra or {}),
    )

    def tell(what: str, done: int, total: int) -> None:
        if progress is not None:
            progress(what, done, total)

    group_ids: list[Any] | None = None
    chunk_counts: list[int] | None = None
    if src.aligned and group_column is None:
        n_rows = sum(int(p.n or 0) for p in src.pieces)
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        store.create_arrays(n_rows, D, chunk_rows, labels=labels)
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
                n_folds,
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
        staged = sorted(_gather(client, futs, "read", tell), key=lambda r: r.index)
        _first_staged_error(src, staged)
        counts = [r.n for r in staged]
        n_rows = int(sum(counts))
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        ends = np.cumsum(counts)
        starts = ends - np.asarray(counts)
        if group_column is None:
            store.create_arrays(n_rows, D, chunk_rows, labels=labels)
            rate = min(1.0, prior_sample / max(n_rows * (1.0 - holdout), 1.0))
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
                        labels,
                        n_folds,
                        pure=False,
                    )
                )
        else:
            group_ids, codes = _global_group_codes(staged)
            plan = _group_plan(codes, len(group_ids), chunk_rows)
            _check_group_sizes(plan, group_ids, group_column, chunk_rows, src.description)
            chunk_counts = [int(n) for n in plan.chunk_counts]
            n_stored = (len(chunk_counts) - 1) * chunk_rows + chunk_counts[-1]
            store.create_arrays(n_stored, D, chunk_rows, labels=labels, grouped=True)
            # the hold-out is drawn per group: the training rows are known only from the
            # groups' sizes and flags
            hold_g = holdout_mask_of(np.arange(len(group_ids)), holdout)
            n_train = int(plan.sizes[~hold_g].sum())
            rate = min(1.0, prior_sample / max(n_train, 1.0))
            piece_starts = np.asarray(starts, dtype=np.int64)
            futs = []
            for c, (lo, n_c) in enumerate(zip(plan.chunk_offsets, plan.chunk_counts)):
                rows_c = plan.order[lo : lo + n_c]
                futs.append(
                    client.submit(
                        gather_group_chunk_task,
                        str(store.path),
                        c,
                        c * chunk_rows,
                        rows_c,
                        codes[rows_c],
                        piece_starts,
                        holdout,
                        n_folds,
                        rate,
                        unarrange,
                        labels,
                        pure=False,
                    )
                )
            del codes, plan
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
        n_folds=n_folds,
        group_column=group_column,
        group_ids=group_ids,
        chunk_counts=chunk_counts,
    )
    store.save(INFO_FILE, info)
    return info


# -- the chunk plan of a grouped ingest ----------------------------------------------------------


def _global_group_codes(staged: Sequence[PieceResult]) -> tuple[list[Any], IntArray]:
    """The groups' values by first appearance over the pieces in order, and every input row's
    group code (N,)."""
    values = [r.group_values or [] for r in staged]
    # a CSV block of digits-only keys parses as numbers, another block of the same column as
    # text: then every key is compared as text, so that 17 and "17" are one group
    kinds = {isinstance(v, str) for vs in values for v in vs}
    as_text = len(kinds) > 1
    index: dict[Any, int] = {}
    ids: list[Any] = []
    parts = []
    for vs, r in zip(values, staged):
        lut = np.empty(len(vs), dtype=np.int64)
        for j, v in enumerate(vs):
            k = str(v) if as_text else v
            code = index.get(k)
            if code is None:
                code = index[k] = len(ids)
                ids.append(k)
            lut[j] = code
        if r.group_index is not None:
            parts.append(lut[r.group_index])
    codes = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids, codes


@dataclass
class GroupPlan:
    """Where a grouped ingest puts its rows.

    sizes : (G,) rows of each group.
    order : (N,) input rows in stored order without the padding (groups by code, each group's
        rows in input order).
    chunk_counts, chunk_offsets : (C,) real rows of each chunk, and where its rows start in
        ``order``.
    """

    sizes: IntArray
    order: IntArray
    chunk_counts: IntArray
    chunk_offsets: IntArray


def _group_plan(codes: IntArray, n_groups: int, chunk_rows: int) -> GroupPlan:
    """Pack the groups, in code order, greedily into chunks of at most ``chunk_rows`` rows (a
    group larger than that gets a chunk of its own: ``_check_group_sizes`` refuses it)."""
    sizes = np.bincount(codes, minlength=n_groups).astype(np.int64)
    counts: list[int] = []
    cur = 0
    for s in sizes.tolist():
        if cur and cur + s > chunk_rows:
            counts.append(cur)
            cur = 0
        cur += s
    counts.append(cur)
    chunk_counts = np.asarray(counts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(chunk_counts)[:-1]]).astype(np.int64)
    order = np.argsort(codes, kind="stable").astype(np.int64)
    return GroupPlan(sizes, order, chunk_counts, offsets)


def _check_group_sizes(
    plan: GroupPlan, ids: list[Any], column: str, chunk_rows: int, label: str
) -> None:
    big = np.flatnonzero(plan.sizes > chunk_rows)
    if big.size:
        g = int(big[0])
        more = f" (and {big.size - 1} more groups)" if big.size > 1 else ""
        raise InputError(
            f"{label}: group {ids[g]!r} of column {column!r} has {int(plan.sizes[g]):,} rows, "
            f"more than --chunk-rows {chunk_rows:,}{more}: a group's rows must fit in one chunk"
        )


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


def input_positions(store: Store, info: StoreInfo) -> IntArray:
    """Where each input row is stored: (n_rows,) stored positions, in input order.

    ``arange(n_rows)`` for an ungrouped store; from the ``row`` array for a grouped one, so
    that ``per_row[input_positions(store, info)]`` puts a per-row array of the store (labels,
    densities; ``n_stored`` long) back in the input's order.
    """
    if not info.grouped:
        return np.arange(info.n_rows, dtype=np.int64)
    row = np.asarray(store.array("row")[:], dtype=np.int64)
    pos = np.flatnonzero(row >= 0)
    out = np.empty(info.n_rows, dtype=np.int64)
    out[row[pos]] = pos
    return out


def iter_chunks(info: StoreInfo) -> Iterator[tuple[int, int, int]]:
    """(chunk index, first stored row, end stored row) of the real rows of every chunk."""
    for c in range(info.n_chunks):
        a, b = info.chunk_bounds(c)
        yield c, a, b
