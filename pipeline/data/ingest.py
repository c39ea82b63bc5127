"""Ingest: records into a dataset store (``pipeline.data.store``).

Ingest runs as Dask tasks, one per piece of the input: a piece is read, validated with the rules
and messages of ``pipeline.families.schema`` / the families (prefixed with the file and the row in
that
file), encoded and written by the task; the driver only adds the pieces' row counts and
additive moments (count, sum, sum of outer products, minimum and maximum over the training rows)
and never holds the whole input. Sources of known length (``.npy``, zarr, numpy / pandas /
dask arrays) are read one output chunk per task; CSV, Parquet and dask DataFrames, whose pieces
have unknown lengths, are first written to a staging area, then gathered into chunks. A grouped
ingest always stages; the driver then reads only the group column's codes (one int64 per row)
to plan the chunks, and one task per output chunk gathers its rows from the staging area.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import zarr

from pipeline.core import storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE
from pipeline.core.errors import InputError
from pipeline.core.tasks import gather, on_scattered
from pipeline.data.ingest_tasks import (
    Encoder,
    PieceResult,
    gather_chunk_task,
    gather_group_chunk_task,
    ingest_aligned_task,
    stage_piece_task,
)
from pipeline.data.sources import (
    IN_MEMORY,
    Piece,
    Source,
    located,
    open_source,
    read_piece,
    shift_row,
)
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
)
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.families.schema import Schema

# -- the driver of ingest ----------------------------------------------------------------------


def _first_error(results: Sequence[PieceResult]) -> None:
    for r in sorted(results, key=lambda r: r.index):
        if r.error is not None:
            raise InputError(r.error)


def _infer(
    first: pd.DataFrame,
    from_frame: bool,
    family: Any,
    label: str,
    schema: Schema | None = None,
    missing: bool = False,
    hint: str | None = None,
) -> tuple[Schema, ProductFamily, ProductFamily | None]:
    """Schema from the first piece (or the given one), the checker families, and the fixed
    family if given; ``missing``: missing cells are kept as NaN (``Schema.missing``)."""
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
            checker = schema.build_family(Xe)
    except ValueError as err:
        raise located(label, 0, err, hint) from err
    return schema, checker, fixed


def peek_family(
    source: Any,
    family: Any = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    drop: Sequence[str | None] = (),
) -> ProductFamily | None:
    """The family ``ingest`` would infer from the first piece of ``source`` (without the
    columns ``drop``: the label and group columns), read in this process; None when that piece
    cannot be read or checked, which ``ingest`` then reports properly. A guess for choosing
    which kernels to compile before the workers start: a later piece can still change the
    family (values off the first piece's recording grid)."""
    try:
        src = open_source(source, int(chunk_rows))
        first, from_frame = read_piece(src.pieces[0], None)
        cols = [c for c in drop if c is not None and c in first.columns]
        first = first.drop(columns=cols)
        if first.shape[0] == 0:
            return None
        return _infer(first, from_frame, family, src.pieces[0].label)[1]
    except Exception:
        # whatever stops the guess (a missing file, bad values, an object store's own errors)
        # stops the ingest too, which reports it with its file, column and row
        return None


def _check_global(
    schema: Schema, family: ProductFamily, mom: Moments, label: str, strict: bool = True
) -> None:
    """``Schema.check_informative`` over all chunks, from the moments: enough rows, and no
    column of one constant value (among the training rows' cells present); without
    ``strict`` such columns are recorded in ``schema.dropped`` instead (``_drop_columns``)."""
    n = int(mom.n)
    unarrange = np.argsort(family.column_order)
    extremes = np.vstack([mom.lo, mom.hi])[:, unarrange]
    try:
        if n < 2:
            schema.check_informative(extremes[:n] if n else np.empty((0, extremes.shape[1])))
        schema.check_informative(extremes, strict=strict)
    except (ValueError, IndexError) as err:
        raise InputError(f"{label}: {' '.join(str(err).split())}") from err


def _copy_columns_task(store: str, a: int, b: int, cols: IntArray) -> None:
    X = np.asarray(zarr.open_array(f"{store}/X_all", mode="r")[a:b])
    zarr.open_array(f"{store}/X", mode="r+")[a:b] = X[:, cols]


def _drop_columns(
    client: Any,
    store: Store,
    old_features: list[str],
    schema: Schema,
    checker: ProductFamily,
    sample: FloatArray,
    mom: Moments,
    n_stored: int,
    chunk_rows: int,
) -> tuple[ProductFamily, FloatArray, Moments]:
    """The store without the columns ``_check_global`` dropped: the family refitted to the
    sample's other columns, X rewritten by one task per chunk in the new family's column
    order, and the moments of the columns kept (a store with a dropped column is a rare input:
    one more pass over it, never a second copy in memory)."""
    feats = schema.features
    keep = [old_features.index(c) for c in feats]
    sample = np.ascontiguousarray(sample[:, keep])
    prod = schema.build_family(sample)
    inv = np.argsort(np.argsort(checker.column_order))  # old feature -> old arranged position
    cols = np.asarray([inv[keep[j]] for j in prod.column_order], dtype=np.int64)
    storage.move(store.path / "X", store.path / "X_all")
    zarr.create_array(
        str(store.path / "X"),
        shape=(n_stored, len(feats)),
        chunks=(chunk_rows, len(feats)),
        # the store's own dtype, whatever ingest wrote it in
        dtype=store.array("X_all").dtype,
        compressors=None,
        overwrite=True,
    )
    futs = [
        client.submit(_copy_columns_task, str(store.path), a, min(a + chunk_rows, n_stored), cols)
        for a in range(0, n_stored, chunk_rows)
    ]
    client.gather(futs)
    storage.rmtree(store.path / "X_all", ignore_errors=True)
    return prod, sample, mom.keep(cols)


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
        As ``MAPDP(family=...)``. The kinds are inferred from the first piece of the input.
    chunk_rows : int
        Rows per chunk of the store at most (the unit a pass sweeps on one worker): without a
        group column, 32 chunks or more are made a few rows shorter so that their count
        divides evenly among power-of-two worker counts (``balanced_chunk_rows``).
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
        More entries for ``format.json`` (``pipeline.data.dataset`` records its key there).
    schema : Schema, optional
        A fitted model's schema (``family`` is then its ``ProductFamily``): the records must
        have its columns, kinds and categories (an ``InputError`` naming the file, column and
        row otherwise) and are encoded as at fit time; a column may be constant (new records
        are scored, not fitted). Its ``missing`` decides whether missing cells are kept.
    dtype : {"float64", "float32"}
        What the store's X holds (``STORE_DTYPES``): float32 halves the store and the passes'
        reads, the records rounded to float32 (as the prior's sample; the moments are those of
        the float64 values); readers hand the kernels float64 rows either way.
    missing : bool
        Keep missing cells (NaN) in X, counted per column (``StoreInfo.missing_cells``), rather
        than refuse the first with a message naming its file, column and row, ending with
        ``missing_hint`` (default ``pipeline.data.sources.MISSING_HINT``).
    strict : bool
        Refuse a column holding one value among the training rows (as ``Schema.check_informative``);
        otherwise it is dropped (``schema.dropped``), X is written without it and ``dpmm score``
        of the run's model drops it too. A family given to ingest keeps every column (strict).

    Returns
    -------
    StoreInfo, also saved as the record ``info`` of the store (``Store.info``).
    """
    t0 = time.perf_counter()
    if not (0.0 <= holdout < 1.0):
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if dtype not in STORE_DTYPES:
        raise ValueError(f"dtype must be one of {STORE_DTYPES}, got {dtype!r}")
    chunk_rows = int(chunk_rows)
    n_folds = check_folds(n_folds)
    if group_column is not None and group_column == label_column:
        raise ValueError(f"the group column and the label column are both {group_column!r}")
    src = open_source(source, chunk_rows)
    if src.aligned and group_column is None:
        rows = balanced_chunk_rows(sum(int(p.n or 0) for p in src.pieces), chunk_rows)
        if rows != chunk_rows:
            chunk_rows = rows
            src = open_source(source, chunk_rows)
    first, from_frame = read_piece(src.pieces[0], None)
    if first.shape[0] == 0:
        raise InputError(f"{src.pieces[0].label}: {NO_ROWS}")
    for col, what in ((label_column, "labels"), (group_column, "groups")):
        if col is not None:
            _named_column(first, from_frame, src.pieces[0].label, col, what)
            first = first.drop(columns=[col])
    given = schema is not None
    schema, checker, fixed = _infer(
        first, from_frame, family, src.pieces[0].label, schema, missing, missing_hint
    )
    del first
    who = "the model" if given else "the first chunk"
    enc = Encoder(schema, checker, from_frame, label_column, group_column, who)
    if missing_hint is not None:
        enc.hint = missing_hint
    unarrange = np.argsort(checker.column_order)
    D = len(schema.features)
    labels = label_column is not None
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

    def tell(what: str, done: int, total: int) -> None:
        if progress is not None:
            progress(what, done, total)

    group_ids: list[Any] | None = None
    chunk_counts: list[int] | None = None
    group_moments = False
    if src.aligned and group_column is None:
        n_rows = sum(int(p.n or 0) for p in src.pieces)
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        store.create_arrays(n_rows, D, chunk_rows, labels=labels, dtype=dtype)
        rate = min(1.0, prior_sample / max(n_rows * (1.0 - holdout), 1.0))
        results = _on_pieces(
            client,
            src,
            enc,
            lambda p, enc_f, rows_f: client.submit(
                ingest_aligned_task,
                str(store.path),
                p,
                enc_f,
                holdout,
                rate,
                rows_f,
                n_folds,
                pure=False,
            ),
            "ingest",
            tell,
        )
        _first_error(results)
    else:
        staged = _on_pieces(
            client,
            src,
            enc,
            lambda p, enc_f, rows_f: client.submit(
                stage_piece_task, str(store.path), p, enc_f, rows_f, pure=False
            ),
            "read",
            tell,
        )
        staged = sorted(staged, key=lambda r: r.index)
        _first_staged_error(src, staged)
        counts = [r.n for r in staged]
        n_rows = int(sum(counts))
        if n_rows == 0:
            raise InputError(f"{src.description}: {NO_ROWS}")
        ends = np.cumsum(counts)
        starts = ends - np.asarray(counts)
        if group_column is None:
            chunk_rows = balanced_chunk_rows(n_rows, chunk_rows)
            store.create_arrays(n_rows, D, chunk_rows, labels=labels, dtype=dtype)
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
            store.create_arrays(n_stored, D, chunk_rows, labels=labels, grouped=True, dtype=dtype)
            group_moments = D <= MAX_GRAM_COLS
            if group_moments:
                store.create_group_arrays(len(chunk_counts), int(plan.chunk_groups.max()), D)
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
                        group_moments,
                        pure=False,
                    )
                )
            del codes, plan
        results = _gather(client, futs, "chunk", tell)
        storage.rmtree(store.path / "staging", ignore_errors=True)
    results = sorted(results, key=lambda r: r.index)
    mom = results[0].moments
    assert mom is not None
    for r in results[1:]:
        assert r.moments is not None
        mom = mom + r.moments
    old_features = schema.features
    if not given:
        _check_global(schema, checker, mom, src.description, strict or fixed is not None)
    sample = np.concatenate([r.sample for r in results if r.sample is not None])
    sample_rows = np.concatenate([r.sample_rows for r in results if r.sample_rows is not None])
    if dtype != "float64":
        # the sample start fits these rows in memory: the values the store holds, as every pass
        # reads them
        sample = sample.astype(dtype).astype(np.float64)
    miss = np.sum([r.missing for r in results if r.missing is not None], axis=0)
    firsts = [r.first_missing for r in results if r.first_missing is not None]
    if schema.features != old_features:
        try:
            prod, sample, mom = _drop_columns(
                client,
                store,
                old_features,
                schema,
                checker,
                sample,
                mom,
                n_rows
                if chunk_counts is None
                else (len(chunk_counts) - 1) * chunk_rows + chunk_counts[-1],
                chunk_rows,
            )
        except ValueError as err:
            raise InputError(f"{src.description}: {' '.join(str(err).split())}") from err
        # the groups' moments were taken over the dropped columns too: readers use the rows
        group_moments = False
    elif fixed is not None:
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
    notes.extend(schema.dropped_lines())
    arranged = [old_features[j] for j in checker.column_order]
    missing_cells = {arranged[j]: int(miss[j]) for j in np.flatnonzero(miss)} if firsts else {}
    first_missing = None
    if firsts:
        row, col = min(firsts)
        first_missing = [row, arranged[col]]
    info = StoreInfo(
        source=src.description,
        n_rows=n_rows,
        n_cols=len(schema.features),
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
        prior_fixed=fixed is not None,
        label_column=label_column,
        n_folds=n_folds,
        group_column=group_column,
        group_ids=group_ids,
        chunk_counts=chunk_counts,
        group_moments=group_moments,
        missing_cells={c: missing_cells[c] for c in schema.columns if c in missing_cells},
        first_missing=first_missing,
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
    chunk_groups : (C,) groups of each chunk.
    """

    sizes: IntArray
    order: IntArray
    chunk_counts: IntArray
    chunk_offsets: IntArray
    chunk_groups: IntArray


def _group_plan(codes: IntArray, n_groups: int, chunk_rows: int) -> GroupPlan:
    """Pack the groups, in code order, greedily into chunks of at most ``chunk_rows`` rows (a
    group larger than that gets a chunk of its own: ``_check_group_sizes`` refuses it)."""
    sizes = np.bincount(codes, minlength=n_groups).astype(np.int64)
    counts: list[int] = []
    groups: list[int] = []
    cur = 0
    m = 0
    for s in sizes.tolist():
        if cur and cur + s > chunk_rows:
            counts.append(cur)
            groups.append(m)
            cur = 0
            m = 0
        cur += s
        m += 1
    counts.append(cur)
    groups.append(m)
    chunk_counts = np.asarray(counts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(chunk_counts)[:-1]]).astype(np.int64)
    order = np.argsort(codes, kind="stable").astype(np.int64)
    return GroupPlan(sizes, order, chunk_counts, offsets, np.asarray(groups, dtype=np.int64))


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
    """The piece without its in-memory rows (they travel as a future, ``_on_pieces``)."""
    if piece.kind in IN_MEMORY:
        return Piece(piece.index, piece.label, piece.kind, (), piece.row0, piece.n)
    return piece


