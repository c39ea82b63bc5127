"""Fixtures shared by the test modules."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client, LocalCluster
from hypothesis import settings

from pipeline.distributed.client import PROFILE_KEY
from tests import faults, prefect_db

# CI (``.ci/run``: HYPOTHESIS_PROFILE=ci) draws the same examples on every run, so that a failure
# there is the code's and not a new draw's; other runs draw new examples each time (and keep the
# ones that fail in .hypothesis/), which is how the property tests keep finding cases
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Prefect's temporary servers (the test harness's, a subprocess's) give up after 30 s by default;
# a machine busy with other tests can take longer to start one
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")

# Prefect's database for the commands the tests run (subprocesses inherit it): one of this test
# process's own, not the user's, and not shared with the other processes of ``pytest -n 3``, whose
# temporary servers would write the same SQLite file at once; it starts as a copy of a migrated
# one (``tests.prefect_db``), as a machine's does after ``dpmm warm``
if "PREFECT_HOME" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER"):
    _prefect_home = tempfile.mkdtemp(prefix="dpmm-tests-prefect-")
    atexit.register(shutil.rmtree, _prefect_home, ignore_errors=True)
    os.environ["PREFECT_HOME"] = prefect_db.new_home(Path(_prefect_home))

# the suite tests the kernels as a source checkout has them, compiled at first use into the numba
# cache: never the shipped ones (``kernels._cache.SHIPPED``) a ``make wheel`` here left behind,
# which tests/flows/test_warm.py reads in a wheel of its own
os.environ.setdefault("DPMM_SHIPPED_KERNELS", "0")

#: lines of a probe script run in a fresh process: from then on, ``compiled`` lists the name of
#: every function numba compiles there, ``signatures`` its module-qualified name and argument
#: types (literals as their types), and ``compiled_again()`` the kernels compiled more than once
#: for one signature but for the literal values of their arguments
RECORD_COMPILES = """
from collections import Counter
from numba.core import event, types
compiled, signatures = [], []


class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        compiled.append(f.__qualname__)
        args = tuple(str(types.unliteral(a)) for a in ev.data["args"])
        signatures.append((f"{f.__module__}.{f.__qualname__}", args))

    def on_end(self, ev):
        pass


def compiled_again():
    again = {name for (name, _), n in Counter(signatures).items() if n > 1}
    return sorted(name for name in again if name.startswith("kernels."))


event.register("numba:compile", Compiles())
"""


def kernel_signatures() -> set[tuple[str, Any]]:
    """Every (kernel, signature) this process holds compiled or loaded from the cache."""
    import sys

    from numba.core.registry import CPUDispatcher

    return {
        (f"{module}.{attr}", sig)
        for module, mod in list(sys.modules.items())
        if module.startswith("kernels")
        for attr, f in list(vars(mod).items())
        if isinstance(f, CPUDispatcher)
        for sig in list(f.overloads)
    }


#: the kernels that a first fit compiles once per value of a constant its callers write at the
#: call (a block size, a family's flag): by design. Any other kernel compiled again for the
#: literal values of its arguments is wasted compiling, most often a loop's counter started at
#: a literal (``np.int64(0)`` instead: ASUGS's stream compiled twice, 14 CPU s)
AT_THE_CALL = {
    "kernels.arrays.aligned_matrix",
    "kernels.obs._common.count_sum_log_marginal",
    "kernels.obs._common.table_log_predictive",
    "kernels.obs.gaussian_nw.block_quad_forms",
    "kernels.obs.gaussian_nw.update_with",
}

#: the environment of a fresh process whose empty numba cache is there to count what a call
#: compiles, not to be loaded: LLVM's optimisation off, which changes no compilation, only their
#: cost (a first binary fit's 148 compilations: 48 CPU s at the default level, 34 s at 0; numba
#: then declines to cache some of them, which such a test does not need)
COUNT_ONLY = {"NUMBA_OPT": "0"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with a test marked ``slow`` first, each module's tests kept together and in
    order (a module's fixtures are set up once): ``pytest -n 3 --dist worksteal`` then starts the
    longest end-to-end tests while there is other work to share, instead of ending on one."""
    slow = {it.path for it in items if it.get_closest_marker("slow") is not None}
    items.sort(key=lambda it: it.path not in slow)


