"""The ingest tasks: each encodes and writes one piece or one output chunk of the dataset store
and returns only counts and additive moments (``pipeline.data.ingest`` drives them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import zarr

from kernels.moments import column_summary, group_gram
from pipeline.core.config import N_FOLDS
from pipeline.core.errors import InputError
from pipeline.core.seeds import SAMPLE_SALT
from pipeline.data.chunk_io import open_array
from pipeline.data.sources import MISSING_HINT, Piece, located, read_piece
from pipeline.data.store import (
    HOLDOUT_SALT,
    BoolArray,
    FoldArray,
    IntArray,
    Moments,
    folds_of_uniform,
    row_uniform,
)
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.schema import Schema

# rows per zarr chunk of a grouped ingest's staging area: a gathering task reads only its blocks
STAGE_BLOCK_ROWS = 8192


def label_codes(values: Any) -> IntArray:
    """int64 codes of true labels agreeing across chunks: integral numbers, else text hashes."""
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
    # who the schema belongs to, in a message about columns that differ
    who: str = "the first chunk"
    # what a refused missing cell's message adds (``pipeline.data.sources.located``)
    hint: str = MISSING_HINT

    def take_labels(self, df: pd.DataFrame, label: str) -> IntArray | None:
        """Remove the label column from ``df`` and return its codes; None without one."""
        if self.label_column is None:
            return None
        if self.label_column not in df.columns:
            raise InputError(f"{label}: no label column {self.label_column!r}")
        return label_codes(df.pop(self.label_column))

    def take_groups(
        self, df: pd.DataFrame, label: str, row0: int | None
    ) -> tuple[list[Any], IntArray] | None:
        """Remove the group column from ``df``: its values by first appearance and row indices."""
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
            raise located(label, row0, err) from None
        return values, codes.astype(np.int64)

    def encode(self, df: pd.DataFrame, label: str, row0: int | None) -> FloatArray:
        """Encoded rows (n, D) in the store's column order, or an ``InputError``."""
        try:
            df = self.schema.check_columns(df, self.from_frame, self.who)
            Xe = self.schema.encode(df, fitting=False)
            self.schema.check_values(self.checker, Xe)
        except ValueError as err:
            raise located(label, row0, err, self.hint) from err
        return self.checker.arrange(Xe)


@dataclass
class ChunkSummary:
    """What ingest writes and returns for one chunk besides X (``_chunk_summary``)."""

    hold: BoolArray
    fold: FoldArray
    moments: Moments
    sample: FloatArray
    sample_rows: IntArray
    # missing cells per arranged column, and the first one as (input row, arranged column)
    missing: FloatArray | None = None
    first_missing: tuple[int, int] | None = None


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
    """Held-out flags, folds, training moments and prior-sample rows of a chunk (arranged), from
    the hash ``keys`` (rows or group codes), the input ``rows`` and the stored ``positions``."""
    u = row_uniform(keys, HOLDOUT_SALT)
    hold = u < holdout if holdout > 0.0 else np.zeros(Xa.shape[0], dtype=bool)
    train = Xa[~hold]
    pick = row_uniform(rows[~hold], SAMPLE_SALT) < sample_rate
    moments = Moments.of(train)
    missing = np.asarray(moments.n_missing) + column_summary(Xa[hold])[0]
    first = None
    if missing.any():
        miss = np.isnan(Xa)
        i = int(np.argmin(np.where(miss.any(axis=1), rows, np.iinfo(np.int64).max)))
        first = (int(rows[i]), int(np.argmax(miss[i])))
    return ChunkSummary(
        hold,
        folds_of_uniform(u, n_folds),
        moments,
        train[pick][:, unarrange],
        positions[~hold][pick],
        missing,
        first,
    )


@dataclass
class PieceResult:
    index: int
    n: int
    error: str | None = None
    moments: Moments | None = None
    sample: FloatArray | None = None
    sample_rows: IntArray | None = None
    # a grouped piece: its group values in order of first appearance and each row's index
    group_values: list[Any] | None = None
    group_index: IntArray | None = None
    missing: FloatArray | None = None
    first_missing: tuple[int, int] | None = None


def _result(index: int, n: int, summ: ChunkSummary) -> PieceResult:
    return PieceResult(
        index,
        n,
        None,
        summ.moments,
        summ.sample,
        summ.sample_rows,
        missing=summ.missing,
        first_missing=summ.first_missing,
    )


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
    open_array(f"{store}/X", mode="r+")[a:b] = Xa
    open_array(f"{store}/holdout", mode="r+")[a:b] = summ.hold
    open_array(f"{store}/fold", mode="r+")[a:b] = summ.fold
    if y is not None:
        open_array(f"{store}/y", mode="r+")[a:b] = y
    if groups is not None:
        open_array(f"{store}/group", mode="r+")[a:b] = groups[0]
        open_array(f"{store}/row", mode="r+")[a:b] = groups[1]


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
    """Read, validate and encode a piece of unknown length into ``staging/<index>`` (labels into
    ``staging/y<index>``); a grouped piece also returns its groups (``take_groups``)."""
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
    parts = [np.asarray(open_array(f"{store}/staging/{p}", mode="r")[s:e]) for p, s, e in spans]
    Xa = np.concatenate(parts) if len(parts) > 1 else parts[0]
    y = None
    if labels:
        y = np.concatenate(
            [np.asarray(open_array(f"{store}/staging/y{p}", mode="r")[s:e]) for p, s, e in spans]
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
    group_moments: bool = False,
) -> PieceResult:
    """Gather a grouped store's chunk c from the staging area and write it at stored rows a...
    (``group_moments``: and its groups' moments, ``pipeline.data.store``).

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
        Xa[at] = _gather_rows(open_array(f"{store}/staging/{p}", mode="r"), local)
        if y is not None:
            y[at] = _gather_rows(open_array(f"{store}/staging/y{p}", mode="r"), local)
    positions = np.arange(a, a + rows.shape[0])
    summ = _chunk_summary(Xa, codes, rows, positions, holdout, n_folds, sample_rate, unarrange)
    _write_chunk(store, a, Xa, summ, y, (codes, rows))
    if group_moments:
        _write_group_moments(store, c, Xa, codes, summ)
    return _result(c, rows.shape[0], summ)


def _write_group_moments(
    store: str, c: int, Xa: FloatArray, codes: IntArray, summ: ChunkSummary
) -> None:
    """Chunk c's per-group Gram matrices, codes, held-out flags and folds."""
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    stored = open_array(f"{store}/X", mode="r").dtype
    if stored != Xa.dtype:
        # the moments of the records as stored (``--dtype float32`` rounds them)
        Xa = Xa.astype(stored).astype(np.float64)
    gram = group_gram(Xa, np.r_[starts, codes.shape[0]].astype(np.int64))
    n = starts.shape[0]
    open_array(f"{store}/group_gram", mode="r+")[c, :n] = gram
    open_array(f"{store}/group_code", mode="r+")[c, :n] = codes[starts]
    open_array(f"{store}/group_holdout", mode="r+")[c, :n] = summ.hold[starts]
    open_array(f"{store}/group_fold", mode="r+")[c, :n] = summ.fold[starts]
