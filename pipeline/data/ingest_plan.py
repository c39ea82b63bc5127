"""The driver's plumbing of ingest (``pipeline.data.ingest``): the pieces' tasks submitted and
gathered, their first error raised with its row in the file, and the chunk plan of a grouped
ingest (every group's rows in one chunk, the groups packed greedily into chunks of at most
``chunk_rows`` rows)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.tasks import gather, on_scattered
from pipeline.data.ingest_tasks import Encoder, PieceResult
from pipeline.data.sources import IN_MEMORY, Piece, Source, shift_row
from pipeline.data.store import IntArray


def global_group_codes(staged: Sequence[PieceResult]) -> tuple[list[Any], IntArray]:
    """The groups' values by first appearance, and every input row's group code (N,)."""
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


def group_plan(codes: IntArray, n_groups: int, chunk_rows: int) -> GroupPlan:
    """Pack the groups, in code order, greedily into chunks of at most ``chunk_rows`` rows."""
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


def check_group_sizes(
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


def first_error(results: Sequence[PieceResult]) -> None:
    for r in sorted(results, key=lambda r: r.index):
        if r.error is not None:
            raise InputError(r.error)


def on_pieces(
    client: Any,
    src: Source,
    enc: Encoder,
    submit: Callable[[Piece, Any, Any], Any],
    what: str,
    tell: Callable[[str, int, int], None],
) -> list[Any]:
    """The results of ``submit(piece, encoder, rows)``'s task for every piece of ``src``, in
    order; the encoder and in-memory rows are scattered, not embedded in the graph, and scattered
    again when a lost worker takes them (``on_scattered``)."""
    held = [p for p in src.pieces if p.kind in IN_MEMORY and p.kind != "delayed"]

    def run(enc_f: Any, *held_f: Any) -> list[Any]:
        rows_f = dict(zip((p.index for p in held), held_f))
        futs = []
        for p in src.pieces:
            rows = rows_f.get(p.index)
            if p.kind == "delayed":
                rows = client.compute(p.args[0])
            if p.kind in IN_MEMORY:  # its rows travel as a future, not in the piece
                p = Piece(p.index, p.label, p.kind, (), p.row0, p.n)
            futs.append(submit(p, enc_f, rows))
        return gather_tell(client, futs, what, tell)

    objs = [enc, *(p.args[0] for p in held)]
    return on_scattered(client, objs, run, what)


def first_staged_error(src: Source, staged: Sequence[PieceResult]) -> None:
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


def gather_tell(
    client: Any, futs: list[Any], what: str, tell: Callable[[str, int, int], None]
) -> list[Any]:
    """The tasks' results in order, telling ``tell`` how many have ended as each ends."""
    ended = 0

    def on_done(_: int) -> None:
        nonlocal ended
        ended += 1
        tell(what, ended, len(futs))

    return gather(client, futs, on_done)
