"""``dpmm server`` (a long-lived Prefect server) and the early start of the temporary one.

Both run real Prefect servers in subprocesses, each with its own ``PREFECT_HOME``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from flows.cli.server import STOP_GRACE, free_port, server_command, wait_healthy
from tests import prefect_db

pytestmark = pytest.mark.slow


def _dpmm() -> list[str]:
    exe = Path(sys.executable).with_name("dpmm")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "flows.cli"]


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """Send ``sig`` and wait for the process; killed if it has not stopped in ``timeout`` s."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(PREFECT_HOME=prefect_db.new_home(tmp_path / "prefect"), **extra)
    return env


def _run_script(script: str, tmp_path: Path) -> None:
    """Run ``script`` in a new Python process (its own ``PREFECT_HOME``); it prints "ok"."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_server_command_binds_localhost():
    cmd = server_command(4321)
    assert cmd[-5:] == ["start", "--host", "127.0.0.1", "--port", "4321"]


def test_runs_against_a_long_lived_server(tmp_path: Path):
    """``dpmm server`` answers on 127.0.0.1; ``dpmm run`` with ``PREFECT_API_URL`` uses it (its
    flow run is recorded there, completed) and starts no temporary server. SIGINT stops the
    command and its server, also when it was started with SIGINT ignored."""
    port = free_port()
    server = subprocess.Popen(
        [*_dpmm(), "server", "--port", str(port)],
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # as a shell's background job is started: SIGINT ignored, which the command undoes
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(api, 600, server)  # a loaded machine starts it slowly
        rng = np.random.default_rng(0)
        X = np.vstack([rng.normal(-5, 1, (300, 2)), rng.normal(5, 1, (300, 2))])
        pd.DataFrame(X, columns=["a", "b"]).to_csv(tmp_path / "in.csv", index=False)
        args = ["run", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--workers", "1"]
        proc = subprocess.run(
            [*_dpmm(), *args, "--quiet", "--no-report"],
            env=_env(tmp_path, PREFECT_API_URL=api),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr
        assert "temporary server" not in proc.stderr
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
        assert [(r["name"] != "", r["state_type"]) for r in runs] == [(True, "COMPLETED")]
        flows = httpx.post(f"{api}/flows/filter", json={}, timeout=30).json()
        assert [f["name"] for f in flows] == ["cluster"]
        # the run sent the server its heartbeat (Prefect's own: what tells it a crashed
        # run from a long one)
        beats = _events(api, "prefect.flow-run.heartbeat", f"prefect.flow-run.{runs[0]['id']}")
        assert beats and beats[0]["related"][0]["prefect.resource.name"] == "cluster"
    finally:
        _stop(server, signal.SIGINT, 2 * STOP_GRACE)
    # the interrupted command took Prefect's server with it
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def _events(api: str, name: str, resource: str, wait: float = 60.0) -> list[dict]:
    """The events ``name`` about ``resource`` the server at ``api`` has recorded, waiting up to
    ``wait`` seconds for its event persister to write the first."""
    query = {
        "filter": {
            "event": {"name": [name]},
            "any_resource": {"id": [resource]},
            "occurred": {"since": "2000-01-01T00:00:00Z"},
        },
        "limit": 10,
    }
    end = time.monotonic() + wait
    while True:
        found = httpx.post(f"{api}/events/filter", json=query, timeout=30).json()["events"]
        if found or time.monotonic() > end:
            return found
        time.sleep(0.5)


_FAKE_SERVER = """
import argparse
import sys

from flows.cli import server

