"""Fixtures shared by the test modules."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster

# Prefect's temporary servers (the test harness's, a subprocess's) give up after 30 s by default;
# a machine busy with other tests can take longer to start one
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")


@contextlib.contextmanager
def local_client(n_workers: int = 2) -> Iterator[Client]:
    """A real Dask client of ``n_workers`` single-threaded workers in this process."""
    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def client():
    """Two workers, shared by the tests of a module."""
    with local_client(2) as c:
        yield c


@pytest.fixture(scope="session", autouse=True)
def _dataset_root(tmp_path_factory):
    """Shared dataset stores of the tests' runs go to a temporary root, not the user's cache
    (subprocesses inherit it through the environment)."""
    from pipeline.dataset import DATA_DIR_ENV

    old = os.environ.get(DATA_DIR_ENV)
    os.environ[DATA_DIR_ENV] = str(tmp_path_factory.mktemp("datasets"))
    yield
    if old is None:
        os.environ.pop(DATA_DIR_ENV, None)
    else:
        os.environ[DATA_DIR_ENV] = old
