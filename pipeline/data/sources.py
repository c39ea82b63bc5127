"""Input sources of ingest: the pieces of a CSV, Parquet, ``.npy``, zarr or in-memory input,
each read and located (file and row) on its own, so that one Dask task reads one piece."""

from __future__ import annotations

import itertools
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import zarr

from pipeline.core import storage
from pipeline.core.errors import InputError
from pipeline.data import io as pio
from pipeline.data.store import NO_ROWS
from pipeline.families.schema import as_frame

CSV_BLOCK_BYTES = 32 * 2**20  # a CSV piece: one Dask task each

_ROW = re.compile(r"\brow (\d+)\b")


def shift_row(msg: str, offset: int) -> str:
    """The first "row N" of a message as "row N + offset"."""
    return _ROW.sub(lambda m: f"row {int(m.group(1)) + offset}", msg, count=1)


def located(label: str, row0: int | None, err: Exception, hint: str | None = None) -> InputError:
    """``err``'s message (one line) with the file prefixed and chunk-local rows made file rows;
    a refused missing cell's message ends with ``hint`` (default ``MISSING_HINT``)."""
    msg = " ".join(str(err).split())
    if row0:
        msg = shift_row(msg, row0)
    if "NaN" in msg and "missing" in msg:
        msg += MISSING_HINT if hint is None else hint
    return InputError(f"{label}: {msg}")


#: what a refused missing cell's message adds for an engine that does not take them
MISSING_HINT = (
    "; of the distributed engines only MAP-DP (--engine mapdp) takes missing cells; "
    "`dpmm cluster` and MAPDP() take them in memory"
)
#: what it adds when missing cells were refused on request (``--missing refuse``)
REFUSE_HINT = "; or leave out --missing refuse"


@dataclass
class Piece:
    """One ingest task's share: rows [row0, row0 + n) of file ``label`` and how to read them."""

    index: int
    label: str
    kind: str
    args: tuple[Any, ...]
    row0: int | None = None
    n: int | None = None


def _open_rb(path: str) -> Any:
    """A local file or an object (``pipeline.core.storage``), opened for reading bytes."""
    return storage.location(path).open("rb")


def _csv_blocks(path: storage.Loc, block: int) -> list[tuple[int, int]]:
    """Byte ranges of a CSV file's data lines, split at line ends near multiples of ``block``."""
    size = storage.size(path)
    with path.open("rb") as fh:
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


IN_MEMORY = ("frame", "array", "delayed")


