"""Ingest: records into a dataset store (``pipeline.data.store``).

Dask tasks, one per piece of the input, read, validate (``pipeline.families.schema``), encode and
write the records; the driver only adds the pieces' row counts and additive moments and settles
the columns, never holding the whole input. Sources of known length are read one chunk per task;
CSV, Parquet, dask DataFrames and grouped ingests are first staged, then gathered into chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import zarr

from pipeline.core import storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE
from pipeline.core.errors import InputError
from pipeline.data.chunk_io import CHECKSUM, open_array
from pipeline.data.ingest_plan import (
    check_group_sizes,
    first_error,
    first_staged_error,
    gather_tell,
    global_group_codes,
    group_plan,
    on_pieces,
)
from pipeline.data.ingest_tasks import (
    Encoder,
    PieceResult,
    gather_chunk_task,
    gather_group_chunk_task,
    ingest_aligned_task,
    stage_piece_task,
)
from pipeline.data.sources import Source, located, open_source, read_piece
from pipeline.data.store import (
    INFO_FILE,
    MAX_GRAM_COLS,
    NO_ROWS,
    STORE_DTYPES,
    IntArray,
    Moments,
    Store,
    StoreInfo,
    balanced_chunk_rows,
    check_folds,
    holdout_mask_of,
    stored_chunk_rows,
)
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.families.schema import Schema


def _infer(
    first: pd.DataFrame,
    from_frame: bool,
    family: Any,
    label: str,
    schema: Schema | None = None,
    missing: bool = False,
    hint: str | None = None,
    support_only: bool = True,
) -> tuple[Schema, ProductFamily, ProductFamily | None]:
    """Schema from the first piece (or given), the checker families and the fixed family;
    ``support_only``: see ``Schema.build_family`` (False: the family a run would fit, as far as
    the first piece tells)."""
    fixed: ProductFamily | None = None
    try:
        if schema is not None:
            if not isinstance(family, ProductFamily):
                raise TypeError("a given schema needs its fitted ProductFamily as the family")
            df = schema.check_columns(first, from_frame, "the model")
            schema.check_values(family, schema.encode(df, fitting=False))
            return schema, family, family
        if isinstance(family, (Family, ProductFamily)):
            schema = Schema.infer(first, "gaussian", from_frame, missing=missing)
            fixed = family.as_product() if isinstance(family, Family) else family
            if fixed.n_cols != first.shape[1]:
                raise ValueError(
                    f"X has {first.shape[1]} features, but the family given models {fixed.n_cols}"
                )
            Xe = schema.encode(first, fitting=True)
            schema.check_values(fixed, Xe)
            checker = fixed
        else:
            schema = Schema.infer(first, family, from_frame, missing=missing)
            Xe = schema.encode(first, fitting=True)
            # too many columns for a full covariance: its groups will be diagonal in any case
            cheap = support_only or not schema.full_possible()
            checker = schema.build_family(Xe, support_only=cheap)
    except ValueError as err:
        raise located(label, 0, err, hint) from err
    return schema, checker, fixed


def peek_family(
    source: Any,
    family: Any = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    drop: Sequence[str | None] = (),
) -> ProductFamily | None:
    """The family ``ingest`` would infer from the first piece of ``source`` (or None): a guess."""
    try:
        src = open_source(source, int(chunk_rows))
        label, group = (*drop, None, None)[:2]
        # the family itself: its spec type says which kernels the workers load
        return _encoder(src, family, None, label, group, False, None, False)[0].checker
    except Exception:
        # whatever stops the guess stops the ingest too, which reports it properly
        return None


def _copy_columns_task(store: str, a: int, b: int, cols: IntArray) -> None:
    X = np.asarray(Store(store).array("X_all")[a:b])
    open_array(f"{store}/X", mode="r+")[a:b] = X[:, cols]


def _drop_columns(
    client: Any,
    store: Store,
    n_stored: int,
    chunk_rows: int,
    old_features: list[str],
    schema: Schema,
    checker: ProductFamily,
    sample: FloatArray,
    mom: Moments,
) -> tuple[ProductFamily, Moments]:
    """The store without the columns ``_settle`` dropped: family refitted, X rewritten."""
    feats = schema.features
    where = {c: j for j, c in enumerate(old_features)}
    keep = [where[c] for c in feats]
    prod = schema.build_family(sample)
    inv = np.argsort(np.argsort(checker.column_order))  # old feature -> old arranged position
    cols = np.asarray([inv[keep[j]] for j in prod.column_order], dtype=np.int64)
    storage.move(store.path / "X", store.path / "X_all")
    zarr.create_array(
        str(store.path / "X"),
        shape=(n_stored, len(feats)),
        chunks=(stored_chunk_rows(n_stored, chunk_rows), len(feats)),
        # the store's own dtype, whatever ingest wrote it in
        dtype=store.array("X_all").dtype,
        compressors=[CHECKSUM],
        overwrite=True,
    )
    futs = [
        client.submit(_copy_columns_task, str(store.path), a, min(a + chunk_rows, n_stored), cols)
        for a in range(0, n_stored, chunk_rows)
    ]
    client.gather(futs)
    storage.rmtree(store.path / "X_all", ignore_errors=True)
    return prod, mom.keep(cols)


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
    schema: Schema | None = None,
    dtype: str = "float64",
    missing: bool = False,
    strict: bool = True,
    missing_hint: str | None = None,
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
        As ``MAPDP(family=...)``, kinds inferred from the first piece of the input.
    chunk_rows : int
        Rows per chunk at most (``balanced_chunk_rows`` shortens them slightly so that the chunks
        divide evenly among power-of-two worker counts).
    holdout : float in [0, 1)
        Fraction of rows held out.
    prior_sample : int
        Training rows (a hash sample) the empirical-Bayes prior is fitted to.
    label_column : str, optional
        True labels: left out of the fit and stored as codes in ``y``.
    n_folds : int
        Cross-validation folds of the ``fold`` array.
    group_column : str, optional
        Group keys (a subject, a sequence): all rows of a group land in one chunk; a group
        larger than ``chunk_rows`` or a row without a key is an ``InputError``.
    format_extra : dict, optional
        More entries for ``format.json``.
    schema : Schema, optional
        A fitted model's schema: the records must have its columns, kinds and categories and are
        encoded as at fit time.
    dtype : {"float64", "float32"}
        What the store's X holds (float32 halves the store and the passes' reads).
    missing : bool
        Keep missing cells (counted in ``StoreInfo.missing_cells``) rather than refuse the first,
        with ``missing_hint`` at the end of the message.
    strict : bool
        Refuse a constant column rather than drop it (``Schema.settle``, as in memory).

    Returns
    -------
    StoreInfo, also saved as the record ``info`` of the store (``Store.info``).
    """
    t0 = time.perf_counter()
    chunk_rows, n_folds = _check_options(
        holdout, chunk_rows, dtype, n_folds, group_column, label_column
    )
    src, chunk_rows = _open(source, chunk_rows, group_column is not None)
    settled = schema is not None
    enc, fixed = _encoder(src, family, schema, label_column, group_column, missing, missing_hint)
    if store.path.exists():
        storage.rmtree(store.path)
    store.write_format(
        source=src.description,
        family=repr(family),
        chunk_rows=chunk_rows,
        holdout=float(holdout),
        n_folds=n_folds,
        prior_sample=int(prior_sample),
        label_column=label_column,
        group_column=group_column,
        dtype=dtype,
        **(format_extra or {}),
    )
    job = _Job(client, store, src, enc, holdout, prior_sample, n_folds, dtype, chunk_rows, progress)
    if src.aligned and group_column is None:
        out = _write_aligned(job)
    else:
        out = _write_staged(job, _stage(job))
        storage.rmtree(store.path / "staging", ignore_errors=True)
    # a model's schema (scoring) was settled at its fit; a given family keeps every column
    info = _finish(job, out, fixed, None if settled else strict or fixed is not None)
    info.seconds = time.perf_counter() - t0
    store.save(INFO_FILE, info)
    return info


