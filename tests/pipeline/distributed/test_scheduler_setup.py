"""The scheduler preload's shorter message batches (``pipeline.distributed.scheduler_setup``):
every connection from the scheduler to a worker of a cluster ``dask_client`` starts, including a
worker that joins later, and the client's connection to the scheduler, batch for
``BATCH_INTERVAL`` instead of Dask's 5 and 10 ms; and every server's event-loop check every
``TICK_INTERVAL`` (``slow_ticks``), set by ``dask_client`` and by the preloads. Checked on real
``LocalCluster``s."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.distributed.client import dask_client
from pipeline.distributed.scheduler_setup import BATCH_INTERVAL, TICK_INTERVAL


def _intervals(dask_scheduler: Any) -> dict[str, float]:
    return {w: c.interval for w, c in dask_scheduler.stream_comms.items()}


@pytest.mark.parametrize("processes", [True, False])
def test_every_worker_and_the_client_batch_briefly(processes: bool) -> None:
    assert BATCH_INTERVAL < 0.005  # below both of Dask's own
    with dask_client(
        n_workers=2, processes=processes, dashboard_address=None, quiet=True, warm=["none"]
    ) as client:
        assert client.scheduler_comm.interval == BATCH_INTERVAL
        before = client.run_on_scheduler(_intervals)
        assert len(before) == 2 and set(before.values()) == {BATCH_INTERVAL}
        if processes:
            # a worker restarted by its nanny joins as a new connection: short from the start
            old = sorted(before)[0]
            client.restart_workers([old])
            client.wait_for_workers(2)
            after = client.run_on_scheduler(_intervals)
            assert len(after) == 2 and set(after.values()) == {BATCH_INTERVAL}
            assert old not in after  # a new connection, not the old one kept
        # the cluster still computes
        assert client.submit(sum, [1, 2, 3]).result() == 6


def _tick_ms(dask_worker: Any = None, dask_scheduler: Any = None) -> float:
    return float((dask_worker or dask_scheduler).periodic_callbacks["tick"].callback_time)


def test_every_server_checks_its_event_loop_seldom() -> None:
    """``dask_client``'s cluster: the scheduler, every worker, a worker its nanny restarts and
    the nannies (in this process) check their event loops every ``TICK_INTERVAL``, not 20 ms."""
    ms = TICK_INTERVAL * 1000
    assert ms >= 100
    with dask_client(n_workers=2, dashboard_address=None, quiet=True, warm=["none"]) as client:
        assert client.run_on_scheduler(_tick_ms) == ms
        assert set(client.run(_tick_ms).values()) == {ms}
        nannies = client.cluster.workers.values()
        assert [_tick_ms(n) for n in nannies] == [ms, ms]
        client.restart_workers([sorted(client.scheduler_info()["workers"])[0]])
        client.wait_for_workers(2)
        assert set(client.run(_tick_ms).values()) == {ms}


def test_the_preloads_set_it_on_a_cluster_started_without_the_configuration() -> None:
    """A cluster started by hand (``dask scheduler`` / ``dask worker`` with the preloads, as
    ``infra/k8s`` and the jobqueue jobs do): the preloads set the scheduler's and workers'."""
    from distributed import Client, LocalCluster

    ms = TICK_INTERVAL * 1000
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            env={"DPMM_WARM_ENGINES": "none"},
            preload=["pipeline.distributed.worker_setup"],
            scheduler_kwargs={"preload": ["pipeline.distributed.scheduler_setup"]},
        ) as cluster,
        Client(cluster) as client,
    ):
        assert [_tick_ms(n) for n in cluster.workers.values()] == [20.0]  # Dask's own
        assert client.run_on_scheduler(_tick_ms) == ms
        assert set(client.run(_tick_ms).values()) == {ms}
