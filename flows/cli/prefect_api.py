"""Which Prefect API a ``dpmm`` command's flow talks to, and starting it early.

Without ``PREFECT_API_URL`` a command starts Prefect's temporary API server itself
(``prestart``, as Prefect would: ``server_argv``, ``SERVER_ENV``) as the first thing it does, and
points its flow at it (``flow_api``): about 4 s saved per command (``bench_coldstart.py``). If it
does not come up, the flow falls back to Prefect's own.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# the environment Prefect gives its temporary server: ephemeral mode, no services, no UI
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
# the commands whose work is a Prefect flow on the temporary server
FLOW_COMMANDS = ("run", "demo", "score", "cv", "longitudinal", "hmm")

# run before the server's command line, which it then becomes (exec): on Linux the server gets
# SIGTERM when the command's process dies, so that a command killed outright (SIGKILL, or a
# SIGTERM with no handler: both skip ``atexit``) leaves no server behind. (Not a ``preexec_fn``,
# which is unsafe in a process with threads.)
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the command died before this line
        sys.exit(0)
os.execv(sys.argv[1], sys.argv[1:])
"""

_proc: subprocess.Popen[bytes] | None = None
_url: str | None = None


def set_defaults() -> None:
    """The environment defaults of ``dpmm`` for Prefect, before any server or flow starts."""
    # Prefect's temporary server sends usage telemetry unless told not to; on a machine without
    # network its failures land on stderr. A user who wants it sets the variable.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives its temporary server 30 s to answer, which a busy machine can exceed
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    # a Prefect server this process starts listens on this machine only: the temporary server
    # does anyway (uvicorn --host 127.0.0.1), `prefect server start` reads this setting
    os.environ.setdefault("PREFECT_SERVER_API_HOST", "127.0.0.1")


def api_url() -> str | None:
    """The Prefect API this process's flows use by configuration (None: a temporary server)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def server_argv(port: int) -> list[str]:
    """The command line of Prefect's temporary server on 127.0.0.1:``port``, without Prefect."""
    spec = importlib.util.find_spec("prefect")
    assert spec is not None and spec.submodule_search_locations is not None
    app_dir = Path(next(iter(spec.submodule_search_locations))).parent
    return [
        *(sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "--factory"),
        *("prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port)),
        *("--log-level", "error", "--lifespan", "on"),
    ]


def wants_server(argv: Sequence[str]) -> bool:
    """The ``dpmm`` command line ``argv`` (without the program) runs a flow on the temporary
    server, as far as can be told before it is parsed: the early start of ``flows.cli.main``."""
    if not argv or argv[0] not in FLOW_COMMANDS:
        return False
    return not any(a in ("-h", "--help", "--in-memory") for a in argv[1:])


def prestart() -> None:
    """Start this command's temporary Prefect server in the background, unless not needed."""
    global _proc, _url
    # an API is configured: in Prefect's settings once imported, else in the environment
    if _proc is not None or (
        api_url() is not None if "prefect" in sys.modules else os.environ.get("PREFECT_API_URL")
    ):
        return
    port = free_port()
    _proc = subprocess.Popen(
        [sys.executable, "-c", _DIE_WITH_PARENT, *server_argv(port)],
        env={**os.environ, **SERVER_ENV},
        stdin=subprocess.DEVNULL,
        # the flow falls back to Prefect's own start, which reports, if this one fails
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _url = f"http://127.0.0.1:{port}/api"
    atexit.register(stop)


def stop() -> None:
    """Stop the server ``prestart`` started (at the latest when the command exits)."""
    global _proc, _url
    proc, _proc, _url = _proc, None, None
    if proc is not None:
        terminate(proc, 15)


def terminate(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM a server's process and wait for it; SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    api: str, timeout: float, proc: subprocess.Popen[Any] | None = None, poll: float = 0.25
) -> None:
    """Wait until the Prefect API at ``api`` answers its health check (every ``poll`` s); a
    ``RuntimeError`` when ``proc`` exits or after ``timeout`` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server at {api} did not answer in {timeout:g} s")
        time.sleep(poll)


def ready() -> str | None:
    """Wait for the server ``prestart`` started: its API URL, or None when there is none."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    url = _url
    if url is None:
        return None
    if api_url() is not None:  # configured where only Prefect looks (a profile)
        stop()
        return None
    try:
        timeout = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        wait_healthy(url, timeout, _proc, poll=0.05)
    except RuntimeError:
        stop()
        return None
    return url


@contextlib.contextmanager
def flow_api() -> Iterator[str | None]:
    """Run the block against the server ``prestart`` started, yielding its URL (or None)."""
    url = ready()
    if url is None:
        yield None
        return
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    # heartbeats let a long-lived server notice a crashed run; this one ends with the command
    updates = {PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with temporary_settings(updates=updates):
        yield url
