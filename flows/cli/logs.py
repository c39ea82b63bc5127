"""Where log lines go while the command line runs a flow.

Importing ``prefect`` runs its ``setup_logging``: a console handler on the root logger (so Dask's
warnings print through it too) and on ``uvicorn`` / ``fastapi``, and a stderr handler on
``prefect._internal``; ``distributed`` adds its own stderr handler. A task that raises is logged
there at ERROR level with its traceback ("Task run failed with exception ..."), and the flow once
more ("Finished in state Failed ..."): some 90 lines on stderr for one bad value in the input.

``logs_to`` moves every handler that writes to a terminal stream to one log file for the length
of a block, and puts them back after it: it changes nothing on import, so a library user running
``flows.cluster.cluster`` keeps Prefect's configuration. The command line uses it unless
``--verbose``; run as a program (``dpmm``, ``python -m flows.cli``) it leaves them in the file,
because Prefect's temporary server logs its shutdown from an ``atexit`` hook, after the block.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path


def _terminal_handlers(logger: logging.Logger) -> list[logging.Handler]:
    # a FileHandler is a StreamHandler too: only streams that are not files are the terminal
    return [
        h
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]


@contextlib.contextmanager
def logs_to(path: Path, restore: bool = True) -> Iterator[Path]:
    """Send the log lines of Prefect, Dask and everything else to ``path`` during the block.

    Parameters
    ----------
    path : Path
        The log file (created or appended to).
    restore : bool
        Put the terminal handlers back after the block (False: until the process ends).

    Yields
    ------
    Path
        ``path``.
    """
    # both configure their handlers on import: that must have happened before they are moved
    import distributed  # noqa: F401
    import prefect  # noqa: F401

    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s")
    )
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    moved: list[tuple[logging.Logger, list[logging.Handler]]] = []
    for lg in loggers:
        terminal = _terminal_handlers(lg)
        if terminal:
            for h in terminal:
                lg.removeHandler(h)
            lg.addHandler(handler)
            moved.append((lg, terminal))
    try:
        yield path
    finally:
        if restore:
            _restore(handler, moved)


def _restore(
    handler: logging.Handler, moved: list[tuple[logging.Logger, list[logging.Handler]]]
) -> None:
    for lg, terminal in moved:
        lg.removeHandler(handler)
        for h in terminal:
            lg.addHandler(h)
    handler.close()
