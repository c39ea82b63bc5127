"""The dataset store: ingest of the records, their folds, groups and true labels.

Layout of a store (a zarr v3 group; rows chunked by ``chunk_rows`` = R)
-------------------------------------------------------------------------
``format.json``
    Format, ``FORMAT_VERSION`` and the ingest options, written first (``Store.open_checked``).
``X`` (n_stored, D) float64 or float32
    The encoded records, columns in the family's group order (``ProductFamily.arrange``).
``fold`` (n_stored,) int16, ``holdout`` (n_stored,) bool
    Cross-validation fold (``fold_of``) and held-out flag, from one hash of the row index (or
    group code, ``row_uniform``): independent of chunking, workers and run.
``group``, ``row`` (n_stored,) int64, grouped stores only
    Group code 0..G-1 (by first appearance) and input row index; -1 on padding.
``y`` (n_stored,) int64, with a label column only
    The true labels' codes (``label_codes``).
``group_gram``, ``group_code``, ``group_holdout``, ``group_fold`` (C, G_max, ...)
    Grouped stores of at most ``MAX_GRAM_COLS`` columns: per chunk, each group's Gram matrix of
    [1, X_g] (upper triangle, ``kernels.moments.group_gram``), code, flag and fold, so that the
    mixed-effects engine reads groups through their moments instead of their rows.
``info.json`` + ``info.npz``
    What ingest learned (``StoreInfo``), a ``pipeline.core.persist`` record written last: its
    presence means ingest completed.

Chunk c occupies stored rows ``[c*R, c*R + n_c)`` (``StoreInfo.chunk_bounds``), so parallel
writers never share a zarr chunk. With ``group_column`` all rows of a group land in one chunk
(groups packed greedily), the rest of the chunk is padding no reader touches, and a group's rows
share fold and flag. A fit's own state lives in its state store (``pipeline.distributed.loop``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

import numpy as np
import zarr
from numpy.typing import NDArray
from zarr.codecs import ZstdCodec

from kernels import moments as kmoments
from pipeline.core import persist, storage
from pipeline.core.config import N_FOLDS
from pipeline.core.errors import InputError
from pipeline.core.seeds import row_uniform
from pipeline.data.chunk_io import CHECKSUM, Checked, open_array, open_group
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.schema import Schema, Summary

HOLDOUT_SALT = 0x5EED_0001
PLOT_SALT = 0x5EED_0003
NO_ROWS = "X has no rows (0 samples); at least 1 is required"
FORMAT_NAME = "dpmm-dataset"
# 2: grouped stores keep their groups' moments (``group_gram``); 3: every chunk ends with its
# checksum (``chunk_io.CHECKSUM``); a store of an older version is refused
# (``Store.check_format``) and a shared one is ingested again under its new key
FORMAT_VERSION = 3
FORMAT_FILE = "format.json"
INFO_FILE = "info"
MAX_FOLDS = 2**15 - 1  # fold ids are int16
# the widest store whose groups' Gram matrices ingest keeps (small beside the rows up to here)
MAX_GRAM_COLS = 15
GROUP_ARRAYS = ("group_gram", "group_code", "group_holdout", "group_fold")

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]
_T = TypeVar("_T")
FoldArray = NDArray[np.int16]


def holdout_mask_of(rows: IntArray, fraction: float) -> BoolArray:
    """Held-out flags of the given row indices (or group codes of a grouped store)."""
    if fraction <= 0.0:
        return np.zeros(np.shape(rows), dtype=bool)
    return row_uniform(rows, HOLDOUT_SALT) < fraction


def folds_of_uniform(u: FloatArray, n_folds: int) -> FoldArray:
    """Fold ids 0..n_folds-1 of hash uniforms ``u`` in [0, 1), ``min(floor(u * F), F - 1)``,
    found by comparing u with ``j / F`` so that fold 0 is exactly ``u < 1 / F``, the held-out
    test of ``holdout = 1 / F``."""
    u = np.asarray(u, dtype=np.float64)
    fold = np.zeros(u.shape, dtype=np.int16)
    # the number of edges j / F at or below u (a tenth of searchsorted's cost)
    for j in range(1, int(n_folds)):
        fold += u >= j / float(n_folds)
    return fold


def fold_of(rows_or_group_codes: IntArray, n_folds: int = N_FOLDS) -> FoldArray:
    """Fold ids (int16, 0..n_folds-1) of row indices, or of group codes in a grouped store.

    Parameters
    ----------
    rows_or_group_codes : (n,) int array
    n_folds : int

    Returns
    -------
    (n,) int16 array, from the hash of ``holdout_mask_of``, so that the rows of
    ``holdout_mask_of(key, 1 / F)`` are those of fold 0.
    """
    n_folds = check_folds(n_folds)
    return folds_of_uniform(row_uniform(rows_or_group_codes, HOLDOUT_SALT), n_folds)


def check_folds(n_folds: Any) -> int:
    if isinstance(n_folds, bool) or int(n_folds) != n_folds or not 1 <= int(n_folds) <= MAX_FOLDS:
        raise ValueError(f"n_folds must be an integer in [1, {MAX_FOLDS}], got {n_folds!r}")
    return int(n_folds)


def balanced_chunk_rows(n_rows: int, chunk_rows: int) -> int:
    """Rows per chunk for ``n_rows`` records in chunks of at most ``chunk_rows`` rows, so that
    every pass's tasks divide evenly among 1, 2, 4, ... workers.

    From 32 chunks on, the chunk count is raised to a multiple of the largest power of two at
    most a quarter of it (100 chunks become 112: 7 rounds of 16 workers, 14 of 8). The result
    depends on ``n_rows`` alone, so the labels do not depend on the cluster.
    """
    n_chunks = -(-n_rows // chunk_rows)
    g = 1 << max(0, (n_chunks // 4).bit_length() - 1)
    if g < 8:
        return chunk_rows
    return -(-n_rows // (-(-n_chunks // g) * g))


def stored_chunk_rows(n_rows: int, chunk_rows: int) -> int:
    """The rows of a zarr chunk of a per-row array of ``n_rows`` rows in chunks of
    ``chunk_rows``: at most ``n_rows``. zarr stores the last chunk whole, so a 10-row table of
    5,000 columns in chunks of 100,000 rows wrote, and every pass read, a 4 GB chunk."""
    return max(1, min(int(chunk_rows), int(n_rows)))


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
    # missing cells (NaN) per column; sums, products and extremes are of the cells present
    n_missing: FloatArray | None = None

    @classmethod
    def of(cls, X: FloatArray) -> Moments:
        """The moments of the rows of X (n, D); n = 0 gives the moments of no rows."""
        n_missing, total, lo, hi = kmoments.column_summary(X)
        if not n_missing.any():
            return cls(float(X.shape[0]), total, X.T @ X, lo, hi, n_missing)
        X0 = np.where(np.isnan(X), 0.0, X)
        return cls(float(X.shape[0]), total, X0.T @ X0, lo, hi, n_missing)

    def __add__(self, other: Moments) -> Moments:
        d = self.total.shape[0]
        a = self.n_missing if self.n_missing is not None else np.zeros(d)
        b = other.n_missing if other.n_missing is not None else np.zeros(d)
        return Moments(
            self.n + other.n,
            self.total + other.total,
            self.outer + other.outer,
            np.minimum(self.lo, other.lo),
            np.maximum(self.hi, other.hi),
            a + b,
        )

    def keep(self, cols: IntArray) -> Moments:
        """The moments of the columns ``cols`` only."""
        return Moments(
            self.n,
            self.total[cols],
            self.outer[np.ix_(cols, cols)],
            self.lo[cols],
            self.hi[cols],
            None if self.n_missing is None else self.n_missing[cols],
        )

    def summary(self, order: IntArray) -> Summary:
        """(n, n_missing, lo, hi) of the rows in the schema's order (``Schema.settle``)."""
        unarrange = np.argsort(order)
        n_missing = np.zeros(len(order)) if self.n_missing is None else self.n_missing
        return int(self.n), n_missing[unarrange], self.lo[unarrange], self.hi[unarrange]

    @property
    def mean(self) -> FloatArray:
        return self.total / max(self.n, 1.0)

    @property
    def cov(self) -> FloatArray:
        """Unbiased covariance (as ``np.cov``)."""
        m = self.mean
        return (self.outer - self.n * np.outer(m, m)) / max(self.n - 1.0, 1.0)


