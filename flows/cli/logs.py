"""Where log lines go while the command line runs a flow: ``logs_to`` moves every handler that
writes to a terminal stream to one log file for a block (a failed task's traceback is some 90
lines), unless ``--verbose``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def logs_to(path: Path, restore: bool = True) -> Iterator[Path]:
    """Send every log line to the file ``path`` during the block; ``restore``: hand them back."""
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
        # a FileHandler is a StreamHandler too: only streams that are not files are the terminal
        terminal: list[logging.Handler] = [
            h
            for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        ]
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