child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
server.server_command = lambda port: [sys.executable, "-c", child, sys.argv[1]]
server.cmd_server(argparse.Namespace(port=1))
"""


def test_sigterm_stops_the_server_too(tmp_path: Path):
    """A service manager's SIGTERM to ``dpmm server`` (here with a stand-in for Prefect's
    server, a process that sleeps) ends the server as well, instead of orphaning it."""
    pid_file = tmp_path / "child.pid"
    cmd = subprocess.Popen([sys.executable, "-c", _FAKE_SERVER, str(pid_file)], env=_env(tmp_path))
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and cmd.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    _stop(cmd, signal.SIGTERM, 2 * STOP_GRACE)
    assert cmd.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # gone, and reaped by the command


def test_prestart_serves_the_flow(tmp_path: Path):
    """``prestart`` boots the temporary server from the standard library alone; ``flow_api``
    waits for it and the flow runs against it: recorded there, completed, with no import of
    Prefect's server in this process and no server of Prefect's own; ``stop`` ends it."""
    script = textwrap.dedent(
        """
        import sys

        import httpx
        from flows.cli import prefect_api

        prefect_api.prestart()
        assert "prefect" not in sys.modules  # started before Prefect is imported
        proc = prefect_api._proc
        from prefect import flow

        @flow(name="one")
        def one() -> int:
            return 1

        with prefect_api.flow_api() as url:
            assert url is not None and url.startswith("http://127.0.0.1:")
            assert one() == 1
        runs = httpx.post(f"{url}/flow_runs/filter", json={}, timeout=30).json()
        assert [r["state_type"] for r in runs] == ["COMPLETED"], runs
        assert "prefect.server.api.server" not in sys.modules
        prefect_api.stop()
        assert proc.poll() is not None
        print("ok")
        """
    )
    _run_script(script, tmp_path)


def test_the_program_runs_its_flow_on_the_server_it_started_first(tmp_path: Path):
    """``dpmm run`` as a user runs it, without an API: the flow runs on the server the command
    started before its imports (Prefect would log "Starting temporary server" had it started its
    own), and no server process is left after the command."""
    import time

    import psutil

    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(-5, 1, (200, 2)), rng.normal(5, 1, (200, 2))])
    pd.DataFrame(X, columns=["a", "b"]).to_csv(tmp_path / "in.csv", index=False)
    argv = ["run", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--workers", "1"]
    log = tmp_path / "run.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [*_dpmm(), *argv, "--no-report", "--verbose"],
            env=_env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600"),
            stdout=subprocess.DEVNULL,
            stderr=fh,
        )
    # every process seen with the server's command line, and its parent: a process the server
    # forks (to start a helper) has the same command line until it execs, and is no second
    # server (seen once: two pids apart)
    seen: dict[int, int] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            kids = root.children(recursive=True)
            seen |= {p.pid: p.ppid() for p in kids if "uvicorn" in " ".join(p.cmdline())}
        except psutil.Error:
            pass
        time.sleep(0.05)
    err = log.read_text()
    assert proc.returncode == 0, err
    assert "Flow run" in err and "Starting temporary server" not in err, err
    servers = {pid for pid, parent in seen.items() if parent not in seen}
    assert len(servers) == 1, seen
    assert not [pid for pid in seen if psutil.pid_exists(pid)]
    assert (tmp_path / "out" / "run.json").exists()


def test_a_killed_command_leaves_no_server(tmp_path: Path):
    """SIGKILL skips every exit handler: the server the command started still stops, since it
    is told to when its parent dies (Linux)."""
    import time

    import psutil

    pd.DataFrame({"a": np.arange(50.0), "b": np.arange(50.0) % 7}).to_csv(tmp_path / "in.csv")
    argv = ["run", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--workers", "1"]
    proc = subprocess.Popen(
        [*_dpmm(), *argv, "--quiet"],
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = psutil.Process(proc.pid)
    server = None
    deadline = time.monotonic() + 300
    while server is None and time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            found = [p for p in root.children() if "uvicorn" in " ".join(p.cmdline())]
            server = found[0] if found else None
        time.sleep(0.02)
    assert server is not None, "no server seen"
    proc.kill()
    proc.wait()
    server.wait(timeout=60)  # psutil.TimeoutExpired if it outlives the command
    assert not server.is_running()


def test_wants_server():
    from flows.cli.prefect_api import wants_server

    assert wants_server(["run", "in.csv", "--out", "o"])
    assert wants_server(["demo"])
    assert not wants_server([])
    assert not wants_server(["run", "--help"])
    assert not wants_server(["demo", "--in-memory"])
    assert not wants_server(["server"])
    assert not wants_server(["serve", "in", "--models", "m"])


def test_a_failed_start_falls_back_to_prefects_own_server(tmp_path: Path):
    """A server of ours that exits at once (here: a uvicorn that cannot import its app) is
    noticed and stopped; the flow then runs on Prefect's own temporary server."""
    script = textwrap.dedent(
        """
        import sys

        from flows.cli import prefect_api

        prefect_api.server_argv = lambda port: [sys.executable, "-c", "raise SystemExit(1)"]
        prefect_api.prestart()
        from prefect import flow

        @flow
        def one() -> int:
            return 1

        with prefect_api.flow_api() as url:
            assert url is None
            assert prefect_api._proc is None
            assert one() == 1
        print("ok")
        """
    )
    _run_script(script, tmp_path)


def test_serve_without_an_api_starts_its_own_server_and_the_cron_fires(tmp_path: Path):
    """``dpmm serve`` without ``PREFECT_API_URL`` starts a Prefect server on 127.0.0.1 for the
    schedule (the temporary per-command one runs no scheduler): the cron (every minute) fires and
    the flow publishes v1; SIGTERM stops ``dpmm serve`` and the server with it."""
    import re
    import time

    part = tmp_path / "in" / "date=2026-01-01"
    part.mkdir(parents=True)
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(-5, 1, (200, 2)), rng.normal(5, 1, (200, 2))])
    pd.DataFrame(X, columns=["a", "b"]).to_parquet(part / "part-0.parquet")
    models = tmp_path / "models"
    argv = ["serve", str(tmp_path / "in"), "--models", str(models), "--cron", "* * * * *"]
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*_dpmm(), *argv, "--workers", "1"],
            env=_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 900  # a minute to the tick, then the run
            while not (models / "LATEST").exists():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(2)
            # the model is published before the flow run ends: SIGTERM once the run is recorded
            # as finished, so that what is tested is stopping an idle schedule
            m = re.search(
                r"started for this command at (http://127\.0\.0\.1:\d+/api)", log.read_text()
            )
            assert m is not None, log.read_text()[-3000:]
            states: list[str] = []
            while "COMPLETED" not in states:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, (states, log.read_text()[-3000:])
                runs = httpx.post(f"{m.group(1)}/flow_runs/filter", json={}, timeout=10).json()
                states = [r["state_type"] for r in runs]
                time.sleep(1)
        finally:
            _stop(proc, signal.SIGTERM, 120)
    said = log.read_text()
    assert (models / "LATEST").read_text().strip() == "v1"
    assert proc.returncode == 0, said[-3000:]
    m = re.search(
        r"a Prefect server started for this command at http://127\.0\.0\.1:(\d+)/api", said
    )
    assert m is not None, said[-3000:]
    with pytest.raises(httpx.HTTPError):  # gone with the command
        httpx.get(f"http://127.0.0.1:{m.group(1)}/api/health", timeout=2)
