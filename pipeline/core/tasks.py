"""The results of a batch of Dask tasks (a pass's chunk tasks, the write-out's, ingest's).

They are fetched in one ``client.gather`` once every task has ended, not one by one as each
ends. Each fetch is a round trip through the scheduler, and on a ``LocalCluster`` the driver's
process runs the scheduler too: fetching a pass's 112 results one by one took 128 ms of that
process's CPU a pass, one gather 52 ms (2-core machine, 1 worker, 112 chunks of 2,000 records,
medians of 9 passes; the results are 18 kB each). That process is the one part of a pass that
does not grow with the workers, so its time per task is what caps the speed-up on many cores;
at the end the gather asks each worker for its results at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


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