@contextlib.contextmanager
def local_client(n_workers: int = 2) -> Iterator[Client]:
    """A real Dask client of ``n_workers`` single-threaded workers in this process."""
    # without Dask's profiler, as ``pipeline.distributed.client.dask_client`` starts its clusters
    # (its
    # sys._current_frames() can deadlock CPython 3.11 before 3.11.9)
    with dask.config.set({PROFILE_KEY: False}):
        cluster = LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=False, dashboard_address=None
        )
    with cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def client():
    """Two workers, shared by the tests of a module."""
    with local_client(2) as c:
        yield c


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium (``tests.browser.Browser``) for the page checks of this process;
    skips the test without one (fails it under CI)."""
    from tests.browser import Browser, chromium_or_skip

    started = Browser(chromium_or_skip(), tmp_path_factory.mktemp("browser-profile"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="session", autouse=True)
def _dataset_root(tmp_path_factory):
    """Shared dataset stores of the tests' runs go to a temporary root, not the user's cache
    (subprocesses inherit it through the environment)."""
    from pipeline.data.dataset import DATA_DIR_ENV

    old = os.environ.get(DATA_DIR_ENV)
    os.environ[DATA_DIR_ENV] = str(tmp_path_factory.mktemp("datasets"))
    yield
    if old is None:
        os.environ.pop(DATA_DIR_ENV, None)
    else:
        os.environ[DATA_DIR_ENV] = old


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """An S3-compatible server (moto's server mode) on 127.0.0.1, and the environment every
    process of a test reads its credentials and endpoint from (``pipeline.core.storage``): the
    endpoint URL. Tests make their own buckets (``s3_bucket``)."""
    import logging
    import threading

    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    # the server's request log would fill the tests' output
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # one request at a time, and the faults ``failing_s3`` injects (tests/faults.py). moto's S3
    # app itself: the dispatcher of its server mode, which serves every AWS service, finds the
    # app anew for each request (a listing of moto's folders and a scan of every service's URL
    # patterns: 1.6 ms of this process's CPU, under the GIL the runs it serves need too)
    app = faults.S3App(create_backend_app("s3"))
    faults.SERVER = app
    server = make_server("127.0.0.1", 0, app, True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        # no instance metadata service to ask offline; no user's files to read
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env["AWS_ENDPOINT_URL"]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.shutdown()
        thread.join()
        faults.SERVER = None


@pytest.fixture
def failing_s3(s3_server: str) -> Any:
    """``with failing_s3(rate, kinds, ops, match, limit, seed) as f: ...``: the ``s3_server``
    fails a fraction ``rate`` of its requests during the block (``tests.faults.failing_s3``)."""
    return faults.failing_s3


@pytest.fixture
def full_disk() -> Any:
    """``with full_disk(path, size) as disk: ...``: a file system of ``size`` bytes mounted at
    ``path`` during the block (``tests.faults.full_disk``; ``disk.how``: tmpfs or loop)."""
    return faults.full_disk


@pytest.fixture
def s3_bucket(s3_server: str, request: pytest.FixtureRequest) -> str:
    """A new empty bucket of the test's own on the ``s3_server``: its name."""
    import re
    import uuid

    import boto3

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket


class Crash(RuntimeError):
    """The crash a test injects into a run (``crash_after_pass``, ``crash_after_fits``)."""


@pytest.fixture
def crash_after_pass(monkeypatch: pytest.MonkeyPatch):
    """``with crash_after_pass(n): ...``: every pass loop the block runs
    (``pipeline.distributed.loop.run_passes``, a flow's included) crashes once pass ``n`` is
    checkpointed, as a driver killed there would; the block must end in that crash."""
    from pipeline.distributed import loop

    @contextlib.contextmanager
    def armed(n: int) -> Iterator[None]:
        run_passes = loop.run_passes

        def crashing(*args, on_pass=None, **kwargs):
            def after(state):
                if on_pass is not None:
                    on_pass(state)
                if state.pass_no == n:
                    raise Crash(f"crash after pass {n}")

            return run_passes(*args, on_pass=after, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(loop, "run_passes", crashing)
            with pytest.raises(Crash):
                yield

    return armed


@pytest.fixture
def crash_after_fits(monkeypatch: pytest.MonkeyPatch):
    """``with crash_after_fits(n): ...``: a ``cv`` flow run in the block crashes once ``n`` fold
    fits are persisted (``pipeline.ops.cv.ResultLog.put``: each fit after the n-1th fails once
    its result is written, and so does the flow); the block must end in that crash."""
    from pipeline.ops import cv as pcv

    @contextlib.contextmanager
    def armed(n: int) -> Iterator[None]:
        put = pcv.ResultLog.put
        done = []

        def crashing(self, res):
            put(self, res)
            done.append(res)
            if len(done) >= n:
                raise Crash(f"crash after {len(done)} fits")

        with monkeypatch.context() as m:
            m.setattr(pcv.ResultLog, "put", crashing)
            with pytest.raises(Crash):
                yield

    return armed
