"""Batches of Dask tasks: a pass's chunk tasks, the write-out's, ingest's.

``gather`` fetches all results in one round trip; ``map_chunks`` maps a function over several
consecutive chunks per task (``chunk_groups``); ``on_scattered`` scatters and runs again when the
cluster loses scattered data (Dask cannot recompute it).
"""

from __future__ import annotations

import contextlib
import math
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# The most records a task sweeps (16 default chunks): it bounds what a lost worker's task
# recomputes, while a task's own overhead stays under 1% of it.
TASK_ROWS = 1_600_000

# How often ``on_scattered`` scatters its data: the first time and after each loss. Each loss is
# a worker gone in the middle of the tasks; more in a row is a cluster failing, not bad luck.
SCATTER_TRIES = 4
# Seconds a scatter waits for a worker when none is left: a batch job's replacement may queue.
WORKER_WAIT = 3600.0


def gather(
    client: Any, futs: Sequence[Any], on_done: Callable[[int], None] | None = None
) -> list[Any]:
    """The results of ``futs`` in their order, fetched together once all have ended.

    ``on_done(i)``, when given, is called as future ``i`` ends (a progress bar), from this
    thread; a task's error is raised by the gather, as Dask raises it.
    """
    if on_done is not None:
        from distributed import as_completed

        index = {f.key: i for i, f in enumerate(futs)}
        for fut in as_completed(futs):
            on_done(index[fut.key])
    return list(client.gather(list(futs)))


def on_scattered(
    client: Any,
    objs: Sequence[Any],
    run: Callable[..., T],
    what: str = "tasks",
) -> T:
    """``run(*futures)``, a future of each of ``objs`` scattered to one worker each (the tasks on
    the others fetch it once); when the cluster loses one of them before ``run`` has its
    results, the objects are scattered again and ``run`` runs again, with a warning naming
    ``what``.

    Never Dask's ``broadcast=True``: the scheduler's replication behind it copies until every
    worker it counted at the start holds the data, so one that leaves during the copy keeps it
    waiting for ever (a worker killed mid-scatter hung ``dpmm serve``, ``hmm`` and the tree stage
    in the fault campaign).

    A worker that leaves while the data is sent to it fails the scatter itself (the
    scheduler's connection to it closes): the data is scattered again, to the workers left.

    ``run`` must be idempotent (this package's tasks each write only their own chunk's rows,
    the same rows every time): a second run redoes the tasks that ended the first time too.
    After ``SCATTER_TRIES`` losses the cancellation (or the closed connection) is raised.
    """
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    attempt = 1
    while True:
        try:
            futs = client.scatter(list(objs), hash=False, timeout=WORKER_WAIT)
        except CommClosedError:
            if attempt == SCATTER_TRIES:
                raise
            why = "a worker left while its data was sent to it"
        else:
            try:
                return run(*futs)
            except FutureCancelledError:
                if attempt == SCATTER_TRIES or not any(f.cancelled() for f in futs):
                    raise
            why = "a worker that left held the last copy of the data its tasks need"
        attempt += 1
        warnings.warn(
            f"{what}: {why}; scattering it again and running them again "
            f"(try {attempt} of {SCATTER_TRIES})",
            RuntimeWarning,
            stacklevel=2,
        )


def rounds(n_chunks: int, g: int, slots: int) -> int:
    """How many chunk-lengths ``n_chunks`` chunks take on ``slots`` threads in tasks of ``g``."""
    q, r = divmod(n_chunks, g)
    span = g * math.ceil(q / slots)
    # the short last task needs a round of its own only when the full ones fill every thread
    return span + r if r and q % slots == 0 else span