def _open(source: Any, chunk_rows: int, grouped: bool) -> tuple[Source, int]:
    """The source and its rows per chunk (``balanced_chunk_rows`` unless ``grouped``)."""
    src = open_source(source, chunk_rows)
    rows = balanced_chunk_rows(sum(int(p.n or 0) for p in src.pieces), chunk_rows)
    if not src.aligned or grouped or rows == chunk_rows:
        return src, chunk_rows
    return open_source(source, rows), rows


def _encoder(
    src: Source,
    family: Any,
    schema: Schema | None,
    label_column: str | None,
    group_column: str | None,
    missing: bool,
    missing_hint: str | None,
    support_only: bool = True,
) -> tuple[Encoder, ProductFamily | None]:
    """The encoder every task validates its rows with, from the first piece of ``src``
    (``support_only``: see ``Schema.build_family``)."""
    first, from_frame = read_piece(src.pieces[0], None)
    label = src.pieces[0].label
    if first.shape[0] == 0:
        raise InputError(f"{label}: {NO_ROWS}")
    for col, what in ((label_column, "labels"), (group_column, "groups")):
        if col is not None:
            _named_column(first, from_frame, label, col, what)
            first = first.drop(columns=[col])
    who = "the model" if schema is not None else "the first chunk"
    schema, checker, fixed = _infer(
        first, from_frame, family, label, schema, missing, missing_hint, support_only
    )
    enc = Encoder(schema, checker, from_frame, label_column, group_column, who)
    if missing_hint is not None:
        enc.hint = missing_hint
    return enc, fixed


