"""Which Prefect API a ``dpmm`` command's flow talks to, and starting it early.

Without ``PREFECT_API_URL`` Prefect 3 starts a temporary API server for the process the first
time a flow runs: a ``uvicorn`` subprocess that imports Prefect's server (FastAPI, SQLAlchemy,
Alembic: most of its start), opens or creates its SQLite database under ``PREFECT_HOME`` and
checks its migrations, then answers ``/health`` (``prefect.server.api.server.
SubprocessASGIServer``). That is seconds in which the command would wait and do nothing else.
``prestart`` starts the same server in a background thread as soon as the command knows it will
run a flow, so that it boots while the command imports the pipeline, checks or generates its
input; ``ready`` waits for it before the flow starts (which then finds it running: the server is
one per process). Nothing changes in what the flow records.

For repeated and scheduled runs, ``dpmm server`` (``prefect server start`` on 127.0.0.1) keeps a
server running; with ``PREFECT_API_URL`` pointing at it every command skips the start altogether
and its flow runs are kept in one place, to be seen in the Prefect UI.
"""

from __future__ import annotations

import threading

_boot: threading.Thread | None = None
_error: list[BaseException] = []


def api_url() -> str | None:
    """The Prefect API the flows of this process use (None: a temporary server)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def _start() -> None:
    try:
        from prefect.server.api.server import SubprocessASGIServer

        SubprocessASGIServer().start()
    except BaseException as err:  # the flow starts the server itself, and reports the failure
        _error.append(err)


def prestart() -> None:
    """Start Prefect's temporary API server in the background unless an API is configured
    (``PREFECT_API_URL``, or a test harness's settings) or the server is starting already."""
    global _boot
    if _boot is not None or api_url() is not None:
        return
    _boot = threading.Thread(target=_start, name="prefect-server-start", daemon=True)
    _boot.start()


def ready() -> None:
    """Wait for the server ``prestart`` started. If its start failed (the server then marks
    itself not running), the flow's own start tries again and reports what goes wrong."""
    global _boot
    if _boot is None:
        return
    _boot.join()
    _boot = None
    _error.clear()
