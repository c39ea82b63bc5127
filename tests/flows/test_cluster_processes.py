"""``dpmm run --scheduler`` on a Dask cluster of separate processes that share no files: a
``dask scheduler`` and two ``dask worker --preload pipeline.distributed.worker_setup`` processes on
127.0.0.1, each worker in its own working directory with its own copy of the numba cache, the
input, the dataset store and OUT on a local S3 server (``s3_server``). One worker is killed in the
middle of a pass; the run finishes on the other with the labels of an undisturbed run. The same
over TLS (``tls://``) with certificates the test makes (trustme), the client's given as Dask's
``distributed.comm.tls`` settings in the environment, as the README documents."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cluster import cluster
from pipeline.core import outputs, storage
from tests.faults import stop_processes

BIN = Path(sys.executable).parent


pytestmark = pytest.mark.usefixtures("prefect_harness")


@dataclass
class Processes:
    """The cluster: the scheduler's address, the worker processes and their directories, and
    the environment (TLS settings) a client needs."""

    address: str
    workers: list[subprocess.Popen[bytes]]
    dirs: list[Path]
    env: dict[str, str] = field(default_factory=dict)


def tls_files(d: Path) -> dict[str, str]:
    """A CA and one certificate for 127.0.0.1 (scheduler, workers and client), as files."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": d / "ca.pem", "cert": d / "cert.pem", "key": d / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(files["cert"]), append=i > 0)
    return {k: str(v) for k, v in files.items()}


def _wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(what)
        time.sleep(0.2)


