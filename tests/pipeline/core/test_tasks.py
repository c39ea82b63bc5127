"""``pipeline.core.tasks.gather`` on a real ``LocalCluster``: the results in the futures' order
whatever order the tasks end in, ``on_done`` once per future as it ends, and a task's error
raised as the task raised it."""

from __future__ import annotations

import time

import pytest

from pipeline.core.tasks import gather
from pipeline.distributed.client import dask_client


def _late(i: int, n: int) -> int:
    time.sleep(0.02 * (n - i))  # the last submitted ends first
    return i * i


def _fails(i: int) -> int:
    if i == 2:
        raise ValueError(f"chunk {i} is bad")
    return i


@pytest.fixture(scope="module")
def client():
    with dask_client(n_workers=2, processes=False, dashboard_address=None, quiet=True) as c:
        yield c


def test_results_in_the_futures_order_and_each_end_told_once(client) -> None:
    n = 6
    futs = client.map(_late, range(n), n=n, pure=False)
    ended: list[int] = []
    assert gather(client, futs, ended.append) == [i * i for i in range(n)]
    assert sorted(ended) == list(range(n))
    # the tasks ended in another order than they were submitted in
    assert ended != list(range(n))
    assert gather(client, client.map(_late, range(n), n=n, pure=False)) == [i * i for i in range(n)]


@pytest.mark.parametrize("tell", [False, True])
def test_a_task_error_is_raised(client, tell: bool) -> None:
    futs = client.map(_fails, range(4), pure=False)
    with pytest.raises(ValueError, match="chunk 2 is bad"):
        gather(client, futs, (lambda i: None) if tell else None)
