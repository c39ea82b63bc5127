"""The ``dpmm`` command line (console script ``dpmm = flows.cli:main``; ``python -m flows.cli``).

* ``flows.cli.app`` - the parser, ``main``, ``dpmm cluster`` and ``dpmm demo``;
* ``flows.cli.run`` - ``dpmm run``: the Prefect flow ``flows.cluster`` from the command line;
* ``flows.cli.logs`` - where Prefect's and Dask's log lines go while the CLI runs a flow;
* ``flows.cli.types`` - argparse value types checked by ``pipeline.config``.

The command line parses, starts and reports; the checks of the data are ``pipeline``'s and every
refusal is a ``pipeline.errors.InputError``, printed as one line with exit status 2.
"""

from __future__ import annotations

from flows.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
