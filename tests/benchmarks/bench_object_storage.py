"""The cost of object storage (``make bench``; ``-m bench`` only): 1,000,000 x 10 records of the
20-cluster mixture of ``bench_distributed`` through the whole ``cluster`` flow (2 worker
processes, 1% held out) with INPUT, the dataset store and OUT on a local S3 server against the
same run on local disk, in the same session, round robin, each figure the median of ``REPEATS``
runs; the ratio S3 / local disk of each stage.

The S3 server is moto's server mode in a process of its own on 127.0.0.1 (a pure-Python server
that keeps the objects in memory: the ratio is an upper bound for a real S3-compatible store on
the same machine, whose server is faster, and a lower bound for one across a network). Each run
ingests into a dataset store of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from flows.cli.server import free_port
from pipeline.core import storage
from tests.benchmarks.bench_distributed import (  # noqa: F401
    PeakRSS,
    data_dir,
    mixture_npy,
    prefect_server,
)
from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
BUCKET = "dpmm-bench"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in its own process on 127.0.0.1, and this process's environment (the
    LocalCluster's workers inherit it) pointing at it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        t0 = time.monotonic()
        while True:
            try:
                boto3.client("s3").create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.monotonic() - t0 > 60:
                    raise
                time.sleep(0.5)
        yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=30)


def _run(src: str, out: str, data: str) -> tuple[dict[str, Any], float, int]:
    from flows.cluster import run_cluster_flow  # as ``dpmm run`` runs the flow

    with PeakRSS() as mem:
        t0 = time.perf_counter()
        run = run_cluster_flow(
            input=src,
            out=out,
            data_dir=data,
            overwrite=True,
            progress=False,
            holdout=0.01,
            n_workers=2,
            dashboard_address=None,
        )
        wall = time.perf_counter() - t0
    return run, wall, mem.peak


def test_1m_on_s3_against_local_disk(
    data_dir: Path,  # noqa: F811
    s3_endpoint: str,
    prefect_server: float,  # noqa: F811
) -> None:
    src = mixture_npy(data_dir / "mix1m.npy", 1_000_000)
    remote = storage.location(f"s3://{BUCKET}/mix1m.npy")
    assert isinstance(remote, storage.RemotePath)
    t0 = time.perf_counter()
    remote.fs.put_file(str(src), remote.key)
    upload = time.perf_counter() - t0
    where = {
        "local disk": (str(src), str(data_dir / "out-local"), str(data_dir / "ds-local")),
        "S3 (moto, 127.0.0.1)": (
            remote.url,
            f"s3://{BUCKET}/out",
            f"s3://{BUCKET}/datasets",
        ),
    }
    # one untimed run first: the first flow run of a process pays one-off costs (imports,
    # the flow's registration) that would land on whichever place is measured first
    _run(str(src), str(data_dir / "out-warm"), str(data_dir / "ds-warm"))
    timings: dict[str, list[dict[str, float]]] = {k: [] for k in where}
    runs: dict[str, dict[str, Any]] = {}
    peaks: dict[str, int] = {}
    labels: dict[str, np.ndarray] = {}
    # round robin: the machine's speed drifts, both places share the drift
    for _ in range(REPEATS):
        for name, (s, o, d) in where.items():
            storage.rmtree(storage.location(d), ignore_errors=True)
            run, wall, peak = _run(s, o, d)
            runs[name] = run
            peaks[name] = max(peaks.get(name, 0), peak)
            labels[name] = np.asarray(zarr.open_array(f"{o}/labels.zarr/label", mode="r")[:])
            t = run["timing"]
            timings[name].append(
                {
                    "seconds": wall,
                    "pipeline s": t["ingest"] + t["passes"] + t["write_out"],
                    "ingest": t["ingest"],
                    "passes s": t["passes"],
                    "write-out": t["write_out"],
                    # the finish (tables, report, model, run.json, the manifest) and Prefect
                    "rest": wall - sum(v for k, v in t.items() if k != "total"),
                }
            )
    np.testing.assert_array_equal(labels["S3 (moto, 127.0.0.1)"], labels["local disk"])
    rows = []
    med = {
        name: {k: float(np.median([r[k] for r in ts])) for k in ts[0]}
        for name, ts in timings.items()
    }
    for name in where:
        m = runs[name]["metrics"]
        rows.append(
            {
                "what": f"dpmm run 1M x 10, 2 workers, {name}",
                **med[name],
                "runs (s)": " ".join(f"{r['seconds']:.1f}" for r in timings[name]),
                "passes": m["passes"],
                "clusters": m["n_clusters"],
                "peak GB": peaks[name] / 1e9,
            }
        )
    local, s3 = med["local disk"], med["S3 (moto, 127.0.0.1)"]
    ratio = {k: s3[k] / local[k] for k in local if local[k] > 0}
    rows.append({"what": "ratio S3 / local disk", **ratio})
    print()
    print(table(rows))
    print(f"upload of the 80 MB input to the S3 server: {upload:.1f} s")
    save(
        "object_storage_1m",
        {"rows": rows, "ratio": ratio, "upload_seconds": upload, "repeats": REPEATS},
    )
