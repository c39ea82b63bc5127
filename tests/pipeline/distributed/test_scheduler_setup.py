"""The scheduler preload's shorter message batches (``pipeline.distributed.scheduler_setup``):
every connection from the scheduler to a worker of a cluster ``dask_client`` starts, including a
worker that joins later, and the client's connection to the scheduler, batch for
``BATCH_INTERVAL`` instead of Dask's 5 and 10 ms. Checked on a real ``LocalCluster``."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.distributed.client import dask_client
from pipeline.distributed.scheduler_setup import BATCH_INTERVAL


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
