"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="module")
def client():
    """A real Dask client: two single-threaded workers in this process."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c
