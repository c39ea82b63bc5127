"""The Prefect task that every step of a flow is: ``step``, one decorator with the project's
options (no cache: a step's arguments are clients and stores; retried unless the failure is bad
input), ``run_flow``, how every flow is run, and ``passes``, how every flow runs the pass loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from pipeline.core.storage import Where
from pipeline.distributed import loop
from pipeline.engines.base import LoopState, RunContext

__all__ = ["RETRIES", "passes", "retry_unless_bad_input", "run_flow", "step"]

P = ParamSpec("P")
R = TypeVar("R")

#: retries of a step that reads or writes a store, after its first attempt
RETRIES = 2


def retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a failed step unless the failure is bad input (``ValueError``)."""
    try:
        state.result(raise_on_failure=True)
    except ValueError:
        return False
    except BaseException:  # any other failure is worth a retry
        return True
    return True


def step(
    name: str, *, task_run_name: str | None = None, retries: int = RETRIES
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """``prefect.task`` named ``name`` with the flows' options; ``task_run_name`` names each run
    from the task's arguments (``"pass-{p}"``); ``retries`` after a failure that is not bad
    input (default ``RETRIES``; 0 for a step whose retry would only repeat the failure)."""
    if retries > 0:
        return task(
            name=name,
            task_run_name=task_run_name,
            retries=retries,
            retry_delay_seconds=1,
            retry_condition_fn=retry_unless_bad_input,
            cache_policy=NO_CACHE,
        )
    return task(name=name, task_run_name=task_run_name, cache_policy=NO_CACHE)


def run_flow(flow_fn: Any, **kwargs: Any) -> Any:
    """Run ``flow_fn(**kwargs)``; against Prefect's temporary server, which lives and dies with
    this process, with flow-run heartbeats off (their thread holds up the end by a second)."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    if get_current_settings().api.url is not None:
        return flow_fn(**kwargs)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return flow_fn(**kwargs)


@step("start")
def start_task(client: Any, ctx: RunContext) -> LoopState:
    return loop.start(client, ctx)


@step("pass", task_run_name="pass-{p}")
def pass_task(
    client: Any, ctx: RunContext, state: LoopState, p: int, labels_out: Where | None
) -> LoopState:
    return loop.run_pass(client, ctx, state, labels_out)


def passes(client: Any, ctx: RunContext, labels_out: Where | None = None) -> Any:
    """The fit's passes (``run_passes``) with the start and each pass a step, ``pass-N``;
    ``labels_out``: the write-out's labels group, for an engine that fuses the write-out. The
    context goes to the steps quoted: Prefect would walk its every group id looking for
    futures (10 s a task at 1,000,000 subjects)."""
    q: Any = quote(ctx)
    return loop.run_passes(
        client,
        ctx,
        state=start_task(client, q),
        step=lambda s: pass_task(client, q, s, s.pass_no + 1, labels_out),
    )
