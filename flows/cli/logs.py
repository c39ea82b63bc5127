"""Where log lines go while the command line runs a flow: ``logs_to`` moves every handler that
writes to a terminal stream to one log file for a block (a failed task's traceback is some 90
lines), unless ``--verbose``; the workers of a LocalCluster started in the block follow it
(``pipeline.core.logs``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.logs import to_file


@contextlib.contextmanager
def logs_to(path: Path, restore: bool = True) -> Iterator[Path]:
    """Send every log line to the file ``path`` during the block; ``restore``: hand them back."""
    # both configure their handlers on import: that must have happened before they are moved
    import distributed  # noqa: F401
    import prefect  # noqa: F401

    back = to_file(path)
    try:
        yield path
    finally:
        if restore:
            back()
