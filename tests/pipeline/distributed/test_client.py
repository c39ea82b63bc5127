"""``dask_client``'s LocalCluster keeps its workers: a worker killed with every other one comes
back through its nanny however long the start takes. Checked on a real ``LocalCluster``."""

from __future__ import annotations

import os
import signal
import time

import dask
import pytest

from pipeline.distributed.client import LOST_KEY, dask_client


def test_every_worker_killed_comes_back_however_slow_its_restart() -> None:
    """Every worker killed at once, each restart slower than Dask's lost-worker-timeout (shrunk
    to 0.2 s here; a loaded 2-core machine takes over its 15 s to restart a worker): both come
    back and the cluster computes. Before, the cluster closed the nanny of each worker not back
    in time, no worker was left, and ``dpmm serve`` (the fault campaign's kill-workers) waited
    for ever."""
    with (
        dask.config.set({LOST_KEY: "0.2s"}),
        dask_client(n_workers=2, dashboard_address=None, quiet=True, warm=["none"]) as client,
    ):
        old = client.run(os.getpid)
        for pid in old.values():
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 180
        while True:
            now = client.scheduler_info()["workers"]
            if len(now) == 2 and not set(now) & set(old):
                break
            assert time.monotonic() < deadline, f"workers after the kill: {sorted(now)}"
            time.sleep(0.2)
        # the nannies stayed (the cluster closes one 0.2 s after its worker left, were it not
        # for dask_client's timeout), and the new workers compute
        time.sleep(1.0)
        assert len(client.cluster.workers) == 2
        assert client.submit(sum, [1, 2, 3], pure=False).result(timeout=120) == 6
        assert not set(client.run(os.getpid).values()) & set(old.values())


def _prints() -> int:
    import logging
    import sys
    import warnings

    print("worker-print", file=sys.stderr, flush=True)
    os.write(2, b"worker-fd\n")
    warnings.warn("worker-warning", UserWarning, stacklevel=1)
    # what reaches the root logger (asyncio's report of a task exception nobody retrieved)
    logging.getLogger("asyncio").error("worker-asyncio")
    # a failed task's "Compute Failed" and its traceback
    logging.getLogger("distributed.worker").error("worker-log")
    return os.getpid()


@pytest.mark.parametrize("distributed_handler", [True, False], ids=["own", "root"])
def test_a_worker_process_prints_into_the_commands_log(
    tmp_path, capfd, monkeypatch, distributed_handler: bool
) -> None:
    """While the command's lines go to its log file, so does everything a worker process of
    its LocalCluster writes to stderr, by logging or not: the terminal the command shares with
    its workers gets none of it (the fault campaign counted a worker's traceback there).
    distributed's loggers have a terminal handler of their own where it was imported first
    ("own"), and none, their lines reaching the root's, where Prefect was, as in ``dpmm``'s
    process ("root": the case the campaign met, whose workers were never told the file)."""
    import logging

    from pipeline.core.logs import to_file

    # the handlers of the command's process, not pytest's
    dist = logging.getLogger("distributed")
    monkeypatch.setattr(dist, "handlers", [logging.StreamHandler()] if distributed_handler else [])
    monkeypatch.setattr(dist, "propagate", not distributed_handler)
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler()])
    log = tmp_path / "run.log"
    back = to_file(log)
    try:
        with dask_client(n_workers=1, dashboard_address=None, quiet=True, warm=["none"]) as c:
            pid = c.submit(_prints, pure=False).result(timeout=120)
    finally:
        back()
    assert pid != os.getpid()
    err, text = capfd.readouterr().err, log.read_text()
    for line in ("worker-print", "worker-fd", "worker-warning", "worker-asyncio", "worker-log"):
        assert line in text, line
        assert line not in err, err
