"""Dask scheduler preload for the clusters the pipeline starts (``dask_client``, the jobqueue
clusters of ``pipeline.distributed.hpc``), and for a scheduler started by hand with ``dask
scheduler --preload pipeline.distributed.scheduler_setup`` (``infra/k8s/dask-cluster.yaml``).

Dask batches the messages on its long-lived connections: the scheduler sends to a worker at
most every 5 ms, the client to the scheduler at most every 10 ms (``distributed.BatchedSend``;
neither is a configuration key). A message sent within that time of the previous one waits for
the rest of it. A pass of the pass loop starts right after the previous pass's futures were
released, so its graph waited for the client's 10 ms and its first tasks for the scheduler's
5 ms: about 10 ms of every pass that no worker computed, whatever the number of workers, and
the share of a pass that grows as more workers shorten the rest of it. This preload gives each
worker's connection ``BATCH_INTERVAL`` instead (``dask_client`` does the same for the client's
side: ``short_batches``).

Measured (2-core machine, one worker, MAP-DP passes of the pass loop over one chunk of 20,000
records whose task computes for 4.6 ms, medians of 10 passes): 23.8 ms a pass with Dask's
intervals, 17.6 with the client's at 1 ms, 13.2 with the client's and the scheduler's; the
scheduler's messages to its clients (2 ms) and the workers' to the scheduler (2 ms) made no
difference and are left alone. 0, 1 and 2 ms gave the same passes; at 1 ms the messages of one
moment still go out as one write.

Every Dask server (scheduler, nanny, worker) also checks its event loop's health every 20 ms
(``distributed.admin.tick.interval``): it only warns when a check comes more than 3 s late
(``tick.limit``), but the 50 wake-ups a second cost an idle worker 1.1-1.2% of a core and the
driver's process, which runs the scheduler and a ``LocalCluster``'s nannies, 2.0-2.2% (2
workers, 10 s idle, 2-core machine); at ``TICK_INTERVAL`` 0.29-0.34% and 0.8-0.9%. Both
preloads set it (``slow_ticks``), on any cluster; ``dask_client`` sets it in Dask's
configuration while it starts a local cluster (``TICK_CONFIG``), for the nannies, which run no
preload and which a ``LocalCluster`` runs in the driver's process.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

#: this module, as Dask's ``preload`` names it
PRELOAD = __name__

#: seconds between a server's checks of its event loop (Dask's: 20 ms)
TICK_INTERVAL = 0.5
#: the same as Dask's configuration, for the servers a cluster starts
TICK_CONFIG = {"distributed.admin.tick.interval": f"{round(TICK_INTERVAL * 1000)}ms"}

#: seconds a connection's batch waits for more messages (Dask's: 5 ms scheduler -> worker,
#: 10 ms client -> scheduler)
BATCH_INTERVAL = 0.001


def short_batches(comm: Any) -> None:
    """Set a ``distributed.BatchedSend``'s interval to ``BATCH_INTERVAL`` (nothing for None)."""
    if comm is not None and hasattr(comm, "interval"):
        comm.interval = BATCH_INTERVAL


def slow_ticks(server: Any) -> None:
    """Check a Dask server's event loop every ``TICK_INTERVAL`` (a server without Dask's
    ``tick`` callback is left as it is)."""
    tick = getattr(server, "periodic_callbacks", {}).get("tick")
    if tick is not None and hasattr(tick, "callback_time"):
        tick.callback_time = TICK_INTERVAL * 1000


class ShortBatches(SchedulerPlugin):  # type: ignore[misc]
    """Each worker's connection batches for ``BATCH_INTERVAL`` from the moment it joins (Dask
    opens it just before it calls the plugins' ``add_worker``). A Dask without the scheduler's
    ``stream_comms`` keeps its own batching: the setting is a speed, never a condition."""

    name = "dpmm-short-batches"

    async def start(self, scheduler: Any) -> None:
        for comm in getattr(scheduler, "stream_comms", {}).values():
            short_batches(comm)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        short_batches(getattr(scheduler, "stream_comms", {}).get(worker))


def dask_setup(scheduler: Any) -> None:
    """Called by Dask when the scheduler starts."""
    slow_ticks(scheduler)
    scheduler.add_plugin(ShortBatches())
