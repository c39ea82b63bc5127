"""The Dask client a fit runs on: an existing scheduler, or a LocalCluster of single-threaded
worker processes whose preload (``pipeline.distributed.worker_setup``) loads the engines'
kernels."""

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
    registered engine; ``pipeline.distributed.worker_setup``)."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    from pipeline.distributed.worker_setup import WARM_ENV

    # the scheduler's and nannies' INFO lines would bury the progress bars
    logging.getLogger("distributed").setLevel(logging.WARNING)
    starts = contextlib.ExitStack()
    if scheduler:
        client = Client(scheduler)
        cluster = None
    else:
        n = int(n_workers or os.cpu_count() or 1)
        if processes:
            starts.enter_context(_fork_server(warm))
        # no statistical profiler in the workers (the dashboard's Profile page stays empty):
        # its sys._current_frames() every 10 ms can deadlock CPython 3.11 before 3.11.9
        # (python/cpython#116969, dask/distributed#8616; seen here on 3.11.7 with threads for
        # workers: every thread waiting for the GIL)
        with dask.config.set({PROFILE_KEY: False}):
            cluster = LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=processes,
                dashboard_address=dashboard_address,
                memory_limit=0,
                # worker processes: reachable from this machine only, told which engine to
                # load (Nanny passes env to the worker process); threads talk in process
                **(
                    {"host": "127.0.0.1", "env": {WARM_ENV: ",".join(warm)} if warm else {}}
                    if processes
                    else {}
                ),
                preload=["pipeline.distributed.worker_setup"] if processes else None,
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
        starts.close()


#: whether Dask workers sample their threads' stacks (``dask_client``'s clusters: off)
PROFILE_KEY = "distributed.worker.profile.enabled"


#: where worker processes start from (``distributed.worker.multiprocessing-method``)
START_METHOD_KEY = "distributed.worker.multiprocessing-method"

# whether ``start_fork_server`` started this process's fork server
_started_early = False


def _worker_modules(engines: Sequence[str]) -> list[str]:
    """What a worker process of ``engines`` imports: Dask, pandas, the preload, the engines,
    and last ``pipeline.distributed.fork_warm``, which loads their kernels (``_warm_env``)."""
    from pipeline.engines import ENGINE_MODULES

    mods = [ENGINE_MODULES[e] for e in engines if e in ENGINE_MODULES]
    return [
        "distributed",
        "dask",
        "numpy",
        "pandas",
        "pipeline.distributed.worker_setup",
        *mods,
        "pipeline.distributed.fork_warm",
    ]


@contextlib.contextmanager
def _warm_env(engines: Sequence[str]) -> Iterator[None]:
    """``FORK_WARM_ENV`` set to ``engines`` in this process's environment while inside: a fork
    server started meanwhile inherits it and loads their kernels
    (``pipeline.distributed.worker_setup.warm_fork_server``)."""
    from pipeline.distributed.worker_setup import FORK_WARM_ENV

    old = os.environ.get(FORK_WARM_ENV)
    os.environ[FORK_WARM_ENV] = ",".join(engines)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(FORK_WARM_ENV, None)
        else:
            os.environ[FORK_WARM_ENV] = old


def start_fork_server(engines: Sequence[str]) -> None:
    """Start the fork server of this process's local worker processes now, importing what the
    workers of ``engines`` import (``_fork_server``).

    ``dpmm`` does it first thing when its command will start a local cluster of worker
    processes, so that the server's imports overlap the command's own instead of following
    them (about 0.9 s of a 1M run). Every later local cluster of the process forks its workers
    from this server, which ends with the process; they see the working directory and
    environment of this moment, so it is not for a process that changes them in between.
    """
    global _started_early
    import multiprocessing
    import multiprocessing.forkserver

    if _started_early or "forkserver" not in multiprocessing.get_all_start_methods():
        return
    multiprocessing.forkserver.set_forkserver_preload(_worker_modules(engines))
    with _warm_env(engines):
        multiprocessing.forkserver.ensure_running()
    _started_early = True


@contextlib.contextmanager
def _fork_server(warm: Sequence[str] | None) -> Iterator[None]:
    """New worker processes forked from a fork server that imported their modules once.

    Dask's default, spawn, starts each worker as a new interpreter that imports Dask, pandas and
    the pipeline (about 1.5 CPU s each) while the driver and Prefect's server start too: on two
    cores that is the longest stretch of a run's start. A fork server (Dask's "forkserver"
    method) imports them once and forks each worker from itself. Unless ``start_fork_server``
    started one already, it is started here, so that it sees this moment's working directory
    and environment as a spawned worker would, and stopped with the cluster, so that the next
    cluster's workers do not see an older one's. Another method than spawn set in Dask's
    configuration (for example ``DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD=fork``) is
    kept, and so is spawn on a platform without fork servers or where one cannot be stopped.
    """
    import multiprocessing
    import multiprocessing.forkserver

    import dask
    from distributed.utils import get_mp_context

    from pipeline.engines import ENGINE_MODULES

    # a private method (CPython's tests use it): without it a server could not be stopped with
    # its cluster, and the next cluster's workers would see this one's directory and environment
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    configured = dask.config.get(START_METHOD_KEY, None) not in (None, "spawn")
    available = "forkserver" in multiprocessing.get_all_start_methods()
    if configured or not available or (stop is None and not _started_early):
        yield
        return
    with dask.config.set({START_METHOD_KEY: "forkserver"}):
        if _started_early:
            yield
            return
        # after Dask's own choice of preload (``get_mp_context`` makes it once per process)
        engines = list(warm or ENGINE_MODULES)
        get_mp_context().set_forkserver_preload(_worker_modules(engines))
        assert stop is not None  # not started early: checked above
        # started now, not by the first worker, so that it inherits the warm-up list
        with _warm_env(engines):
            multiprocessing.forkserver.ensure_running()
        try:
            yield
        finally:
            stop()
