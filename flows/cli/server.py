"""``dpmm server``: a long-lived Prefect API server on 127.0.0.1 for repeated and scheduled runs.

It runs ``prefect server start`` in the foreground until interrupted and prints the line to give
the other shells (``export PREFECT_API_URL=...``); commands run with it record their flow runs
there instead of starting a temporary server. ``PREFECT_HOME`` chooses where its database is.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from flows.cli.prefect_api import free_port, terminate, wait_healthy
from flows.cli.types import positive_int

__all__ = ["free_port", "server_command", "wait_healthy"]

PROG = "dpmm"
DEFAULT_PORT = 4200


def add_server_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``server`` to an ``argparse`` subparsers object; it sets ``func=cmd_server``."""
    p = subparsers.add_parser(
        "server",
        help="run a long-lived Prefect server on 127.0.0.1 for repeated and scheduled runs",
        description="Run 'prefect server start' on 127.0.0.1 in the foreground; commands run "
        "with PREFECT_API_URL=http://127.0.0.1:PORT/api use it instead of starting a temporary "
        "server each.",
    )
    p.add_argument(
        "--port",
        type=positive_int,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port (default {DEFAULT_PORT})",
    )
    p.set_defaults(func=cmd_server)
    return p


#: seconds the server gets to stop once ``dpmm server`` is interrupted, before it is killed
STOP_GRACE = 30.0


def server_command(port: int) -> list[str]:
    """The ``prefect server start`` command line of ``dpmm server --port port``."""
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    exe = [prefect] if os.path.exists(prefect) else [sys.executable, "-m", "prefect"]
    return [*exe, "server", "start", "--host", "127.0.0.1", "--port", str(port)]


def cmd_server(args: argparse.Namespace) -> int:
    """Run the server until it stops or is interrupted; its exit status."""
    url = f"http://127.0.0.1:{args.port}/api"
    print(f"{PROG} server: in other shells: export PREFECT_API_URL={url}", file=sys.stderr)
    sys.stderr.flush()
    # Ctrl-C, and a service manager's SIGTERM, stop Prefect's server with this command. SIGINT
    # is handled even when the shell that started the command ignores it (a background job),
    # and set before the server starts so that the server does not inherit the ignoring
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(server_command(args.port))
        try:
            return proc.wait()
        except KeyboardInterrupt:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)  # a second one must not leave the server behind
            # a server slow to finish its services is killed rather than left running without us
            terminate(proc, STOP_GRACE)
            return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
