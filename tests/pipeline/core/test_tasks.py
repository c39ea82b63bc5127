"""``pipeline.core.tasks``: ``gather`` on a real ``LocalCluster`` (the results in the futures'
order whatever order the tasks end in, ``on_done`` once per future as it ends, a task's error
raised as the task raised it), ``chunk_groups`` against a simulation of the tasks on their
threads, ``map_chunks`` on a real ``LocalCluster``, and ``on_scattered`` on one of worker
processes killed under it."""

from __future__ import annotations

import heapq
import os
import signal
import time
from concurrent.futures import CancelledError
from typing import Any

import pytest
from distributed import get_task_stream
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.tasks import (
    SCATTER_TRIES,
    TASK_ROWS,
    chunk_groups,
    gather,
    map_chunks,
    on_scattered,
    rounds,
)
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


# -- chunk_groups -------------------------------------------------------------------------------


def _simulated_span(sizes: list[int], slots: int) -> int:
    """The map's length in chunk-lengths: each task, in order, on the thread free first."""
    free = [0] * slots
    for s in sizes:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


@settings(max_examples=300, deadline=None)
@given(
    n_chunks=st.integers(0, 1200),
    chunk_rows=st.sampled_from([1, 1_000, 97_657, 100_000, 400_000, 2_000_000]),
    slots=st.integers(1, 64),
)
def test_chunk_groups_cover_every_chunk_in_order_and_end_soonest(
    n_chunks: int, chunk_rows: int, slots: int
) -> None:
    groups = chunk_groups(n_chunks, chunk_rows, slots)
    assert [i for g in groups for i in g] == list(range(n_chunks))
    if not n_chunks:
        return
    most = max(1, min(n_chunks, TASK_ROWS // chunk_rows))
    sizes = [len(g) for g in groups]
    g = sizes[0]
    assert g <= most and all(s == g for s in sizes[:-1]) and sizes[-1] <= g
    span = _simulated_span(sizes, slots)
    assert span == rounds(n_chunks, g, slots)
    # no group size the cap allows ends sooner, none larger ends as soon, and a task per
    # chunk never ends sooner
    spans = {
        h: _simulated_span([h] * (n_chunks // h) + [n_chunks % h] * (n_chunks % h > 0), slots)
        for h in range(1, most + 1)
    }
    assert span == min(spans.values())
    assert all(spans[h] > span for h in range(g + 1, most + 1))
    assert span <= -(-n_chunks // slots)


@pytest.mark.parametrize(
    "n_chunks, slots, sizes",
    [
        (112, 16, [7] * 16),
        (112, 2, [14] * 8),
        (112, 1, [16] * 7),
        (20, 2, [10, 10]),
        (20, 16, [2] * 10),
        (1024, 2, [16] * 64),
        (5, 2, [3, 2]),
        (1, 8, [1]),
    ],
)
def test_chunk_groups_of_the_docstring(n_chunks: int, slots: int, sizes: list[int]) -> None:
    assert [len(g) for g in chunk_groups(n_chunks, 100_000, slots)] == sizes


def test_chunk_groups_of_wide_chunks_are_a_chunk_each() -> None:
    assert [len(g) for g in chunk_groups(10, 2 * TASK_ROWS, 1)] == [1] * 10


# -- map_chunks --------------------------------------------------------------------------------


def _chunk_fn(name: str, c: int, a: int, b: int, scale: int) -> tuple[str, int, int, int]:
    time.sleep(0.001 * (7 - c % 7))
    return name, c, b - a, scale * c


def _bad_chunk(c: int, a: int, b: int) -> int:
    if c == 5:
        raise ValueError(f"rows {a}..{b} are bad")
    return c


def test_map_chunks_gives_every_chunk_in_order_from_fewer_tasks(client, capsys) -> None:
    chunks = [(c, 10 * c, 10 * c + 10 - (c == 29)) for c in range(30)]
    scale = client.scatter(3, broadcast=True)
    with get_task_stream(client) as stream:
        got = map_chunks(client, _chunk_fn, chunks, ("x",), (scale,), desc="demo")
    assert got == [("x", c, 10 - (c == 29), 3 * c) for c in range(30)]
    # 30 narrow chunks on 2 threads: 2 tasks of 15, each named after the chunks' function
    assert sorted(str(r["key"]).split("-")[0] for r in stream.data) == ["_chunk_fn"] * 2
    err = capsys.readouterr().err
    assert "demo:" in err and "/299 " in err  # a bar over the chunks' 299 rows


def test_map_chunks_raises_a_chunks_error_and_maps_nothing_to_nothing(client) -> None:
    with pytest.raises(ValueError, match=r"rows 50\.\.60 are bad"):
        map_chunks(client, _bad_chunk, [(c, 10 * c, 10 * c + 10) for c in range(8)])
    assert map_chunks(client, _bad_chunk, []) == []


def test_threads_count_the_workers_a_cluster_plans() -> None:
    """Workers asked for but not yet joined (a batch queue, a cluster scaling up) count: the
    tasks of a map started before they join leave them work. A client that joined by the
    scheduler's address (no cluster object) counts the workers' threads alone."""
    from distributed import Client, LocalCluster

    from pipeline.core.tasks import threads

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
        Client(cluster.scheduler_address) as by_address,
    ):
        assert threads(c) == threads(by_address) == 2
        cluster.scale(3)
        assert threads(c) >= 3  # planned at once, whether or not they have joined
        c.wait_for_workers(3)
        assert threads(c) == threads(by_address) == 6


# -- on_scattered ---------------------------------------------------------------------------


def _plus(x: int, i: int) -> int:
    return x + i


def _kill_holders(c: Any, fut: Any) -> None:
    """Kill every worker process holding ``fut`` (their nannies start new ones) and wait until
    the scheduler has forgotten it."""
    holders = list(c.who_has([fut])[fut.key])
    for pid in c.run(os.getpid, workers=holders).values():
        os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while not fut.cancelled() and time.time() < deadline:
        time.sleep(0.01)
    assert fut.cancelled()


def test_on_scattered_scatters_again_when_the_last_holder_leaves() -> None:
    """Scattered data whose holders are killed is lost for good (Dask cannot recompute it):
    the tasks on it are cancelled, and ``on_scattered`` scatters it again and reruns them. A
    cancellation that loses nothing (a task cancelled) is raised at once."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        tries: list[str] = []

        def run(x: Any) -> list[int]:
            tries.append(x.key)
            if len(tries) == 1:
                _kill_holders(c, x)
            return gather(c, c.map(_plus, [x] * 4, range(4), pure=False))

        with pytest.warns(RuntimeWarning, match=r"demo: a worker that left .*\(try 2 of 4\)"):
            assert on_scattered(c, [10], run, what="demo") == [10, 11, 12, 13]
        assert len(tries) == 2 and tries[0] != tries[1]

        def cancelled(x: Any) -> Any:
            tries.append(x.key)
            fut = c.submit(time.sleep, 30, pure=False)
            c.cancel(fut)
            return fut.result()

        tries.clear()
        with pytest.raises(CancelledError):
            on_scattered(c, [10], cancelled)
        assert len(tries) == 1


def _exit_on_update_data(dask_worker: Any) -> None:
    """Make the worker's process end when data is next sent to it (a worker lost mid-scatter)."""
    dask_worker.handlers["update_data"] = lambda *args, **kwargs: os._exit(1)


def test_on_scattered_scatters_again_when_a_worker_leaves_during_the_scatter() -> None:
    """A worker whose process ends while the scatter sends it the data fails the scatter
    itself (the scheduler's connection to it closes): ``on_scattered`` scatters again, to the
    workers left or started again by their nannies, says so, and returns ``run``'s result."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        c.run(_exit_on_update_data)

        def run(x: Any) -> int:
            return int(c.submit(_plus, x, 1, pure=False).result())

        with pytest.warns(RuntimeWarning, match="demo: a worker left while its data was sent"):
            assert on_scattered(c, [10], run, what="demo") == 11


def test_on_scattered_gives_up_after_its_tries(client) -> None:
    tries: list[str] = []

    def lose(x: Any) -> Any:
        tries.append(x.key)
        client.cancel([x], force=True)  # the scattered data gone, as a lost worker leaves it
        return client.submit(_plus, x, 1, pure=False).result()

    with pytest.warns(RuntimeWarning) as told, pytest.raises(CancelledError):
        on_scattered(client, [1], lose)
    assert len(set(tries)) == SCATTER_TRIES == len(told) + 1
