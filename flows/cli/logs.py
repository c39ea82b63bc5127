"""Where log lines go while the command line runs a flow: ``logs_to`` moves every handler that
writes to a terminal stream to one log file for a block (a failed task's traceback is some 90
lines), unless ``--verbose``; the LocalCluster's workers follow it (``LOG_ENV``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.logs import LOG_ENV, to_file


@contextlib.contextmanager
def logs_to(path: Path, restore: bool = True) -> Iterator[Path]:
    """Send every log line to the file ``path`` during the block, the worker processes of a
    LocalCluster started in it too; ``restore``: hand them back."""
    # both configure their handlers on import: that must have happened before they are moved
    import distributed  # noqa: F401
    import prefect  # noqa: F401

    back = to_file(path)
    before = os.environ.get(LOG_ENV)
    # a worker process takes this process's environment when it starts
    os.environ[LOG_ENV] = str(path)
    try:
        yield path
    finally:
        if restore:
            back()
            if before is None:
                os.environ.pop(LOG_ENV, None)
            else:
                os.environ[LOG_ENV] = before