@contextlib.contextmanager
def dask_processes(tmp: Path, tls: bool) -> Iterator[Processes]:
    """``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, each worker in its
    own directory (its working, local and numba cache directory)."""
    env = dict(os.environ)
    env.pop("DPMM_DATA_DIR", None)
    flags: list[str] = []
    client_env: dict[str, str] = {}
    if tls:
        f = tls_files(tmp)
        flags = ["--tls-ca-file", f["ca"], "--tls-cert", f["cert"], "--tls-key", f["key"]]
        client_env = {
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f["ca"],
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": f["cert"],
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": f["key"],
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        }
    protocol = ["--protocol", "tls"] if tls else []
    sched_file = tmp / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    (tmp / "scheduler").mkdir()
    logs = contextlib.ExitStack()
    sched = subprocess.Popen(
        [
            *(str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"),
            *("--no-dashboard", "--scheduler-file", str(sched_file), *protocol, *flags),
        ],
        cwd=tmp / "scheduler",
        env=env,
        stdout=logs.enter_context(open(tmp / "scheduler" / "log", "wb")),
        stderr=subprocess.STDOUT,
    )
    procs.append(sched)
    workers: list[subprocess.Popen[bytes]] = []
    dirs: list[Path] = []
    try:
        _wait_for(sched_file.exists, 120, "the scheduler did not start")
        address = json.loads(sched_file.read_text())["address"]
        numba_cache = os.environ.get("NUMBA_CACHE_DIR")
        for i in range(2):
            d = tmp / f"worker{i}"
            d.mkdir()
            wenv = {**env, "DPMM_WARM_ENGINES": "mapdp", "NUMBA_CACHE_DIR": str(d / "numba")}
            if numba_cache and Path(numba_cache).is_dir():
                # its own copy: the workers share no file, yet need not compile the kernels
                shutil.copytree(numba_cache, d / "numba")
            w = subprocess.Popen(
                [
                    *(str(BIN / "dask"), "worker", address, "--host", "127.0.0.1"),
                    *("--nthreads", "1", "--no-nanny", "--memory-limit", "0", "--no-dashboard"),
                    *(
                        "--local-directory",
                        str(d / "dask"),
                        "--preload",
                        "pipeline.distributed.worker_setup",
                    ),
                    *("--name", f"w{i}", *protocol, *flags),
                ],
                cwd=d,
                env=wenv,
                stdout=logs.enter_context(open(d / "log", "wb")),
                stderr=subprocess.STDOUT,
            )
            workers.append(w)
            procs.append(w)
            dirs.append(d)
        yield Processes(address, workers, dirs, client_env)
    finally:
        stop_processes(procs)
        logs.close()


@contextlib.contextmanager
def dask_env(env: dict[str, str]) -> Iterator[None]:
    """This process's Dask client settings (the TLS files), as the subprocesses get them."""
    import dask

    keys = {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": "distributed.comm.tls.ca-file",
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": "distributed.comm.tls.client.cert",
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": "distributed.comm.tls.client.key",
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "distributed.comm.require-encryption",
    }
    values = {keys[k]: (True if k.endswith("ENCRYPTION") else v) for k, v in env.items()}
    with dask.config.set(values):
        yield


def blobs(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    means = 8.0 * np.vstack([np.zeros(3), np.eye(3), -np.eye(3)])
    y = rng.integers(0, len(means), size=n)
    return pd.DataFrame(means[y] + rng.normal(size=(n, 3)), columns=["a", "b", "c"])


def labels_of(out: str) -> np.ndarray:
    return np.asarray(zarr.open_array(f"{out}/labels.zarr/label", mode="r")[:])


@pytest.fixture(scope="module")
def undisturbed(s3_server: str) -> dict[str, Any]:
    """The input on S3 in a bucket of the module's, and the labels and passes of an
    undisturbed run of it (threads in this process; the dataset store on S3, which the runs of
    the tests then reuse)."""
    import uuid

    import boto3

    bucket = f"processes-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    b = f"s3://{bucket}"
    with storage.location(f"{b}/in.parquet").open("wb") as fh:
        blobs(12000, 7).to_parquet(fh, index=False, row_group_size=2000)
    run = cluster(
        f"{b}/in.parquet",
        f"{b}/ref",
        data_dir=f"{b}/datasets",
        processes=False,
        n_workers=2,
        dashboard_address=None,
        progress=False,
        **OPTS,
    )
    assert run["metrics"]["passes"] >= 3
    return {"bucket": b, "passes": run["metrics"]["passes"], "labels": labels_of(f"{b}/ref")}


# at a fixed prior scale: the run takes three passes or more, so that a kill lands mid-run
OPTS = {
    "chunk_rows": 1000,
    "random_state": 3,
    "report": False,
    "init": "sequential",
    "prior_scale": 0.3,
}


@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_separate_processes_lose_a_worker_mid_pass(
    undisturbed: dict[str, Any], tmp_path: Path, tls: bool
) -> None:
    from distributed import Client

    b = undisturbed["bucket"]
    out = f"{b}/out-{'tls' if tls else 'tcp'}"
    with dask_processes(tmp_path, tls) as c, dask_env(c.env):
        scheme = "tls://" if tls else "tcp://"
        assert c.address.startswith(scheme)
        client = Client(c.address, timeout=60)
        _wait_for(lambda: len(client.scheduler_info()["workers"]) == 2, 180, "no 2 workers")
        argv = [str(BIN / "dpmm"), "run", f"{b}/in.parquet", "--out", out]
        argv += ["--data-dir", f"{b}/datasets", "--scheduler", c.address, "--quiet"]
        argv += ["--chunk-rows", "1000", "--seed", "3", "--no-report", "--init", "sequential"]
        argv += ["--prior-scale", "0.3"]
        env = {k: v for k, v in os.environ.items() if k != "DPMM_DATA_DIR"}
        run = subprocess.Popen(
            argv, env={**env, **c.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        victim = c.workers[0]
        victim_addr = next(
            a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "w0"
        )

        def victim_busy() -> bool:
            if run.poll() is not None:
                raise AssertionError(f"the run ended before the kill: {run.communicate()}")
            busy = client.processing(workers=[victim_addr]).get(victim_addr, [])
            return any(str(k).startswith("chunk_task") for k in busy)

        _wait_for(victim_busy, 300, "the victim never ran a pass's chunk")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err.decode()
        _wait_for(lambda: len(client.scheduler_info()["workers"]) == 1, 60, "w0 still seen")
        client.close()
    got = json.loads(storage.location(f"{out}/run.json").read_text())
    assert outputs.committed(storage.location(out))
    assert got["metrics"]["passes"] == undisturbed["passes"]
    assert got["dataset"]["reused"]
    np.testing.assert_array_equal(labels_of(out), undisturbed["labels"])
    # nothing of the data went to a worker's disk: no zarr array, no record, no table
    for d in c.dirs:
        names = ("zarr.json", "format.json", "run.json")
        written = [
            p
            for p in d.rglob("*")
            if p.is_file() and (p.name in names or p.suffix in (".npz", ".parquet"))
        ]
        assert written == [], written
