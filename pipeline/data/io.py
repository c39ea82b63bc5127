"""Input files: their formats, checks and parsing, with errors that name the file and row.

Every problem with a file is a ``pipeline.core.errors.InputError`` whose message starts with the
file name (``"data.csv: line 7 has 5 fields, expected 4"``); a missing file is
``InputFileNotFoundError``, also a ``FileNotFoundError``. ``describe_row`` turns a 0-based data row
into something a person finds in the file (for CSV, the physical line).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from pipeline.core.errors import InputError

CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
NPY_SUFFIXES = (".npy",)
SUPPORTED_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES + NPY_SUFFIXES

_NPY_MAGIC = b"\x93NUMPY"
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"


class InputFileNotFoundError(FileNotFoundError, InputError):
    """The input path does not exist (a ``FileNotFoundError`` that is also an ``InputError``)."""


def file_format(path: str | os.PathLike[str]) -> str:
    """The format of a file from its name ("csv", "parquet", "npy"); InputError if unsupported."""
    name = Path(path).name.lower()
    if name.endswith(CSV_SUFFIXES):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(NPY_SUFFIXES):
        return "npy"
    raise InputError(
        f"{path}: unsupported file type; supported are " + ", ".join(SUPPORTED_SUFFIXES)
    )


def _is_gz(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def _open_text(path: Path | bytes) -> IO[str]:
    if isinstance(path, bytes):
        return io.TextIOWrapper(io.BytesIO(path), encoding="utf-8-sig", newline="")
    if _is_gz(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def check_columns(name: str, available: Sequence[str], columns: Sequence[str] | None) -> None:
    if columns is None:
        return
    for c in columns:
        if c not in available:
            raise InputError(f"{name}: no column {c!r}; columns are {list(available)}")


def check_file(path: Any) -> None:
    """What can be checked of an input (a path or URL) without reading its records: that it
    exists, is not empty, and that a ``.parquet`` / ``.npy`` file is one.

    Raises
    ------
    InputFileNotFoundError
        The path does not exist.
    InputError
        Naming the file and what is wrong with it.
    """
    from pipeline.core import storage

    p = storage.location(path)
    name = storage.redact(str(path))
    # on object storage: the scheme is installed and the bucket can be listed
    storage.check_reachable(p)
    with storage.fs_errors(path):
        if not p.exists():
            raise InputFileNotFoundError(f"{name}: no such file or directory")
        if p.is_dir():
            return
        if storage.size(p) == 0:
            raise InputError(f"{name}: the file is empty")
        low = p.name.lower()
        if low.endswith(PARQUET_SUFFIXES):
            check_parquet_file(p, name)
        elif low.endswith(NPY_SUFFIXES):
            check_npy(p)


def check_csv_head(p: Path, name: str) -> None:
    """A CSV file's first bytes: not Parquet, NumPy or gzip data under a CSV name."""
    with open(p, "rb") as f:
        head = f.read(8)
    if not _is_gz(p):
        if head.startswith(_PARQUET_MAGIC):
            raise InputError(f"{name}: not a CSV file (it is a Parquet file; name it .parquet)")
        if head.startswith(_NPY_MAGIC):
            raise InputError(f"{name}: not a CSV file (it is a NumPy file; name it .npy)")
        if head.startswith(_GZIP_MAGIC):
            raise InputError(f"{name}: not a CSV file (it is gzip-compressed; name it .csv.gz)")
    elif not head.startswith(_GZIP_MAGIC):
        raise InputError(f"{name}: not a gzip file (bad magic bytes)")


def csv_sep(path: str | os.PathLike[str]) -> str:
    """The field separator of a CSV / TSV file, from its name."""
    return "\t" if Path(path).name.lower().endswith((".tsv", ".tsv.gz")) else ","


def parse_csv(
    source: Path | bytes,
    name: str,
    sep: str,
    lines_before: Callable[[], int] | None = None,
    dtype: Any = None,
) -> pd.DataFrame:
    """The one CSV parser: a whole file, or a header line and a block of data lines as bytes
    (one ingest piece, ``pipeline.data.sources``), with the messages of ``read_table``.

    Parameters
    ----------
    source : Path or bytes
    name : str
        What the messages call the input (the file, with its rows for a piece).
    sep : str
    lines_before : callable, optional
        For bytes: the number of the file's lines between its header and the block, so that a
        message gives the file's line (asked only when a message needs it).
    dtype : optional
        As ``pandas.read_csv`` (e.g. text for a group key).
    """
    src = io.BytesIO(source) if isinstance(source, bytes) else source

    def bad_record() -> tuple[int, int, int] | None:
        bad = _first_bad_record(source, sep)
        if bad is not None and lines_before is not None:
            line, got, want = bad
            return line + lines_before(), got, want
        return bad

    try:
        df = pd.read_csv(src, sep=sep, encoding="utf-8-sig", low_memory=False, dtype=dtype)
    except pd.errors.EmptyDataError:
        raise InputError(f"{name}: the file is empty (no header line)") from None
    except pd.errors.ParserError as err:
        bad = bad_record()
        if bad is not None:
            line, got, want = bad
            raise InputError(f"{name}: line {line} has {got} fields, expected {want}") from None
        msg = re.sub(r"^Error tokenizing data\. C error: ", "", str(err).strip())
        raise InputError(f"{name}: not a valid CSV file ({msg})") from None
    except UnicodeDecodeError as err:
        raise InputError(
            f"{name}: not a UTF-8 text file (byte 0x{err.object[err.start]:02x} cannot be decoded)"
        ) from None
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise InputError(f"{name}: cannot be read ({err})") from None
    # pandas fills short records with missing values: look for them only when there are any
    if df.isna().to_numpy().any():
        bad = bad_record()
        if bad is not None:
            line, got, want = bad
            raise InputError(f"{name}: line {line} has {got} fields, expected {want}")
    df.columns = [str(c) for c in df.columns]
    return df


