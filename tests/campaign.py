"""Every command under faults: the harness of the fault tests (``tests/flows/test_faults.py``)
and of the fault campaign (``make faults``: ``python -m tests.campaign``).

A command (``COMMANDS``: ``dpmm cv``, ``longitudinal``, ``hmm``, ``score``, ``serve --once`` and
``run --summaries``, the tree stage) runs as a user runs it, a process of its own, on small data
in a workspace (``Workspace``), against a Dask cluster of separate processes (a scheduler and two
nanny-supervised workers, ``Cluster``) and one Prefect server shared by all runs. A fault
(``FAULTS``) is injected at a moment drawn from the run's undisturbed duration: a worker
SIGKILLed, every worker SIGKILLed at once, or the whole command SIGKILLed and then run again.
Each run is classified (``classify``):

- ``equal``: it finished, its result (``Command.digest``: labels, the chosen cell, the model's
  arrays) is the undisturbed run's, and nothing is left behind (no hidden partial output, no
  process of the command's);
- ``error``: it stopped with exit status 2 and one line on stderr, and nothing half-written is
  visible;
- ``other``: anything else (a hang past the timeout, a wrong result, a traceback, an output or
  a process left behind), with the reason.

More fault kinds plug in as entries of ``FAULTS`` (``Fault``: the environment the command gets,
what is done at the drawn moment, whether the command is run again after it): storage errors
(an S3 endpoint answering 503 on a fraction of requests), a full disk under OUT or a damaged
chunk are such entries, next to the workspace's inputs on that storage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from tests.faults import stop_processes

BIN = Path(sys.executable).parent
# -- the cluster and the Prefect server every run shares -------------------------------------


def _wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(what)
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    """The live descendants of ``pid``."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _workers_of(pid: int) -> list[int]:
    """The Dask worker processes a nanny (or a LocalCluster's process) ``pid`` started."""
    import psutil

    found = []
    with contextlib.suppress(psutil.NoSuchProcess):
        for c in psutil.Process(pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if any("spawn_main" in a for a in c.cmdline()):
                    found.append(c.pid)
    return found


@dataclass
class Cluster:
    """A ``dask scheduler`` and ``dask worker --nanny`` processes on 127.0.0.1 (their nannies
    start a killed worker again), as a user's cluster that outlives the commands sent to it."""

    address: str
    nannies: list[subprocess.Popen[bytes]]

    def workers(self) -> list[int]:
        """The worker processes (the nannies' children) alive now."""
        return [w for n in self.nannies for w in _workers_of(n.pid)]

    def ready(self, n: int, timeout: float = 300) -> None:
        """Wait until ``n`` workers are connected to the scheduler again."""
        from distributed import Client

        with Client(self.address, timeout=60) as c:
            _wait_for(lambda: len(c.scheduler_info()["workers"]) >= n, timeout, "no workers")


@contextlib.contextmanager
def cluster(tmp: Path, n_workers: int = 2) -> Iterator[Cluster]:
    env = {k: v for k, v in os.environ.items() if k != "DPMM_DATA_DIR"}
    env["DPMM_WARM_ENGINES"] = "mapdp,ihmm,mixed,bhc"
    sched_file = tmp / "scheduler.json"
    logs = contextlib.ExitStack()
    base = [str(BIN / "dask")]
    procs = [
        subprocess.Popen(
            [
                *(*base, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
                *("--scheduler-file", str(sched_file)),
                *("--preload", "pipeline.distributed.scheduler_setup"),
            ],
            cwd=tmp,
            env=env,
            stdout=logs.enter_context(open(tmp / "scheduler.log", "wb")),
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        # the file is written in place: wait until it holds the address
        _wait_for(lambda: "address" in _read(sched_file), 600, "the scheduler did not start")
        address = json.loads(sched_file.read_text())["address"]
        for i in range(n_workers):
            procs.append(
                subprocess.Popen(
                    [
                        *(*base, "worker", address, "--host", "127.0.0.1", "--nthreads", "1"),
                        *("--memory-limit", "0", "--no-dashboard", "--name", f"w{i}"),
                        *("--local-directory", str(tmp / f"w{i}")),
                        *("--preload", "pipeline.distributed.worker_setup"),
                    ],
                    cwd=tmp,
                    env=env,
                    stdout=logs.enter_context(open(tmp / f"w{i}.log", "wb")),
                    stderr=subprocess.STDOUT,
                )
            )
        c = Cluster(address, procs[1:])
        c.ready(n_workers, 1800)  # the first start may compile the kernels
        yield c
    finally:
        stop_processes(procs)
        logs.close()


@contextlib.contextmanager
def prefect_server() -> Iterator[str]:
    """One Prefect API server for every run (``PREFECT_API_URL``): a command then starts no
    temporary server of its own."""
    from flows.cli.prefect_api import SERVER_ENV, free_port, server_argv, terminate, wait_healthy

    port = free_port()
    proc = subprocess.Popen(
        server_argv(port),
        env={**os.environ, **SERVER_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(url, 600, proc)
        yield url
    finally:
        terminate(proc, 30)


# -- the commands -----------------------------------------------------------------------------


def _parquet(path: Path, columns: list[str] | None = None) -> list[Any]:
    df = pd.read_parquet(path)
    return df[columns].to_numpy().tolist() if columns else df.to_numpy().tolist()


def _zarr(path: Path) -> list[Any]:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[:]).tolist()


def _model(path: Path) -> str:
    """The model's arrays, by the hash its record keeps of them."""
    return str(json.loads((path / "model.json").read_text())["arrays"]["sha256"])


@dataclass(frozen=True)
class Command:
    """A ``dpmm`` command: its arguments (after ``dpmm``) for a workspace and an output, what
    of the output must be the same from run to run (``digest``) and the outputs it makes
    visible (``outputs``, for the check that nothing half-written shows)."""

    name: str
    argv: Callable[[Workspace, Path], list[str]]
    digest: Callable[[Path], Any]
    outputs: Callable[[Path], list[Path]] = lambda out: [out]
    # what a killed run may show: the undisturbed output or, for a command that publishes step
    # by step (serve: one version per day), the steps done so far, each whole
    shows: Callable[[Path, Any], bool] | None = None
    # False: the command starts a LocalCluster of its own (serve has no --scheduler)
    joins: bool = True


def _cv_table(path: Path) -> list[Any]:
    """The grid's held-out densities (each cell's fits), without their timings."""
    df = pd.read_parquet(path)
    return df[[c for c in df.columns if "second" not in c]].to_numpy().tolist()


def _serve_outputs(out: Path) -> list[Path]:
    return [out / "models", out / "scores"]


def _serve_digest(out: Path) -> Any:
    models = out / "models"
    latest = (models / "LATEST").read_text().strip()
    versions = sorted(p.name for p in models.glob("v*"))
    days = sorted(p.name for p in (out / "scores").glob("date=*"))
    return {
        "latest": latest,
        "versions": versions,
        "models": [_model(models / v / "model") for v in versions],
        "scores": [_zarr(out / "scores" / d / "labels.zarr" / "label") for d in days],
    }


def _serve_shows(out: Path, want: Any) -> bool:
    """The versions and days published so far, each the undisturbed run's; LATEST one of
    them (it moves last, after the version it names)."""
    models, scores = out / "models", out / "scores"
    versions = sorted(p.name for p in models.glob("v*")) if models.is_dir() else []
    latest = (models / "LATEST").read_text().strip() if (models / "LATEST").exists() else None
    days = sorted(p.name for p in scores.glob("date=*")) if scores.is_dir() else []
    return (
        versions == want["versions"][: len(versions)]
        and [_model(models / v / "model") for v in versions] == want["models"][: len(versions)]
        and (latest is None or latest in versions)
        and [_zarr(scores / d / "labels.zarr" / "label") for d in days]
        == want["scores"][: len(days)]
    )


COMMANDS: dict[str, Command] = {
    "cv": Command(
        "cv",
        lambda ws, out: [
            *("cv", str(ws.blobs), "--out", str(out), "--folds", "3"),
            *("--alpha", "0.1,3", "--prior-scale", "0.3,0.05", "--family", "gaussian"),
            *("--label-column", "truth", "--data-dir", str(ws.root / "datasets")),
        ],
        lambda out: {"table": _cv_table(out / "cv.parquet"), "model": _model(out / "model")},
    ),
    "longitudinal": Command(
        "longitudinal",
        lambda ws, out: [
            *("longitudinal", str(ws.longitudinal), "--out", str(out)),
            *("--subject", "subject", "--response", "qol", "--covariates", "depression,adl"),
            *("--time", "wave", "--chunk-rows", "200", "--no-report"),
        ],
        lambda out: {
            "labels": _parquet(out / "subjects.parquet", ["subject", "cluster"]),
            "model": _model(out / "model"),
        },
    ),
    "hmm": Command(
        "hmm",
        lambda ws, out: [
            *("hmm", str(ws.sequences), "--out", str(out), "--sequence-column", "seq"),
            *("--time-column", "t", "--chunk-rows", "400", "--no-report"),
        ],
        lambda out: {"states": _parquet(out / "rows.parquet"), "model": _model(out / "model")},
    ),
    "score": Command(
        "score",
        lambda ws, out: [
            *("score", str(ws.model), str(ws.day2), "--out", str(out), "--chunk-rows", "200"),
        ],
        lambda out: {
            "label": _zarr(out / "labels.zarr" / "label"),
            "log_density": _zarr(out / "labels.zarr" / "log_density"),
        },
    ),
    "serve": Command(
        "serve",
        lambda ws, out: [
            *("serve", str(ws.partitions), "--models", str(out / "models")),
            *("--scores", str(out / "scores"), "--once", "--chunk-rows", "300"),
            *("--workers", "2", "--quiet"),
        ],
        _serve_digest,
        _serve_outputs,
        _serve_shows,
        joins=False,
    ),
    "tree": Command(
        "tree",
        lambda ws, out: [
            *("run", str(ws.blobs), "--out", str(out), "--chunk-rows", "200", "--summaries"),
            *("12", "--mcmc", "20", "--no-report", "--data-dir", str(ws.root / "datasets")),
        ],
        lambda out: {
            "labels": _zarr(out / "labels.zarr" / "label"),
            "model": _model(out / "model"),
            "tree": _parquet(out / "tree.parquet"),
        },
    ),
}


@dataclass
class Workspace:
    """The inputs of the commands, small: written once, read by every run."""

    root: Path

    @property
    def blobs(self) -> Path:
        return self.root / "blobs.csv"

    @property
    def longitudinal(self) -> Path:
        return self.root / "longitudinal.csv"

    @property
    def sequences(self) -> Path:
        return self.root / "sequences.csv"

    @property
    def day2(self) -> Path:
        return self.root / "day2.csv"

    @property
    def partitions(self) -> Path:
        return self.root / "partitions"

    @property
    def model(self) -> Path:
        return self.root / "fitted" / "model"

    def write(self) -> None:
        from pipeline.data.synthetic import sample_longitudinal

        rng = np.random.default_rng(0)
        n = 600
        means = np.array([[0.0, 0.0, 0.0], [8.0, 0.0, 0.0], [0.0, 8.0, 0.0]])
        y = np.arange(n) % 3
        df = pd.DataFrame(means[y] + rng.normal(size=(n, 3)), columns=["a", "b", "c"])
        df = df.assign(truth=y)
        df.to_csv(self.blobs, index=False)
        # new records of the columns the model (a tree-stage run's on blobs.csv) was fitted on
        df.iloc[::2].to_csv(self.day2, index=False)
        sample_longitudinal(120, seed=3).to_csv(self.longitudinal, index=False)
        self._sequences(1200, seed=1).to_csv(self.sequences, index=False)
        for day, rows in (("2026-01-01", slice(0, 300)), ("2026-01-02", slice(300, 600))):
            d = self.partitions / f"date={day}"
            d.mkdir(parents=True)
            df.iloc[rows].to_parquet(d / "part-0.parquet", index=False)

    @staticmethod
    def _sequences(n: int, seed: int, length: int = 40) -> pd.DataFrame:
        """Sequences of a sticky 3-state HMM with 2-D Gaussian emissions."""
        rng = np.random.default_rng(seed)
        means = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
        z = np.empty(n, dtype=np.int64)
        k = 0
        for i in range(n):
            if i % length == 0 or rng.random() < 0.08:
                k = int(rng.integers(3))
            z[i] = k
        df = pd.DataFrame(means[z] + rng.normal(size=(n, 2)), columns=["a", "b"])
        return df.assign(seq=np.arange(n) // length, t=(np.arange(n) % length) * 1.5)


# -- running a command, and the faults --------------------------------------------------------


@dataclass
class Run:
    """A command's process, and every process it started (seen while it ran); the output it
    writes and the dataset stores it reads (``stores``: the ones its undisturbed run made)."""

    proc: subprocess.Popen[bytes]
    cluster: Cluster
    joins: bool = True
    seen: set[int] = field(default_factory=set)
    delivered: bool = False
    out: Path | None = None
    stores: list[Path] = field(default_factory=list)
    damaged: set[Path] = field(default_factory=set)

    def watch(self) -> None:
        self.seen.update(_children(self.proc.pid))


@dataclass(frozen=True)
class Fault:
    """A fault kind: ``inject(run)`` at the drawn moment (nothing if the command has ended by
    then), the ``env`` the command runs with (for faults of its storage), whether the command
    is run again afterwards (``rerun``: it was killed; the rerun must resume or start over,
    and give the undisturbed result), the place the run happens in (``around(out)``: a small
    disk under OUT), and what a user does after the clear error the fault may cause
    (``repair(run)``: free the disk, remove the damaged store), after which the command is run
    again and must give the undisturbed result."""

    name: str
    inject: Callable[[Run], None]
    rerun: bool = False
    env: Callable[[Workspace], dict[str, str]] = lambda ws: {}
    around: Callable[[Path], contextlib.AbstractContextManager[Any]] = lambda out: (
        contextlib.nullcontext()
    )
    repair: Callable[[Run], None] | None = None


def _kill_workers(run: Run, n: int | None) -> None:
    pids = run.cluster.workers() if run.joins else _workers_of(run.proc.pid)
    for pid in pids[:n]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_command(run: Run) -> None:
    run.watch()
    run.proc.send_signal(signal.SIGKILL)


# the small disk under OUT of ``full-disk``: room for every command's output, filled at the moment
DISK_BYTES = 32 << 20
FILLER = "filler"  # not hidden: the check for hidden partial outputs must not count it


def _disk(out: Path) -> contextlib.AbstractContextManager[Any]:
    from tests.faults import full_disk

    return full_disk(out.parent, DISK_BYTES)


def _fill_disk(run: Run) -> None:
    """Take every free byte of the disk under OUT (as another program would)."""
    assert run.out is not None
    block = bytes(1 << 20)
    with contextlib.suppress(OSError), open(run.out.parent / FILLER, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(block[:size])


def _free_disk(run: Run) -> None:
    assert run.out is not None
    (run.out.parent / FILLER).unlink(missing_ok=True)


def store_chunks(stores: list[Path]) -> list[Path]:
    """The chunk files (zarr v3 ``<array>/c/...``) of the dataset stores ``stores``."""
    found = []
    for store in stores:
        for f in sorted(store.rglob("*")) if store.is_dir() else []:
            parts = f.relative_to(store).parts
            if len(parts) >= 3 and parts[1] == "c" and f.is_file() and f.stat().st_size:
                found.append(f)
    return found


def _damage_chunk(run: Run) -> None:
    """Invert one byte in the middle of a chunk, drawn among the run's dataset stores' (bit rot,
    a disk's or a copy's)."""
    chunks = store_chunks(run.stores)
    if not chunks:
        return
    f = random.Random(run.proc.pid).choice(chunks)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    run.damaged.add(next(s for s in run.stores if s in f.parents))


def _remove_damaged(run: Run) -> None:
    """What the error says to do: remove the damaged store, to have it ingested again."""
    for store in run.damaged:
        shutil.rmtree(store, ignore_errors=True)


FAULTS: dict[str, Fault] = {
    "none": Fault("none", lambda run: None),
    "kill-worker": Fault("kill-worker", lambda run: _kill_workers(run, 1)),
    "kill-workers": Fault("kill-workers", lambda run: _kill_workers(run, None)),
    "kill-command": Fault("kill-command", _kill_command, rerun=True),
    "full-disk": Fault("full-disk", _fill_disk, around=_disk, repair=_free_disk),
    "damage-chunk": Fault("damage-chunk", _damage_chunk, repair=_remove_damaged),
}


def dataset_stores(ws: Workspace) -> list[Path]:
    """The dataset stores (directories with a ``format.json``) the runs ingested so far."""
    dirs = [ws.root / "datasets", Path(os.environ.get("DPMM_DATA_DIR", ws.root / "datasets"))]
    return sorted({f.parent for d in dirs if d.is_dir() for f in d.rglob("format.json")})


@dataclass
class Outcome:
    command: str
    fault: str
    moment: float
    kind: str  # "equal", "error" or "other"
    reason: str = ""
    delivered: bool = False
    seconds: float = 0.0
    #: an "other" run's whole stderr (each run's, when it was run again), to pin its cause
    stderr: str = ""


def start(
    cmd: Command,
    ws: Workspace,
    out: Path,
    cl: Cluster,
    env: dict[str, str] | None = None,
    stores: list[Path] | None = None,
) -> Run:
    joined = ["--scheduler", cl.address, "--quiet"] if cmd.joins else []
    argv = [str(BIN / "dpmm"), *cmd.argv(ws, out), *joined]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return Run(
        proc, cl, cmd.joins, out=out, stores=dataset_stores(ws) if stores is None else stores
    )


def finish(run: Run, timeout: float) -> tuple[int | None, str]:
    """Wait for the command (None: it hung past ``timeout`` and was killed); its stderr."""
    import threading

    stderr = run.proc.stderr
    assert stderr is not None
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(stderr.read()))
    reader.start()
    t0 = time.monotonic()
    rc: int | None = None
    while (rc := run.proc.poll()) is None:
        run.watch()
        if time.monotonic() - t0 > timeout:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
            break
        time.sleep(0.2)
    reader.join()
    return rc, b"".join(err).decode(errors="replace")


def leftovers(cmd: Command, out: Path, run: Run) -> list[str]:
    """Hidden partial outputs next to or inside the command's outputs, and processes of the
    command's still alive (a second after it ended)."""
    found = []
    for o in cmd.outputs(out):
        for d in (o.parent, o):
            if d.is_dir():
                # an empty hidden directory is a registry's place for writers (``.staging``)
                hidden = [p for p in d.iterdir() if p.name.startswith(".")]
                found += [str(p) for p in hidden if not p.is_dir() or any(p.iterdir())]
    time.sleep(1.0)
    found += [f"pid {p}" for p in sorted(run.seen) if _alive(p)]
    return sorted(set(found))


def _visible_partial(cmd: Command, out: Path, want: Any) -> str:
    """What a killed command left visible: nothing, or a complete output (the kill came after
    it was published); else the reason."""
    shown = [o for o in cmd.outputs(out) if o.exists()]
    if not shown:
        return ""
    try:
        ok = cmd.shows(out, want) if cmd.shows else cmd.digest(out) == want
    except Exception as err:
        return f"a half-written output is visible: {shown} ({type(err).__name__}: {err})"
    return "" if ok else f"a visible output differs from the undisturbed run's: {shown}"


def classify(
    cmd: Command, out: Path, run: Run, rc: int | None, err: str, want: Any
) -> tuple[str, str]:
    """(kind, reason) of a command's end: ``equal``, ``error`` or ``other`` (module doc)."""
    if rc is None:
        return "other", "a hang past the timeout"
    left = leftovers(cmd, out, run)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback" in err:
        return "other", "a traceback: " + " | ".join(lines[-3:])
    if rc == 0:
        if left:
            return "other", f"left behind: {left}"
        try:
            got = cmd.digest(out)
        except Exception as e:
            return "other", f"an unreadable result: {type(e).__name__}: {e}"
        if got != want:
            return "other", "a result that differs from the undisturbed run's"
        return "equal", ""
    # 2: bad input; 3: the storage failed (a full disk, a damaged chunk, retries spent)
    if rc in (2, 3) and len(lines) == 1:
        # a hidden partial may stay for the same command to resume; a process may not
        shown = _visible_partial(cmd, out, want)
        stray = [p for p in left if p.startswith("pid")]
        if shown or stray:
            return "other", shown or f"left behind: {stray}"
        return "error", lines[0]
    return "other", f"exit status {rc}: " + " | ".join(lines[-3:])


class Reference(NamedTuple):
    """A command's undisturbed run: its digest, its duration and the dataset stores it made."""

    digest: Any
    seconds: float
    stores: list[Path]


def reference(cmd: Command, ws: Workspace, cl: Cluster, out: Path) -> Reference:
    """The undisturbed run's digest, the dataset stores its first run ingested (all the stores
    there are, when it ingested none of its own) and its duration: that of a second run, as the
    faulted runs find the kernels compiled and the cluster warm (the first run's duration,
    compiling, would draw late moments past the end of a faulted run). Both runs must give one
    digest."""
    before = set(dataset_stores(ws))
    digests, seconds = [], 0.0
    for o in (out, out.with_name(f"{out.name}-again")):
        t0 = time.monotonic()
        run = start(cmd, ws, o, cl)
        rc, err = finish(run, 1800)
        if rc != 0:
            raise RuntimeError(f"the undisturbed {cmd.name} failed ({rc}): {err}")
        digests.append(cmd.digest(o))
        seconds = time.monotonic() - t0
    if digests[0] != digests[1]:
        raise RuntimeError(f"two undisturbed runs of {cmd.name} differ")
    stores = dataset_stores(ws)
    return Reference(digests[0], seconds, [s for s in stores if s not in before] or stores)


def faulted(
    cmd: Command,
    fault: Fault,
    ws: Workspace,
    cl: Cluster,
    out: Path,
    ref: Reference,
    moment: float,
) -> Outcome:
    """One run of ``cmd`` with ``fault`` injected ``moment`` x the undisturbed run's duration
    after its start (rerun afterwards if the fault says so), classified."""
    t0 = time.monotonic()
    errs: list[str] = []  # each run's stderr

    def outcome(kind: str, reason: str, delivered: bool) -> Outcome:
        cl.ready(len(cl.nannies))
        seconds = time.monotonic() - t0
        kept = "\n--- run again ---\n".join(errs) if kind == "other" else ""
        return Outcome(cmd.name, fault.name, moment, kind, reason, delivered, seconds, kept)

    with fault.around(out):
        want, env, timeout = ref.digest, fault.env(ws), 5 * ref.seconds + 120
        run = start(cmd, ws, out, cl, env, ref.stores)
        deadline = time.monotonic() + moment * ref.seconds
        while run.proc.poll() is None and time.monotonic() < deadline:
            run.watch()
            time.sleep(0.05)
        delivered = run.proc.poll() is None
        if delivered:
            fault.inject(run)
        rc, err = finish(run, timeout)
        errs.append(err)
        if fault.repair is not None and delivered:
            kind, reason = classify(cmd, out, run, rc, err, want)
            fault.repair(run)
            if kind != "error":
                return outcome(kind, reason, delivered)
            # the clear error, then what a user does: the rerun must resume or start over
            cl.ready(len(cl.nannies))
            again = start(cmd, ws, out, cl, env, ref.stores)
            rc, err = finish(again, timeout)
            errs.append(err)
            kind2, reason2 = classify(cmd, out, again, rc, err, want)
            if kind2 != "equal":
                return outcome("other", f"{reason}; then, repaired: {kind2}: {reason2}", delivered)
            return outcome(kind, f"{reason}; then, repaired: equal", delivered)
        if fault.rerun and delivered:
            shown = _visible_partial(cmd, out, want)
            stray = [p for p in run.seen if _alive(p)]
            # the command's own processes go with it (the Prefect server it may have started
            # follows within a moment)
            time.sleep(1.0)
            stray = [p for p in stray if _alive(p)]
            if shown or stray:
                for p in stray:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
                reason = shown or f"processes left behind by the killed command: {stray}"
                return outcome("other", reason, delivered)
            cl.ready(len(cl.nannies))
            if cmd.shows is None and all(o.exists() for o in cmd.outputs(out)):
                # the kill came after the output was published (and found whole above): the work is
                # done, and a rerun would rightly refuse to replace OUT without --overwrite
                rc, err = 0, ""
            else:
                run = start(cmd, ws, out, cl, env, ref.stores)
                rc, err = finish(run, timeout)
                errs.append(err)
        kind, reason = classify(cmd, out, run, rc, err, want)
        return outcome(kind, reason, delivered)


def clear(cmd: Command, out: Path) -> None:
    """Remove a run's outputs, visible and hidden, for the next run."""
    for o in cmd.outputs(out):
        for d in (o.parent,):
            if d.is_dir():
                for p in d.iterdir():
                    if p.name == o.name or p.name.startswith(f".{o.name}"):
                        shutil.rmtree(p, ignore_errors=True)


# -- the campaign ------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Runs per command and fault: how many, and how many of each kind."""
    rows = []
    keys = sorted({(o.command, o.fault) for o in outcomes})
    for c, f in keys:
        mine = [o for o in outcomes if (o.command, o.fault) == (c, f)]
        kinds = Counter(o.kind for o in mine)
        rows.append(
            {
                "command": c,
                "fault": f,
                "runs": len(mine),
                "delivered": sum(o.delivered for o in mine),
                "equal": kinds["equal"],
                "error": kinds["error"],
                "other": kinds["other"],
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], outcomes: list[Outcome]) -> str:
    head = ["command", "fault", "runs", "delivered", "equal", "error", "other"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    total = {h: sum(r[h] for r in rows) for h in head[2:]}
    lines.append("| all | | " + " | ".join(str(total[h]) for h in head[2:]) + " |")
    bad = [o for o in outcomes if o.kind != "equal"]
    if bad:
        lines += ["", "Runs that did not finish equal:", ""]
        lines += [f"- {o.command} / {o.fault} at {o.moment:.2f}: {o.kind}: {o.reason}" for o in bad]
    return "\n".join(lines) + "\n"


def campaign(
    runs: int,
    seed: int,
    report: Path,
    commands: list[str],
    faults: list[str],
    work: Path | None = None,
) -> list[Outcome]:
    """``runs`` runs in all, each of a command and a fault drawn at random (``seed``), at a
    moment drawn uniformly in [0.05, 1) of the command's undisturbed duration; the table is
    written to ``report``.json and .md after every run, and printed at the end."""
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="dpmm-faults-", dir=work))
    outcomes: list[Outcome] = []
    try:
        ws = Workspace(root / "inputs")
        ws.root.mkdir()
        ws.write()
        with prefect_server() as url, cluster(root) as cl:
            os.environ["PREFECT_API_URL"] = url
            os.environ["DPMM_DATA_DIR"] = str(root / "datasets")
            refs: dict[str, Reference] = {}
            for i in range(runs):
                name = rng.choice(commands)
                if name == "score" and not ws.model.exists():
                    reference(COMMANDS["tree"], ws, cl, ws.model.parent)
                if name not in refs:  # when first drawn: the first runs start sooner
                    refs[name] = reference(COMMANDS[name], ws, cl, root / f"ref-{name}")
                    print(f"{name}: undisturbed in {refs[name].seconds:.1f} s", file=sys.stderr)
                fault = FAULTS[rng.choice(faults)]
                moment = rng.uniform(0.05, 1.0)
                cmd = COMMANDS[name]
                out = root / "runs" / name
                out.mkdir(parents=True, exist_ok=True)
                out = out / "out"
                o = faulted(cmd, fault, ws, cl, out, refs[name], moment)
                clear(cmd, out)
                outcomes.append(o)
                print(
                    f"{i + 1}/{runs} {name} {fault.name} at {moment:.2f}: {o.kind} "
                    f"{o.reason} ({o.seconds:.0f} s)",
                    file=sys.stderr,
                )
                save(outcomes, report)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown(table(outcomes), outcomes))
    return outcomes


def save(outcomes: list[Outcome], report: Path) -> None:
    rows = table(outcomes)
    report.parent.mkdir(parents=True, exist_ok=True)
    doc = {"table": rows, "runs": [vars(o) for o in outcomes]}
    report.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    report.with_suffix(".md").write_text(markdown(rows, outcomes))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=200, help="runs in all (default 200)")
    p.add_argument("--seed", type=int, default=0, help="draws of command, fault and moment")
    p.add_argument("--out", type=Path, default=Path("out/faults"), help="table: OUT.json, .md")
    p.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated")
    p.add_argument("--faults", default=",".join(f for f in FAULTS if f != "none"))
    p.add_argument("--work", type=Path, default=None, help="where the runs write (default TMP)")
    args = p.parse_args(argv)
    outcomes = campaign(
        args.runs, args.seed, args.out, args.commands.split(","), args.faults.split(","), args.work
    )
    return 0 if all(o.kind != "other" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