@persist.register
@dataclass
class StoreInfo:
    """Everything later steps need to know about the ingested records: ``n_rows`` real rows,
    ``n_stored`` per-row entries (more in a grouped store's padded chunks), ``sample_rows`` as
    stored positions."""

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
    # the family was given to ingest: runs keep it instead of refitting the prior to ``sample``
    prior_fixed: bool = False
    # the store keeps its groups' moments (``group_gram`` and its companions: module docstring)
    group_moments: bool = False
    # missing cells per column that has any (schema order); the first as [input row, column]
    missing_cells: dict[str, int] = field(default_factory=dict)
    first_missing: list[Any] | None = None

    def with_prior_scale(self, scale: float | None) -> StoreInfo:
        """This info with the empirical-Bayes prior refitted to its ``sample`` at ``scale`` (None:
        the family default), so that runs of other prior scales sharing the store each get
        their own; a prior given to ingest (``prior_fixed``) is kept."""
        if self.prior_fixed:
            return self
        try:
            family = self.schema.build_family(self.sample, scale=scale)
        except ValueError as err:
            raise InputError(f"{self.source}: {' '.join(str(err).split())}") from err
        return replace(self, family=family)

    @property
    def train_missing(self) -> bool:
        """Whether a training row has a missing cell (the MAP-DP engine then keeps them filled)."""
        m = self.moments.n_missing
        return m is not None and bool(np.any(m > 0))

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
        feats = self.schema.features
        return [feats[j] for j in self.family.column_order]


# what X may hold: float32 halves the store and the reads; kernels get float64 rows either way
STORE_DTYPES = ("float64", "float32")