def chunk_groups(n_chunks: int, chunk_rows: int, slots: int) -> list[range]:
    """Consecutive chunks of each task of a map over ``n_chunks`` chunks of at most
    ``chunk_rows`` rows on ``slots`` threads: the fewest tasks (of at most ``TASK_ROWS`` rows)
    that end the map in as few rounds as a task per chunk would (112 chunks: 16 tasks of 7 on
    16 threads, 8 of 14 on 2).

    Returns
    -------
    list of range
        Chunk indices of each task, in order; together every chunk once.
    """
    if n_chunks <= 0:
        return []
    slots = max(int(slots), 1)
    most = max(1, min(n_chunks, TASK_ROWS // max(int(chunk_rows), 1)))
    g = min(range(1, most + 1), key=lambda g: (rounds(n_chunks, g, slots), -g))
    return [range(i, min(i + g, n_chunks)) for i in range(0, n_chunks, g)]


def run_chunks(
    fn: Callable[..., Any],
    head: tuple[Any, ...],
    chunks: Sequence[tuple[int, int, int]],
    tail: tuple[Any, ...],
) -> list[Any]:
    """One task of ``map_chunks``: ``fn(*head, c, a, b, *tail)`` for each of its chunks."""
    return [fn(*head, c, a, b, *tail) for c, a, b in chunks]


def map_chunks(
    client: Any,
    fn: Callable[..., Any],
    chunks: Sequence[tuple[int, int, int]],
    head: tuple[Any, ...] = (),
    tail: tuple[Any, ...] = (),
    desc: str | None = None,
) -> list[Any]:
    """``fn(*head, c, a, b, *tail)`` for every chunk (c, first row, end row) of ``chunks``, on
    the cluster, in tasks of consecutive chunks (``chunk_groups`` for the cluster's
    ``threads``); the results in the chunks' order.

    ``head`` and ``tail`` may hold futures (a scattered message). Each task's key starts with
    ``fn``'s name, as a task a chunk's would. ``desc``: a progress bar on stderr, advanced by a
    task's rows as it ends.
    """
    if not chunks:
        return []
    slots = threads(client)
    widest = max(b - a for _, a, b in chunks)
    groups = [[chunks[i] for i in g] for g in chunk_groups(len(chunks), widest, slots)]
    token = uuid.uuid4().hex
    n = len(groups)
    futs = client.map(
        run_chunks,
        [fn] * n,
        [head] * n,
        groups,
        [tail] * n,
        key=[f"{fn.__name__}-{token}-{i}" for i in range(n)],
    )
    parts = gather_rows(client, futs, [sum(b - a for _, a, b in g) for g in groups], desc)
    return [r for part in parts for r in part]


def chain_chunks(
    client: Any,
    fn: Callable[..., Any],
    carry: Callable[[Any, Any], Any],
    chunks: Sequence[tuple[int, int, int]],
    head: tuple[Any, ...],
    msg: Any,
    desc: str | None = None,
) -> list[Any]:
    """``fn(*head, c, a, b, msg)`` for every chunk (c, first row, end row) of ``chunks`` in
    order, a task each, where each chunk's ``msg`` is ``carry(msg, result)`` of the chunk
    before (a sequential engine's state; ``msg`` of the first may be a future). Futures all the
    way: the state goes from worker to worker, not through the driver. The results in the
    chunks' order; ``desc``: a progress bar as ``map_chunks``'."""
    futs = []
    for c, a, b in chunks:
        futs.append(client.submit(fn, *head, c, a, b, msg, pure=False))
        msg = client.submit(carry, msg, futs[-1], pure=False)
    return gather_rows(client, futs, [b - a for _, a, b in chunks], desc)


def gather_rows(
    client: Any, futs: Sequence[Any], rows: Sequence[int], desc: str | None
) -> list[Any]:
    """``gather``'s results, with a progress bar (``desc``) advanced by ``rows[i]`` per future."""
    with progress_bar(desc, sum(rows)) as bar:
        return gather(client, futs, None if bar is None else lambda i: bar(rows[i]))


def threads(client: Any) -> int:
    """The threads ``map_chunks`` sizes its tasks for: the workers' now, or, when the client's
    cluster plans more workers than have joined (jobs still queued on a batch system, a
    cluster scaling up), one a planned worker. Groups for too few threads would leave the
    workers that join during the map without a task; for too many, they are only smaller."""
    now = sum(client.nthreads().values())
    planned = getattr(getattr(client, "cluster", None), "plan", None) or ()
    return max(now, len(planned), 1)


@contextlib.contextmanager
def progress_bar(desc: str | None, total: int) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr of ``total`` records for the block; None when ``desc`` is None."""
    if desc is None:
        yield None
        return
    from tqdm import tqdm

    with tqdm(
        total=total, desc=desc, unit="rec", unit_scale=True, leave=False, file=sys.stderr
    ) as bar:
        yield bar.update
