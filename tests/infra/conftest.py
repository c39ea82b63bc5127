"""A single-node SLURM for the batch-queue tests (``slurm``): Debian's ``slurm-wlm`` and
``munge`` (``.ci/run`` installs them), configured in a directory of its own under the system's
temporary directory, with a munge key and socket of its own, so that nothing of a SLURM the
machine may have is read or changed.

The processes of one ``pytest -n 2`` run share it: the first to need it starts it, the others
reuse it, and the last one to finish stops it (the users' process ids are listed in its
directory, under a lock). A SLURM of an earlier run that no live process uses is stopped and
started afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flows.conftest import prefect_harness  # noqa: F401 (the SLURM runs' Prefect)

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
NODE = "dpmm-node"
#: CPUs the node offers: more than this machine's cores, so that two one-core jobs run at once
CPUS = 4
ROOT = Path(tempfile.gettempdir()) / f"dpmm-tests-slurm-{os.getuid()}"

SLURM_CONF = """\
ClusterName=dpmmtests
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=16000 State=UNKNOWN
PartitionName=batch Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
# slurmd loads a cgroup plugin even where no job uses one (the jobs' processes are tracked by
# their parents); without systemd, cgroup v2's needs IgnoreSystemd
CGROUP_CONF = "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"


def _unavailable(reason: str) -> None:
    """Skip with ``reason``; under CI (``CI=true``), where ``.ci/run`` installs SLURM, fail."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _node_state(env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["sinfo", "-h", "-n", NODE, "-o", "%T"], env=env, capture_output=True, text=True, timeout=30
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _stop(root: Path) -> None:
    """Stop the daemons this directory's pid files name, and wait for them to exit."""
    pids = []
    for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
        f = root / name
        if _alive(f):
            pid = int(f.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + 30
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _start(root: Path, env: dict[str, str]) -> None:
    """Write the configuration and munge key to ``root`` and start munged, slurmctld and
    slurmd; return once the node is idle."""
    shutil.rmtree(root, ignore_errors=True)
    for d in (root, root / "state", root / "spool"):
        d.mkdir(mode=0o755 if d == root else 0o700, parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    (root / "slurm.conf").write_text(
        SLURM_CONF.format(
            root=root,
            host=host,
            node=NODE,
            cpus=CPUS,
            ctld_port=_free_port(),
            d_port=_free_port(),
        )
    )
    (root / "cgroup.conf").write_text(CGROUP_CONF)
    munged = [
        *("munged", "--force", f"--key-file={key}", f"--socket={root}/munge.socket"),
        *(f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log"),
        f"--seed-file={root}/munged.seed",
    ]
    conf = env["SLURM_CONF"]
    for argv in (munged, ["slurmctld", "-f", conf], ["slurmd", "-f", conf, "-N", NODE]):
        # each daemon forks to the background once it has started
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            _stop(root)
            log = root / f"{argv[0]}.log"
            tail = log.read_text(errors="replace").splitlines()[-2:] if log.exists() else []
            _unavailable(f"{argv[0]} did not start: {' '.join([proc.stderr.strip(), *tail])}")
    deadline = time.monotonic() + 120
    while (state := _node_state(env)) != "idle":
        if time.monotonic() > deadline:
            _stop(root)
            _unavailable(f"the SLURM node is {state or 'unknown'}, not idle after 120 s ({root})")
        time.sleep(0.3)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    lock = root.with_name(root.name + ".lock")
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _users(root: Path) -> set[int]:
    """The live processes that use the SLURM of ``root``."""
    f = root / "users"
    pids = {int(p) for p in f.read_text().split()} if f.exists() else set()
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, 0)
            alive.add(pid)
    return alive


@pytest.fixture(scope="session")
def slurm() -> Iterator[Path]:
    """A running single-node SLURM (one node of ``CPUS`` CPUs, one partition) for this test
    session: its directory; ``SLURM_CONF`` in the environment points its commands at it (and
    the test's subprocesses and jobs inherit it)."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        _unavailable(f"no {', '.join(missing)} on PATH: apt-get install slurm-wlm munge")
    if os.getuid() != 0:
        _unavailable("slurmd runs jobs as root only here: run as root")
    env = {**os.environ, "SLURM_CONF": str(ROOT / "slurm.conf")}
    with _locked(ROOT):
        users = _users(ROOT)
        # in use by another test process: its jobs may hold the node
        if not (users and _node_state(env) in ("idle", "mixed", "allocated", "completing")):
            _stop(ROOT)
            t0 = time.monotonic()
            _start(ROOT, env)
            print(f"\nSLURM started in {time.monotonic() - t0:.1f} s ({ROOT})")
        (ROOT / "users").write_text(" ".join(str(p) for p in (users | {os.getpid()})))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        yield ROOT
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        with _locked(ROOT):
            users = _users(ROOT) - {os.getpid()}
            if users:
                (ROOT / "users").write_text(" ".join(str(p) for p in users))
            else:
                _stop(ROOT)
                shutil.rmtree(ROOT, ignore_errors=True)