def _check_options(
    holdout: float,
    chunk_rows: int,
    dtype: str,
    n_folds: int,
    group_column: str | None,
    label_column: str | None,
) -> tuple[int, int]:
    """``chunk_rows`` and ``n_folds`` checked, or a ValueError saying which option is wrong."""
    if not (0.0 <= holdout < 1.0):
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if dtype not in STORE_DTYPES:
        raise ValueError(f"dtype must be one of {STORE_DTYPES}, got {dtype!r}")
    if group_column is not None and group_column == label_column:
        raise ValueError(f"the group column and the label column are both {group_column!r}")
    return int(chunk_rows), check_folds(n_folds)


@dataclass
class _Job:
    """What the steps of one ingest share."""

    client: Any
    store: Store
    src: Source
    enc: Encoder
    holdout: float
    prior_sample: int
    n_folds: int
    dtype: str
    chunk_rows: int
    progress: Callable[[str, int, int], None] | None = None

    @property
    def labels(self) -> bool:
        return self.enc.label_column is not None

    @property
    def D(self) -> int:
        return len(self.enc.schema.features)

    def rate(self, n_train: float) -> float:
        """The share of training rows drawn into the prior's sample."""
        return min(1.0, self.prior_sample / max(n_train, 1.0))

    def tell(self, what: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(what, done, total)


@dataclass
class _Written:
    """What writing the rows gave: the chunks' (or pieces') results and the store's layout."""

    results: list[PieceResult]
    n_rows: int
    chunk_rows: int
    group_ids: list[Any] | None = None
    chunk_counts: list[int] | None = None
    group_moments: bool = False

    @property
    def n_stored(self) -> int:
        """Rows of X, a grouped store's padding included."""
        if self.chunk_counts is None:
            return self.n_rows
        return (len(self.chunk_counts) - 1) * self.chunk_rows + self.chunk_counts[-1]


def _write_aligned(job: _Job) -> _Written:
    """A source of known length: one task reads, encodes and writes each output chunk."""
    n_rows = sum(int(p.n or 0) for p in job.src.pieces)
    if n_rows == 0:
        raise InputError(f"{job.src.description}: {NO_ROWS}")
    job.store.create_arrays(n_rows, job.D, job.chunk_rows, labels=job.labels, dtype=job.dtype)
    rate = job.rate(n_rows * (1.0 - job.holdout))
    store, h, folds = str(job.store.path), job.holdout, job.n_folds
    results = on_pieces(
        job.client,
        job.src,
        job.enc,
        lambda p, enc_f, rows_f: job.client.submit(
            ingest_aligned_task, store, p, enc_f, h, rate, rows_f, folds, pure=False
        ),
        "ingest",
        job.tell,
    )
    first_error(results)
    return _Written(results, n_rows, job.chunk_rows)


def _stage(job: _Job) -> list[PieceResult]:
    """Pieces of unknown length read, encoded and written to the staging area, in order."""
    store = str(job.store.path)
    staged = on_pieces(
        job.client,
        job.src,
        job.enc,
        lambda p, enc_f, rows_f: job.client.submit(
            stage_piece_task, store, p, enc_f, rows_f, pure=False
        ),
        "read",
        job.tell,
    )
    staged = sorted(staged, key=lambda r: r.index)
    first_staged_error(job.src, staged)
    if sum(r.n for r in staged) == 0:
        raise InputError(f"{job.src.description}: {NO_ROWS}")
    return staged


def _write_staged(job: _Job, staged: list[PieceResult]) -> _Written:
    """The staged rows gathered into the store's chunks, one task per chunk."""
    counts = [r.n for r in staged]
    n_rows = int(sum(counts))
    ends = np.cumsum(counts)
    starts = ends - np.asarray(counts)
    if job.enc.group_column is not None:
        return _write_grouped(job, staged, np.asarray(starts, dtype=np.int64), n_rows)
    chunk_rows = balanced_chunk_rows(n_rows, job.chunk_rows)
    job.store.create_arrays(n_rows, job.D, chunk_rows, labels=job.labels, dtype=job.dtype)
    rate = job.rate(n_rows * (1.0 - job.holdout))
    unarrange = np.argsort(job.enc.checker.column_order)
    store, futs = str(job.store.path), []
    for a in range(0, n_rows, chunk_rows):
        b = min(a + chunk_rows, n_rows)
        spans = [
            (i, int(max(a, s) - s), int(min(b, e) - s))
            for i, (s, e) in enumerate(zip(starts, ends))
            if e > a and s < b
        ]
        args = (a, b, spans, job.holdout, rate, unarrange, job.labels, job.n_folds)
        futs.append(job.client.submit(gather_chunk_task, store, *args, pure=False))
    return _Written(gather_tell(job.client, futs, "chunk", job.tell), n_rows, chunk_rows)


def _write_grouped(
    job: _Job, staged: list[PieceResult], piece_starts: IntArray, n_rows: int
) -> _Written:
    """The staged rows gathered into chunks of whole groups, with the groups' moments."""
    assert job.enc.group_column is not None
    group_ids, codes = global_group_codes(staged)
    plan = group_plan(codes, len(group_ids), job.chunk_rows)
    check_group_sizes(plan, group_ids, job.enc.group_column, job.chunk_rows, job.src.description)
    out = _Written([], n_rows, job.chunk_rows, group_ids, [int(n) for n in plan.chunk_counts])
    D = job.D
    job.store.create_arrays(
        out.n_stored, D, job.chunk_rows, labels=job.labels, grouped=True, dtype=job.dtype
    )
    out.group_moments = D <= MAX_GRAM_COLS
    if out.group_moments:
        job.store.create_group_arrays(len(plan.chunk_counts), int(plan.chunk_groups.max()), D)
    # the hold-out is drawn per group: the training rows follow from the groups' sizes and flags
    hold_g = holdout_mask_of(np.arange(len(group_ids)), job.holdout)
    rate = job.rate(int(plan.sizes[~hold_g].sum()))
    unarrange = np.argsort(job.enc.checker.column_order)
    store, futs = str(job.store.path), []
    for c, (lo, n_c) in enumerate(zip(plan.chunk_offsets, plan.chunk_counts)):
        rows_c = plan.order[lo : lo + n_c]
        args = (c, c * job.chunk_rows, rows_c, codes[rows_c], piece_starts, job.holdout)
        more = (job.n_folds, rate, unarrange, job.labels, out.group_moments)
        futs.append(job.client.submit(gather_group_chunk_task, store, *args, *more, pure=False))
    del codes, plan
    out.results = gather_tell(job.client, futs, "chunk", job.tell)
    return out


@contextmanager
def _at(label: str) -> Iterator[None]:
    """A ValueError raised inside as an ``InputError`` naming ``label`` (one line)."""
    try:
        yield
    except (ValueError, IndexError) as err:
        raise InputError(f"{label}: {' '.join(str(err).split())}") from err


def _finish(
    job: _Job, out: _Written, fixed: ProductFamily | None, settle: bool | None
) -> StoreInfo:
    """The store's ``StoreInfo`` from the chunks' results: moments and prior sample added up, the
    columns settled (``settle``: strict, None: not at all), the prior fitted, missing counted."""
    schema, checker, label = job.enc.schema, job.enc.checker, job.src.description
    results = sorted(out.results, key=lambda r: r.index)
    mom = results[0].moments
    assert mom is not None
    for r in results[1:]:
        assert r.moments is not None
        mom = mom + r.moments
    sample = np.concatenate([r.sample for r in results if r.sample is not None])
    sample_rows = np.concatenate([r.sample_rows for r in results if r.sample_rows is not None])
    if job.dtype != "float64":
        # the sample start fits these rows in memory, as the store holds them
        sample = sample.astype(job.dtype).astype(np.float64)
    old_features = schema.features
    if settle is not None:
        with _at(label):
            sample = schema.settle(sample, settle, mom.summary(checker.column_order))
            schema.choose_structure(sample, sample_rows)
    group_moments = out.group_moments
    with _at(label):
        if schema.features != old_features:
            where = (job.client, job.store, out.n_stored, out.chunk_rows)
            prod, mom = _drop_columns(*where, old_features, schema, checker, sample, mom)
            # the groups' moments were taken over the dropped columns too: readers use the rows
            group_moments = False
        else:
            prod = fixed if fixed is not None else schema.build_family(sample)
    notes = []
    if sample.shape[0] < mom.n:
        notes.append(
            f"empirical-Bayes prior fitted to a hash sample of {sample.shape[0]} of "
            f"{int(mom.n)} training rows"
        )
    # the in-memory fit's warning (``Schema.dropped_lines``) and notes, word for word
    notes.extend(schema.dropped_lines() + schema.notes)
    # missing cells per arranged column and the first as [row, column], from the chunks
    arranged = [old_features[j] for j in checker.column_order]
    firsts = [r.first_missing for r in results if r.first_missing is not None]
    missing_cells: dict[str, int] = {}
    first_missing: list[Any] | None = None
    if firsts:
        miss = np.sum([r.missing for r in results if r.missing is not None], axis=0)
        missing_cells = {arranged[j]: int(miss[j]) for j in np.flatnonzero(miss)}
        row, col = min(firsts)
        first_missing = [row, arranged[col]]
    return StoreInfo(
        source=label,
        n_rows=out.n_rows,
        n_cols=len(schema.features),
        chunk_rows=out.chunk_rows,
        holdout=float(job.holdout),
        schema=schema,
        family=prod,
        n_train=int(mom.n),
        moments=mom,
        sample=sample,
        sample_rows=sample_rows,
        notes=notes,
        prior_fixed=fixed is not None,
        label_column=job.enc.label_column,
        n_folds=job.n_folds,
        group_column=job.enc.group_column,
        group_ids=out.group_ids,
        chunk_counts=out.chunk_counts,
        group_moments=group_moments,
        missing_cells={c: missing_cells[c] for c in schema.columns if c in missing_cells},
        first_missing=first_missing,
    )
