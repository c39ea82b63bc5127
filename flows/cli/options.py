"""What the ``dpmm`` subcommands share besides value types (``flows.cli.types``): the option
blocks every command that runs a flow takes (argparse parent parsers), and bad input turned into
one line (``bad_input``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.data import io as pio


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
