"""``pipeline.core.logs.to_file`` in a process like a LocalCluster's worker: no Prefect there, so
the root logger has no handler of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_WORKER = """
import logging, sys
import distributed  # noqa: F401  (its handlers, as in a worker process)
from pipeline.core.logs import to_file

assert not logging.getLogger().handlers
back = to_file(sys.argv[1])
logging.getLogger("distributed.worker").warning("from distributed")
# what reaches the root: asyncio's report of a task whose exception nobody retrieved
# (a worker's heartbeat to a scheduler that closed), a library's warning
logging.getLogger("asyncio").error("Task exception was never retrieved")
logging.getLogger("pipeline.core.storage").warning("retrying s3://b/k")
back()
assert not logging.getLogger().handlers
logging.getLogger("pipeline.core.storage").warning("after restore")
"""


def test_a_worker_process_keeps_every_line_off_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WORKER), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    text = log.read_text()
    for line in ("from distributed", "Task exception was never retrieved", "retrying s3://b/k"):
        assert line in text
    # only the line logged after the file was handed back reaches the terminal
    assert res.stderr.strip() == "after restore", res.stderr
    assert "after restore" not in text
