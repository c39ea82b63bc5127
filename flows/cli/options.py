"""What the ``dpmm`` subcommands share besides value types (``flows.cli.types``): the option
blocks every command that runs a flow takes (argparse parent parsers), and bad input turned into
one line (``bad_input``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.cli.types import positive_int
from pipeline.core.errors import InputError
from pipeline.data import io as pio

# -- the option blocks (``add_parser(..., parents=[...])``) -----------------------------------


def _block() -> tuple[argparse.ArgumentParser, Any]:
    """A parent parser and its one argument group: a command's help lists the options of every
    block under that heading, after its own."""
    parent = argparse.ArgumentParser(add_help=False)
    return parent, parent.add_argument_group("common options")


SEED, _g = _block()
_g.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
SCHEDULER, _g = _block()
_g.add_argument(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="join this Dask scheduler instead of starting a LocalCluster",
)
WORKERS, _g = _block()
_g.add_argument(
    "--workers",
    type=positive_int,
    default=None,
    metavar="N",
    help="Dask workers of the LocalCluster (default: one per core)",
)
OVERWRITE, _g = _block()
_g.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
QUIET, _g = _block()
_g.add_argument("--quiet", action="store_true", help="no progress lines")
LOGS, _g = _block()
_g.add_argument(
    "--verbose",
    action="store_true",
    help="show Prefect's and Dask's log lines (and a failed task's traceback) on stderr",
)
_g.add_argument(
    "--log-file",
    default=None,
    metavar="PATH",
    help="keep Prefect's and Dask's log lines in PATH (default: a temporary file, deleted "
    "unless the run fails for another reason than its input)",
)
del _g
#: what every command that runs a flow on a Dask cluster takes
FLOW = [SEED, SCHEDULER, WORKERS, OVERWRITE, QUIET, LOGS]

# the flow's keyword argument of each option of the blocks
_FLOW_KWARGS = {
    "seed": "random_state",
    "scheduler": "scheduler",
    "workers": "n_workers",
    "overwrite": "overwrite",
}


def flow_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The flow's keyword arguments of the block options the command has (``random_state``,
    ``scheduler``, ``n_workers``, ``overwrite``; ``progress``: not ``--quiet``)."""
    kwargs = {kw: getattr(args, opt) for opt, kw in _FLOW_KWARGS.items() if hasattr(args, opt)}
    if hasattr(args, "quiet"):
        kwargs["progress"] = not args.quiet
    return kwargs


# -- bad input ---------------------------------------------------------------------------------


def one_line(msg: str) -> str:
    return " ".join(msg.split())


@contextlib.contextmanager
def bad_input(prefix: str | None = None, rows_of: str | Path | None = None) -> Iterator[None]:
    """Turn ``ValueError`` / ``TypeError`` / ``OSError`` raised in the block into ``InputError``.

    Parameters
    ----------
    prefix : str, optional
        Put in front of the message (``"<prefix>: <message>"``) unless already there.
    rows_of : path, optional
        The input file: a 0-based ``row N`` in the message is rewritten to where that record
        is in the file (``pipeline.data.io.locate_rows``).
    """
    try:
        yield
    except (ValueError, TypeError, OSError) as err:
        msg = str(err) or type(err).__name__
        if rows_of is not None:
            msg = pio.locate_rows(msg, rows_of)
        if prefix and not msg.startswith(prefix):
            msg = f"{prefix}: {msg}"
        raise InputError(one_line(msg)) from err
