"""Where log lines go: ``to_file`` moves every handler that writes to a terminal stream to one
log file (a failed task's traceback is some 90 lines), in the command's process and, through
``LOG_ENV`` (``file_of``), in the worker processes of the LocalCluster it starts
(``pipeline.distributed.dask_client``, ``pipeline.distributed.worker_setup``), where
``stderr_to`` sends whatever else a worker process prints to the same file. A batch job's
workers keep their job's own log.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

#: the log file of the command that started this process's cluster (unset: the terminal)
LOG_ENV = "DPMM_LOG_FILE"


class _LogFile(logging.FileHandler):
    """The handler of ``to_file``'s log file: what ``file_of`` looks for."""


def to_file(path: str | os.PathLike[str]) -> Callable[[], None]:
    """Send the log lines of this process to the file ``path`` (appended to): each logger's
    handlers that write to a terminal stream are replaced by one handler of the file, which the
    root logger also gets if it has none. Returns the function that hands the lines back to the
    terminal."""
    handler = _LogFile(path, encoding="utf-8")
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

    # a process whose root logger has no handler (a worker process: nothing there set one up)
    # would print what reaches the root (asyncio's "exception was never retrieved", a library's
    # warning) on the terminal through logging's last resort
    root = logging.getLogger()
    bare = not root.handlers
    if bare:
        root.addHandler(handler)

    def restore() -> None:
        for lg, terminal in moved:
            lg.removeHandler(handler)
            for h in terminal:
                lg.addHandler(h)
        if bare:
            root.removeHandler(handler)
        handler.close()

    return restore


def stderr_to(path: str | os.PathLike[str]) -> None:
    """Append this process's standard error (file descriptor 2) to the file ``path`` for the
    rest of its life: in a LocalCluster's worker process, whatever it writes there outside
    ``to_file``'s handlers (an exception Python reports as ignored, a warning, a handler a
    library sets up later) goes to the command's log instead of the terminal it shares."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def file_of(name: str = "distributed") -> str | None:
    """The log file of ``to_file`` that the records of the logger ``name`` reach, by its own
    handlers or its ancestors' (as logging passes them on), or None: the terminal."""
    lg: logging.Logger | None = logging.getLogger(name)
    while lg is not None:
        for h in lg.handlers:
            if isinstance(h, _LogFile):
                return str(h.baseFilename)
        # distributed gives its loggers a handler of their own only where the root has none at
        # its import: in a command's process Prefect's came first, and its lines reach the root's
        lg = lg.parent if lg.propagate else None
    return None
