"""The Dask client a fit runs on: an existing scheduler, or a LocalCluster of single-threaded
worker processes with the preloads ``pipeline.distributed.worker_setup`` (kernels) and
``pipeline.distributed.scheduler_setup`` (message batching).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

#: starts of a local cluster tried before its failure is raised
START_TRIES = 3


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = "127.0.0.1:8787",
    quiet: bool = False,
    warm: Sequence[str] | None = None,
    device: str = "cpu",
) -> Iterator[Any]:
    """A ``distributed.Client`` to ``scheduler``, else to a new ``LocalCluster`` of ``n_workers``
    single-threaded workers (default one per core) on 127.0.0.1, whose workers load the kernels
    of the engines ``warm`` (default all) while they start; ``device="gpu"``: ``gpu_cluster``'s.
    Prints the dashboard."""
    import logging

    import dask
    from distributed import Client

    from pipeline.core.tasks import WORKER_WAIT
    from pipeline.distributed import scheduler_setup

    # the scheduler's and nannies' INFO lines would bury the progress bars
    logging.getLogger("distributed").setLevel(logging.WARNING)
    with contextlib.ExitStack() as stack:
        if scheduler:
            client = Client(scheduler)
            cluster = None
        else:
            # a killed worker's nanny starts it again, which a loaded machine can take longer than
            # Dask's lost-worker-timeout (15 s) to finish: the cluster then closes that nanny, and
            # with every worker killed at once none is left and the command waits for ever. Read
            # when a worker leaves, so it holds for the cluster's whole life
            stack.enter_context(dask.config.set({LOST_KEY: f"{WORKER_WAIT}s"}))
            cluster = _start_local(n_workers, processes, dashboard_address, warm, device)
            client = Client(cluster)
        # the client's side of scheduler_setup's shorter batches: a pass's graph goes out at once
        scheduler_setup.short_batches(getattr(client, "scheduler_comm", None))
        try:
            if not quiet:
                served = "dashboard" in client.scheduler_info().get("services", {})
                link = (
                    client.dashboard_link if served and (dashboard_address or scheduler) else None
                )
                print(f"Dask dashboard: {link or 'disabled'}", file=sys.stderr)
            yield client
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def _start_local(
    n_workers: int | None,
    processes: bool,
    dashboard_address: str | None,
    warm: Sequence[str] | None,
    device: str,
) -> Any:
    """``dask_client``'s new cluster: a LocalCluster, or ``gpu_cluster``'s on ``device="gpu"``."""
    import dask
    from distributed import LocalCluster

    from pipeline.distributed import scheduler_setup

    # no statistical profiler in the workers: it can deadlock CPython 3.11 before 3.11.9
    # (python/cpython#116969); fewer event-loop checks (scheduler_setup). A dashboard port
    # in use (another cluster's) is replaced by a free one, which the line below names: the
    # warning that says so would be a second line on stderr, before an error's one line
    with (
        dask.config.set({PROFILE_KEY: False, **scheduler_setup.TICK_CONFIG}),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", r"Port \d+ is already in use", UserWarning)

        # a worker process killed while it starts (the OOM killer, a user) fails the whole
        # start, which closes what it started: start again, as a pass reruns a lost task
        def start() -> Any:
            if device == "gpu":
                return gpu_cluster(n_workers, processes, dashboard_address, warm)
            return LocalCluster(
                n_workers=int(n_workers or os.cpu_count() or 1),
                threads_per_worker=1,
                processes=processes,
                dashboard_address=dashboard_address,
                memory_limit=0,
                # worker processes: local only, told which engine to load and where this
                # process's Dask log lines go (env)
                **({"host": "127.0.0.1", "env": _worker_env(warm)} if processes else {}),
                preload=["pipeline.distributed.worker_setup"] if processes else None,
                scheduler_kwargs={"preload": [scheduler_setup.PRELOAD]},
            )

        for _ in range(START_TRIES - 1):
            with contextlib.suppress(RuntimeError):
                return start()
        return start()


def _worker_env(warm: Sequence[str] | None) -> dict[str, str]:
    """The environment of a LocalCluster's worker processes: the engines to load
    (``WARM_ENV``) and the log file of this process's Dask lines (``LOG_ENV``), when set."""
    from pipeline.core.logs import LOG_ENV, file_of
    from pipeline.distributed.worker_setup import WARM_ENV

    log = file_of()
    return {
        **({WARM_ENV: ",".join(warm)} if warm else {}),
        **({LOG_ENV: log} if log is not None else {}),
    }


def gpu_cluster(
    n_workers: int | None,
    processes: bool,
    dashboard_address: str | None,
    warm: Sequence[str] | None = None,
) -> Any:
    """A local cluster of one single-threaded worker per GPU (dask-cuda's ``LocalCUDACluster``;
    under numba's CUDA simulator ``n_workers`` ordinary workers). ``DeviceError`` without a GPU
    or dask-cuda."""
    import importlib.util

    from distributed import LocalCluster

    from kernels.cuda_device import simulated
    from pipeline.distributed import scheduler_setup
    from pipeline.engines.gpu import DeviceError, require_device

    require_device()
    if simulated():
        return LocalCluster(
            n_workers=n_workers or 1,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=dashboard_address,
            memory_limit=0,
            **({"host": "127.0.0.1"} if processes else {}),
            scheduler_kwargs={"preload": [scheduler_setup.PRELOAD]},
        )
    if importlib.util.find_spec("dask_cuda") is None:
        raise DeviceError(
            "device 'gpu': dask-cuda is not installed (one Dask worker per GPU); "
            "install the GPU extra: pip install -e '.[gpu]', or give --scheduler"
        )
    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(
        n_workers=n_workers,
        threads_per_worker=1,
        dashboard_address=dashboard_address,
        memory_limit=0,
        host="127.0.0.1",
        # the host step's kernels (the CPU engines'), not every engine's
        env=_worker_env(warm),
        preload=["pipeline.distributed.worker_setup"],
        scheduler_kwargs={"preload": [scheduler_setup.PRELOAD]},
    )


#: whether Dask workers sample their threads' stacks (``dask_client``'s clusters: off)
PROFILE_KEY = "distributed.worker.profile.enabled"
#: how long a cluster waits for a lost worker to come back before it closes the worker's nanny
LOST_KEY = "distributed.deploy.lost-worker-timeout"
