"""The ``dpmm`` command line (console script ``dpmm = flows.cli:main``; ``python -m flows.cli``).

``flows.cli.app`` holds the parser and the subcommands, one module each; ``options`` the option
blocks they share, ``logs`` where log lines go, ``types`` the argparse value types. The checks
of the data are ``pipeline``'s; every refusal is an ``InputError``, one line, exit status 2.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpmm`` with ``argv`` (default: this program's arguments); returns the exit status.
    As the program, a command that runs a flow starts Prefect's temporary server first, so that
    it boots while the command imports the pipeline."""
    if argv is None:
        # registered first, so it runs after every other exit handler
        status: list[int | None] = [None]
        atexit.register(_exit_now, status)
        from flows.cli import prefect_api

        prefect_api.set_defaults()
        if prefect_api.wants_server(sys.argv[1:]):
            prefect_api.prestart()
    from flows.cli.app import main as run

    if argv is not None:
        return run(argv)
    try:
        status[0] = code = run(argv)
    except SystemExit as err:
        # argparse's usage errors; a message as the code is printed by Python, status 1
        status[0] = 0 if err.code is None else err.code if isinstance(err.code, int) else 1
        raise
    return code


def _exit_now(status: list[int | None]) -> None:
    """End the program once its exit handlers have run, sparing Python's finalization (1.2 s)."""
    if status[0] is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe or stream has nothing left to write
    os._exit(status[0])


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from flows.cli.app import build_parser

        return build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