def read_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All records of a file as one DataFrame, read piece by piece as ingest reads them."""
    src = open_source(path, chunk_rows=2**40)
    frames = [read_piece(piece, None)[0] for piece in src.pieces]
    df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    df.columns = [str(c) for c in df.columns]
    return df


def read_piece(
    piece: Piece, columns: Sequence[str] | None, data: Any = None, text_columns: Sequence[str] = ()
) -> tuple[pd.DataFrame, bool]:
    """The piece's rows as a DataFrame and whether they came with column names; ``data`` are the
    rows of an in-memory piece, ``text_columns`` of a CSV are read as text (a key "007" stays)."""
    kind = piece.kind
    try:
        if kind == "npy":
            path, a, b = piece.args
            rows = _npy_rows(path, a, b)
            if rows.dtype.names is not None:
                return pd.DataFrame({f: np.asarray(rows[f]) for f in rows.dtype.names}), True
            return as_frame(rows, columns)[0], False
        if kind == "zarr":
            path, a, b = piece.args
            arr = zarr.open_array(path, mode="r")[a:b]
            return as_frame(np.asarray(arr), columns)[0], False
        if kind == "csv":
            path, a, b = piece.args
            dtype = {c: str for c in text_columns} if text_columns else None
            sep = pio.csv_sep(path)
            if a < 0:  # a compressed file: one piece, parsed from a file
                with storage.local_copy(path) as local:
                    return pio.parse_csv(local, piece.label, sep, dtype=dtype), True
            with _open_rb(path) as fh:
                header = fh.readline()
                fh.seek(a)
                body = fh.read(b - a)
            if not header.strip():
                raise InputError(f"{piece.label}: the file is empty (no header line)")

            def lines_before() -> int:
                with _open_rb(path) as fh:
                    return fh.read(a).count(b"\n") - 1

            df = pio.parse_csv(header + body, piece.label, sep, lines_before, dtype)
            return df, True
        if kind == "parquet":
            import pyarrow.parquet as pq

            path, rg = piece.args
            with _open_rb(path) as fh:
                table = pq.ParquetFile(fh).read_row_group(rg)
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
    """Cut an input (a path, URL, list of tables, array or frame) into ingest pieces."""
    # a dask collection can only come from an imported dask (importing it costs a second)
    da = sys.modules.get("dask.array")
    dd = sys.modules.get("dask.dataframe")
    if is_file_list(obj):
        return _listed_source(obj, chunk_rows)
    if storage.is_where(obj):
        return _file_source(obj, chunk_rows)
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


def _file_source(obj: storage.Where, chunk_rows: int) -> Source:
    """The pieces of a file or directory, local or on object storage."""
    loc = storage.location(obj)
    label = storage.redact(str(loc))
    with storage.fs_errors(loc):
        if not loc.exists():
            raise InputError(f"{label}: no such file or directory")
        name = loc.name.lower()
        if name.endswith(".npy"):
            # ``read_table``'s header checks, then a 2-D or a 1-D structured array
            shape, dtype = pio.check_npy(loc)
            if (len(shape), dtype.names is not None) not in ((2, False), (1, True)):
                raise InputError(
                    f"{label}: expected a 2-D array (n_samples, n_features), got {shape}"
                )
            return _aligned(label, int(shape[0]), chunk_rows, "npy", str(loc), from_frame=False)
        if (loc / "zarr.json").exists() or (loc / ".zarray").exists():
            try:
                arr = zarr.open_array(str(loc), mode="r")
            except Exception as err:
                raise InputError(f"{label}: not a readable zarr array ({err})") from err
            if arr.ndim != 2:
                raise InputError(f"{label}: expected a 2-D zarr array, got shape {arr.shape}")
            return _aligned(label, int(arr.shape[0]), chunk_rows, "zarr", str(loc), False)
        if name.endswith((".parquet", ".pq")) or loc.is_dir():
            import pyarrow.parquet as pq

            pieces: list[Piece] = []
            for f in pio.parquet_files(loc, label):
                flabel = storage.redact(str(f))
                pio.check_parquet_file(f, flabel)
                with f.open("rb") as fh:
                    try:
                        meta = pq.ParquetFile(fh).metadata
                    except Exception as err:  # pyarrow raises its own errors
                        raise InputError(f"{flabel}: not a readable Parquet file ({err})") from err
                _row_group_pieces(pieces, meta, flabel, str(f))
            if not pieces or sum(p.n or 0 for p in pieces) == 0:
                raise InputError(f"{label}: {NO_ROWS}")
            return Source(label, pieces, aligned=False, from_frame=True)
        if name.endswith((".csv", ".csv.txt", ".txt", ".tsv", ".csv.gz", ".tsv.gz")) or (
            loc.is_file()
        ):
            if storage.size(loc) == 0:
                raise InputError(f"{label}: the file is empty")
            # a compressed file cannot be cut at byte offsets: one piece
            blocks = [(-1, -1)] if name.endswith(".gz") else _csv_blocks(loc, CSV_BLOCK_BYTES)
            pieces = [
                Piece(i, label, "csv", (str(loc), a, b), 0 if i == 0 else None)
                for i, (a, b) in enumerate(blocks)
            ]
            return Source(label, pieces, aligned=False, from_frame=True)
        raise InputError(f"{label}: unrecognised input (expected CSV, Parquet, .npy or zarr)")


def _row_group_pieces(pieces: list[Piece], meta: Any, label: str, key: str) -> None:
    """Append one piece per row group of the Parquet file ``key`` to ``pieces``."""
    row0 = 0
    for rg in range(meta.num_row_groups):
        n = meta.row_group(rg).num_rows
        pieces.append(Piece(len(pieces), label, "parquet", (key, rg), row0, n))
        row0 += n


def _npy_rows(path: str, a: int, b: int) -> np.ndarray:
    """Rows a..b-1 of a ``.npy`` file or object, read as byte ranges."""
    with _open_rb(path) as f:
        shape, fortran, dtype = pio.read_npy_header(f)
        start = f.tell()
        inner = shape[1:]
        width = int(np.prod(inner, dtype=np.int64))
        if not fortran or not inner:
            f.seek(start + a * width * dtype.itemsize)
            data = f.read((b - a) * width * dtype.itemsize)
            return np.frombuffer(data, dtype=dtype).reshape((b - a, *inner))
        cols = []
        for j in range(width):
            f.seek(start + (j * shape[0] + a) * dtype.itemsize)
            cols.append(np.frombuffer(f.read((b - a) * dtype.itemsize), dtype=dtype))
    # the columns' order over the inner axes is Fortran's too
    return np.stack(cols, axis=1).reshape((b - a, *inner), order="F")


def _aligned(label: str, n: int, chunk_rows: int, kind: str, path: str, from_frame: bool) -> Source:
    if n == 0:
        raise InputError(f"{label}: {NO_ROWS}")
    pieces = [
        Piece(i, label, kind, (path, a, min(a + chunk_rows, n)), a, min(chunk_rows, n - a))
        for i, a in enumerate(range(0, n, chunk_rows))
    ]
    return Source(label, pieces, aligned=True, from_frame=from_frame)


def is_file_list(obj: Any) -> bool:
    """Whether ``obj`` is a list (or tuple) of paths or URLs: one input made of several files."""
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and all(storage.is_where(x) for x in obj)


def _listed_source(files: Sequence[Any], chunk_rows: int) -> Source:
    """The pieces of several tables read as one input, in the order given (a rolling window of
    dated partitions, ``pipeline.ops.schedule``); each keeps its own label in messages."""
    pieces: list[Piece] = []
    labels = []
    for f in files:
        src = open_source(f, chunk_rows)
        if not src.from_frame:
            raise InputError(
                f"{src.description}: a list of inputs holds tables (CSV, Parquet) only, not "
                "arrays (.npy, zarr)"
            )
        labels.append(src.description)
        for p in src.pieces:
            p.index = len(pieces)
            pieces.append(p)
    desc = labels[0] if len(labels) == 1 else f"{len(labels)} files ({labels[0]} ... {labels[-1]})"
    return Source(desc, pieces, aligned=False, from_frame=True)


def read_table(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The records of a CSV / TSV / Parquet / NumPy file as a DataFrame.

    Parameters
    ----------
    path : str or path-like
        ``.csv``, ``.tsv`` (optionally ``.gz``; header first), ``.parquet`` / ``.pq`` (a file or a
        directory) or ``.npy`` (2-D, columns ``x0, x1, ...``, or structured).
    columns : sequence of str, optional
        Keep only these columns, in this order.

    Returns
    -------
    DataFrame of shape (n_rows, n_columns), with a default RangeIndex.

    Raises
    ------
    pio.InputFileNotFoundError
        The path does not exist.
    InputError
        Anything else wrong with the file, the message starting with the path.
    """
    name = storage.redact(str(path))
    # a file on object storage is read from a local copy; the messages name its URL
    with storage.local_copy(path) as p:
        return _read_local_table(p, name, columns)


def _read_local_table(p: Path, name: str, columns: Sequence[str] | None) -> pd.DataFrame:
    kind = pio.file_format(p)
    if not p.exists():
        raise pio.InputFileNotFoundError(f"{name}: no such file")
    if columns is not None:
        columns = list(columns)
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        if dupes:
            raise InputError(f"{name}: columns requested more than once: {dupes}")
    if kind == "parquet":
        pio.check_parquet_files(p, name)
    else:
        if p.is_dir():
            raise InputError(f"{name}: is a directory, not a {kind.upper()} file")
        if p.stat().st_size == 0:
            raise InputError(f"{name}: the file is empty")
        if kind == "csv":
            pio.check_csv_head(p, name)
        else:
            pio.check_npy_table(p, name)
    # the records themselves are read as ingest reads them: piece by piece, one reader
    df = read_file(p)
    if df.shape[0] == 0:
        what = "header only" if kind == "csv" else f"{df.shape[1]} columns, 0 rows"
        raise InputError(f"{name}: no data rows ({what})")
    pio.check_columns(name, list(df.columns), columns)
    if columns is not None:
        df = df[list(columns)]
    return df.reset_index(drop=True)
