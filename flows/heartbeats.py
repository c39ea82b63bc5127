"""How the command line runs a flow (``run_flow``), and flow-run heartbeats that end with it.

A flow-run heartbeat is an event (``prefect.flow-run.heartbeat``) a running flow sends every
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (180 by default, at least 30), so that a
long-lived Prefect server can tell a crashed run (its heartbeats stop) from a long one.
Prefect 3.8 sends them from a thread that sleeps in one-second steps and joins it when the
flow run ends: every flow run ends up to a second late, 0.8-1.0 s of a 6-7 s ``dpmm run`` on
the 1M benchmark against a long-lived server, depending on where the heartbeat thread's
second was.

``run_flow`` therefore switches Prefect's own heartbeats off for the flow it runs, and the
flows of this package, decorated with ``with_heartbeats``, send the same events from a thread
that waits on an event instead, which their end sets: the end is not held up. Against
Prefect's temporary server (no ``PREFECT_API_URL``), which lives and dies with the command,
no heartbeat is sent at all. A flow run some other way (a library call, a deployment served
by ``flow.serve``) keeps Prefect's own heartbeats, as configured.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

#: Prefect's floor on the heartbeat interval (``prefect.flow_engine.MINIMUM_HEARTBEAT_INTERVAL``)
MINIMUM_SECONDS = 30
#: the name of the thread ``with_heartbeats`` sends them from
THREAD_NAME = "dpmm-flow-heartbeats"

# the heartbeat interval the flows that ``run_flow`` runs send their heartbeats at (None: none)
_seconds: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dpmm_heartbeat_seconds", default=None
)

F = TypeVar("F", bound=Callable[..., Any])


def run_flow(flow_fn: Any, **kwargs: Any) -> Any:
    """Run ``flow_fn(**kwargs)`` as the command line does (``dpmm run``, ``dpmm score``, ...):
    with Prefect's own flow-run heartbeats off, and, against a configured Prefect API (a
    long-lived server), the heartbeats of ``with_heartbeats`` at the configured interval
    instead (module docstring)."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    settings = get_current_settings()
    wanted = settings.flows.heartbeat_frequency if settings.api.url is not None else None
    token = _seconds.set(wanted)
    try:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            return flow_fn(**kwargs)
    finally:
        _seconds.reset(token)


def with_heartbeats(fn: F) -> F:
    """Decorate a flow's function (under ``@flow``) to send the heartbeats ``run_flow`` asks
    for while it runs (module docstring)."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        with heartbeats():
            return fn(*args, **kwargs)

    return body  # type: ignore[return-value]


@contextlib.contextmanager
def heartbeats() -> Iterator[None]:
    """Send this flow run's heartbeats while inside, from a thread that stops as soon as the
    block ends; nothing unless ``run_flow`` asked for them and Prefect sends none itself."""
    from prefect.settings import get_current_settings

    seconds = _seconds.get()
    if seconds is None or get_current_settings().flows.heartbeat_frequency is not None:
        yield
        return
    beat = _heartbeat_event()
    if beat is None:
        yield
        return
    stop = threading.Event()
    interval = max(int(seconds), MINIMUM_SECONDS)

    def send() -> None:
        from prefect.events import emit_event

        while True:
            try:
                emit_event(event="prefect.flow-run.heartbeat", **beat)
            except Exception:  # a lost heartbeat is no reason to fail the flow run
                logger.debug("flow-run heartbeat not sent", exc_info=True)
            if stop.wait(interval):
                return

    # the flow's context (its settings, among them the API URL) in the thread too
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(send,), name=THREAD_NAME, daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


def _heartbeat_event() -> dict[str, Any] | None:
    """The resource and related resources of this flow run's heartbeat event, as Prefect's
    flow engine builds them (``_build_heartbeat_event_template``); None outside a flow run."""
    import prefect
    from prefect.context import FlowRunContext
    from prefect.events.related import tags_as_related_resources

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None else None
    if run is None:
        return None
    resource = {
        "prefect.resource.id": f"prefect.flow-run.{run.id}",
        "prefect.resource.name": run.name or "",
        "prefect.version": prefect.__version__,
    }
    related: list[Any] = []
    if run.flow_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow.{run.flow_id}",
                "prefect.resource.role": "flow",
                "prefect.resource.name": ctx.flow.name if ctx is not None and ctx.flow else "",
            }
        )
    if run.deployment_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                "prefect.resource.role": "deployment",
            }
        )
    related += [dict(r) for r in tags_as_related_resources(set(run.tags or []))]
    return {"resource": resource, "related": related}
