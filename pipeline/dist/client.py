"""The Dask client a fit runs on: an existing scheduler, or a LocalCluster of single-threaded
worker processes whose preload (``pipeline.worker_setup``) loads the engines' kernels."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = "127.0.0.1:8787",
    quiet: bool = False,
    warm: Sequence[str] | None = None,
) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` when given, else to a new ``LocalCluster`` of
    ``n_workers`` single-threaded workers (default: one per core) listening on 127.0.0.1 only.
    Prints the dashboard.

    ``warm``: the engines whose kernels the new workers load while they start (default: every
    registered engine; ``pipeline.worker_setup``)."""
    import logging

    from distributed import Client, LocalCluster

    from pipeline.worker_setup import WARM_ENV

    # the scheduler's and nannies' INFO lines would bury the progress bars
    logging.getLogger("distributed").setLevel(logging.WARNING)
    if scheduler:
        client = Client(scheduler)
        cluster = None
    else:
        n = int(n_workers or os.cpu_count() or 1)
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=dashboard_address,
            memory_limit=0,
            # worker processes: reachable from this machine only, told which engine to load
            # (Nanny passes env to the worker process); threads talk in process
            **(
                {"host": "127.0.0.1", "env": {WARM_ENV: ",".join(warm)} if warm else {}}
                if processes
                else {}
            ),
            preload=["pipeline.worker_setup"] if processes else None,
        )
        client = Client(cluster)
    try:
        if not quiet:
            served = "dashboard" in client.scheduler_info().get("services", {})
            link = client.dashboard_link if served and (dashboard_address or scheduler) else None
            print(f"Dask dashboard: {link or 'disabled'}", file=sys.stderr)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