class Store:
    """A dataset store (module docstring)."""

    def __init__(self, path: storage.Where):
        # a local directory or a prefix of object storage (``pipeline.core.storage``)
        self.path: storage.Loc = storage.location(path)

    @classmethod
    def open_checked(cls, path: storage.Where) -> Store:
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
        data = (json.dumps(meta, indent=1, default=str) + "\n").encode()
        persist.write_atomic(self.path / FORMAT_FILE, data)

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
        """The array ``name``, whose reads report a damaged chunk by name (``Checked``)."""
        path = str(self.path / name)
        return Checked(open_array(path, mode), path)

    def create_arrays(
        self,
        n_rows: int,
        n_cols: int,
        chunk_rows: int,
        labels: bool = False,
        grouped: bool = False,
        dtype: str = "float64",
    ) -> None:
        """Create the per-row arrays of ``n_rows`` rows chunked by ``chunk_rows``: X (``dtype``),
        fold, holdout, and y (``labels``), group and row (``grouped``). Fewer rows than
        ``chunk_rows`` are one chunk of ``n_rows`` rows (``stored_chunk_rows``)."""
        if dtype not in STORE_DTYPES:
            raise ValueError(f"dtype must be one of {STORE_DTYPES}, got {dtype!r}")
        self.path.mkdir(parents=True, exist_ok=True)
        open_group(str(self.path), mode="a")
        chunk_rows = stored_chunk_rows(n_rows, chunk_rows)
        zarr.create_array(
            str(self.path / "X"),
            shape=(n_rows, n_cols),
            chunks=(chunk_rows, n_cols),
            dtype=dtype,
            compressors=[CHECKSUM],
            overwrite=True,
        )
        names = (*(("y",) if labels else ()), *(("group", "row") if grouped else ()))
        per_row = [("holdout", "bool", False, False), ("fold", "int16", -1, False)]
        for name, kind, fill, packed in [*per_row, *((n, "int64", -1, True) for n in names)]:
            zarr.create_array(
                str(self.path / name),
                shape=(n_rows,),
                chunks=(chunk_rows,),
                dtype=kind,
                fill_value=fill,
                compressors=[ZstdCodec(level=0), CHECKSUM] if packed else [CHECKSUM],
                overwrite=True,
            )

    def create_group_arrays(self, n_chunks: int, max_groups: int, n_cols: int) -> None:
        """Create the per-group arrays of a grouped store (module docstring): ``n_chunks`` rows
        of ``max_groups`` groups, one zarr chunk per task chunk."""
        q = n_cols + 1
        specs = (
            ("group_gram", (q * (q + 1) // 2,), "float64", 0.0),
            ("group_code", (), "int64", -1),
            ("group_holdout", (), "bool", False),
            ("group_fold", (), "int16", -1),
        )
        for name, tail, dtype, fill in specs:
            zarr.create_array(
                str(self.path / name),
                shape=(n_chunks, max_groups, *tail),
                chunks=(1, max_groups, *tail),
                dtype=dtype,
                fill_value=fill,
                compressors=[CHECKSUM],
                overwrite=True,
            )

    # small files, replaced atomically -------------------------------------------------------
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

    @property
    def info(self) -> StoreInfo:
        return self.load(INFO_FILE, StoreInfo)


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


@dataclass
class GroupMoments:
    """A chunk's groups as ingest summarised them (``read_group_moments``)."""

    gram: FloatArray  # (G, q (q + 1) / 2): W_g^T W_g's upper triangle, W_g = [1, X_g]
    code: IntArray  # (G,) group codes, ascending
    holdout: BoolArray  # (G,)
    fold: FoldArray  # (G,)

    @property
    def n_rows(self) -> IntArray:
        """(G,) rows of each group."""
        return np.rint(self.gram[:, 0]).astype(np.int64)

    def full(self) -> FloatArray:
        """(G, q, q): every W_g^T W_g."""
        return self.gram[:, packed_index(self.gram.shape[1])]


def packed_index(n_packed: int) -> IntArray:
    """(q, q): where entry (a, b) of a symmetric q x q matrix is in its upper triangle kept row
    by row in ``n_packed`` = q (q + 1) / 2 numbers (``kernels.moments.group_gram``)."""
    q = math.isqrt(8 * n_packed + 1) // 2
    a, b = np.triu_indices(q)
    out = np.empty((q, q), dtype=np.int64)
    out[a, b] = np.arange(a.shape[0])
    out[b, a] = out[a, b]
    return out


def read_group_moments(path: str, c: int) -> GroupMoments:
    """Chunk c's per-group arrays of the grouped store at ``path``, without padding."""
    arrays = [Store(path).array(name) for name in GROUP_ARRAYS]
    code = np.asarray(arrays[1][c], dtype=np.int64)
    n = int(np.count_nonzero(code >= 0))
    gram, hold, fold = (np.asarray(arrays[i][c, :n]) for i in (0, 2, 3))
    return GroupMoments(gram, code[:n], hold, fold)


def iter_chunks(info: StoreInfo) -> Iterator[tuple[int, int, int]]:
    """(chunk index, first stored row, end stored row) of the real rows of every chunk."""
    for c in range(info.n_chunks):
        a, b = info.chunk_bounds(c)
        yield c, a, b