def _on_pieces(
    client: Any,
    src: Source,
    enc: Encoder,
    submit: Callable[[Piece, Any, Any], Any],
    what: str,
    tell: Callable[[str, int, int], None],
) -> list[Any]:
    """The results of ``submit(piece, encoder, rows)``'s task for every piece of ``src``, in
    order (``_gather``). The encoder is broadcast and an in-memory piece's rows are scattered
    to one worker (a delayed piece's computed there), so that no data is embedded in the task
    graph; both are scattered again, and the tasks run again, when a lost worker takes them
    (``on_scattered``: the tasks write only their own piece's rows)."""
    held = [p for p in src.pieces if p.kind in IN_MEMORY and p.kind != "delayed"]

    def run(enc_f: Any, *held_f: Any) -> list[Any]:
        rows_f = dict(zip((p.index for p in held), held_f))
        futs = []
        for p in src.pieces:
            rows = rows_f.get(p.index)
            if p.kind == "delayed":
                rows = client.compute(p.args[0])
            futs.append(submit(_bare(p), enc_f, rows))
        return _gather(client, futs, what, tell)

    objs = [enc, *(p.args[0] for p in held)]
    return on_scattered(client, objs, run, [True] + [False] * len(held), what)


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
                body = shift_row(body, off)
                body = body.replace("rows from 0 ", f"rows from {off} ")
                msg = head + body
            raise InputError(msg)
        row_in_file[piece.label] = off + max(r.n, 0)


def _gather(
    client: Any, futs: list[Any], what: str, tell: Callable[[str, int, int], None]
) -> list[Any]:
    """The tasks' results in their order (``pipeline.core.tasks.gather``), telling ``tell``
    how many have ended as each ends."""
    ended = 0

    def on_done(_: int) -> None:
        nonlocal ended
        ended += 1
        tell(what, ended, len(futs))

    return gather(client, futs, on_done)
