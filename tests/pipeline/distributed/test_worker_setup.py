"""The worker preload's allocator settings (``pipeline.distributed.worker_setup.tune_malloc``):
under the environment Dask's nanny gives a worker (``MALLOC_TRIM_THRESHOLD_=65536``), an array of
a chunk task's size (800 kB: 100,000 labels) takes a page fault for every 4 kB page each time it
is allocated; once tuned, it comes back from the heap without one. Counted with ``getrusage``
in a fresh interpreter, and in the worker process of a real ``LocalCluster``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.distributed.client import dask_client

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's mallopt (the Linux workers')"
)

# the probe: 40 arrays of 100,000 float64, each written and freed; minor faults per array
PROBE = """
import resource
import numpy as np

def faults_per_array(n=40):
    flt = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(100_000)
    del a
    f0 = flt()
    for _ in range(n):
        a = np.ones(100_000)
        del a
    return (flt() - f0) / n
"""


def _faults_in_fresh_process(tune: bool) -> float:
    code = (
        PROBE
        + "from pipeline.distributed.worker_setup import tune_malloc\n"
        + ("assert tune_malloc()\n" if tune else "")
        + "import json; print(json.dumps(faults_per_array()))\n"
    )
    env = {"MALLOC_TRIM_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout))


def test_tuned_allocator_reuses_a_chunk_sized_array_without_faults() -> None:
    # the premise: each 800 kB array faults in its 196 pages (some fewer where glibc reuses a
    # mapping), and the tuned process takes none (the first array, before the count, grew the
    # heap)
    assert _faults_in_fresh_process(tune=False) > 150
    assert _faults_in_fresh_process(tune=True) < 2


def test_the_preload_tunes_every_worker_process() -> None:
    namespace: dict[str, object] = {}
    exec(PROBE, namespace)
    probe = namespace["faults_per_array"]
    # a worker process as ``dpmm run`` starts them (nanny, preload), loading no engine's kernels
    with dask_client(n_workers=1, dashboard_address=None, quiet=True, warm=["none"]) as client:
        per_worker = client.run(probe)
    assert len(per_worker) == 1
    assert all(f < 2 for f in per_worker.values()), per_worker