def _records(p: Path | bytes, sep: str) -> Iterator[tuple[int, list[str]]]:
    """(first physical line, fields) of each non-blank record of a CSV file or its bytes."""
    with _open_text(p) as f:
        reader = csv.reader(f, delimiter=sep)
        prev = 0
        for rec in reader:
            start = prev + 1
            prev = reader.line_num
            # pandas' skip_blank_lines drops empty and whitespace-only lines
            if rec and (len(rec) > 1 or rec[0].strip()):
                yield start, rec


def _first_bad_record(p: Path | bytes, sep: str) -> tuple[int, int, int] | None:
    """(line, fields, expected fields) of the first record whose field count differs."""
    want = None
    try:
        for line, rec in _records(p, sep):
            if want is None:
                want = len(rec)
            elif len(rec) != want:
                return line, len(rec), want
    except (csv.Error, UnicodeDecodeError):
        return None
    return None


def csv_line_of_row(path: Any, row: int) -> int | None:
    """The physical line (1-based) where data row ``row`` (0-based) of a CSV file starts."""
    from pipeline.core import storage

    sep = csv_sep(path)
    try:
        with storage.local_copy(path) as p:
            for i, (line, _rec) in enumerate(_records(p, sep)):
                if i == row + 1:  # record 0 is the header
                    return line
    except (OSError, ValueError, csv.Error):  # UnicodeDecodeError and InputError are ValueErrors
        return None
    return None


def describe_row(path: str | os.PathLike[str], row: int) -> str:
    """Data row ``row`` (0-based) as a person finds it in the file: ``"row 12 (line 14)"`` for
    a CSV file with a header and no blank lines, else ``"row 12"``."""
    try:
        kind = file_format(path)
    except ValueError:
        kind = ""
    if kind == "csv":
        line = csv_line_of_row(path, row)
        if line is not None:
            return f"row {row} (line {line})"
    return f"row {row} (0-based)"


_ROW = re.compile(r"\brow (\d+)\b(?! \()")


def locate_rows(msg: str, path: str | os.PathLike[str]) -> str:
    """``msg`` with its first unlocated 0-based ``row N`` rewritten by ``describe_row``."""
    m = _ROW.search(msg)
    if m is None:
        return msg
    return msg[: m.start()] + describe_row(path, int(m.group(1))) + msg[m.end() :]


def parquet_files(p: Any, name: str) -> list[Any]:
    """The Parquet files of a path or prefix, without parts starting with "_" or "."."""
    from pipeline.core import storage

    if not p.is_dir():
        return [p]
    files = [
        p / rel
        for rel in storage.file_stamps(p)
        if not any(part.startswith(("_", ".")) for part in rel.split("/"))
    ]
    if not files:
        raise InputError(f"{name}: directory holds no Parquet files")
    return files


def check_parquet_files(p: Path, name: str) -> None:
    """Every Parquet file of ``p`` (``parquet_files``) by its magic bytes."""
    for f in parquet_files(p, name):
        check_parquet_file(f, name if f == p else f"{name}/{f.relative_to(p)}")


def check_parquet_file(f: Any, name: str) -> None:
    """A Parquet file, by its size and magic bytes at both ends (InputError naming ``name``)."""
    from pipeline.core import storage

    loc = storage.location(f)
    size = storage.size(loc)
    if size == 0:
        raise InputError(f"{name}: the file is empty")
    with loc.open("rb") as fh:
        head = fh.read(4)
        fh.seek(max(size - 4, 0))
        tail = fh.read(4)
    if size < 12 or head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
        raise InputError(f"{name}: not a Parquet file (bad magic bytes)")


def read_npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """(shape, Fortran order, dtype) from an open ``.npy`` file's header, left at the data."""
    version = np.lib.format.read_magic(f)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(f)
    return tuple(int(v) for v in shape), bool(fortran), dtype


def check_npy(path: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of a ``.npy`` file or object from its header, without reading the data;
    an ``InputError`` naming the file for anything else or an array of Python objects (this
    package never unpickles)."""
    from pipeline.core import storage

    name = storage.redact(str(path))
    try:
        with storage.location(path).open("rb") as f:
            if not f.read(len(_NPY_MAGIC)).startswith(_NPY_MAGIC):
                raise InputError(f"{name}: not a NumPy .npy file (bad magic bytes)")
            f.seek(0)
            shape, _fortran, dtype = read_npy_header(f)
    except InputError:
        raise
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"{name}: not a valid NumPy .npy file ({err})") from None
    if dtype.hasobject:
        raise InputError(
            f"{name}: holds Python objects (dtype {dtype}); only numeric arrays are read "
            "(save the array with a numeric dtype, e.g. arr.astype(float))"
        )
    return shape, dtype


def check_npy_table(p: Path, name: str) -> None:
    """A ``.npy`` file that holds a table: 2-D real numbers, or a 1-D structured array."""
    shape, dtype = check_npy(p)
    if dtype.names is not None:
        if len(shape) != 1:
            raise InputError(f"{name}: expected a 1-D structured array, got shape {shape}")
        return
    if len(shape) != 2:
        raise InputError(f"{name}: expected a 2-D array (n_rows, n_columns), got shape {shape}")
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_) or np.issubdtype(
        dtype, np.complexfloating
    ):
        raise InputError(f"{name}: expected a real numeric array, got dtype {dtype}")
