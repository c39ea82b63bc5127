"""The ``dpmm`` command line (console script ``dpmm = flows.cli:main``; ``python -m flows.cli``).

* ``flows.cli.app`` - the parser, ``main``, ``dpmm cluster`` and ``dpmm demo``;
* ``flows.cli.run`` - ``dpmm run``: the Prefect flow ``flows.cluster`` from the command line;
* ``flows.cli.logs`` - where Prefect's and Dask's log lines go while the CLI runs a flow;
* ``flows.cli.types`` - argparse value types checked by ``pipeline.config``.

The command line parses, starts and reports; the checks of the data are ``pipeline``'s and every
refusal is a ``pipeline.errors.InputError``, printed as one line with exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpmm`` with ``argv`` (default: this program's arguments); returns the exit status.

    As the program, a command that runs a flow starts Prefect's temporary server first
    (``flows.cli.prefect_api``), so that it boots while the command imports the pipeline, Dask
    and Prefect (about 2 s) instead of after."""
    if argv is None:
        from flows.cli import prefect_api

        prefect_api.set_defaults()
        if prefect_api.wants_server(sys.argv[1:]):
            prefect_api.prestart()
    from flows.cli.app import main as run

    return run(argv)


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from flows.cli.app import build_parser

        return build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
