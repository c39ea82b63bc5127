"""``dpmm serve INPUT --models DIR``: the ``scheduled-clustering`` flow (``flows.scheduled``) on a
cron schedule (``flow.serve``: this process polls for scheduled runs and runs them until
stopped). ``--once`` runs the flow once now instead. INPUT, MODELS and ``--scores`` are local
paths or object-storage URLs (``pipeline.core.storage``; ``pipeline.ops.schedule`` says how a
version
becomes visible there without a rename). A schedule needs a Prefect server that outlives
one flow run: with ``PREFECT_API_URL`` set, that server (``dpmm server`` or any Prefect server),
where the deployment and its runs show in the UI; without it, ``dpmm serve`` starts its own
(``dpmm server``'s command on a free port of 127.0.0.1, its database under ``PREFECT_HOME``) and
stops it when it stops (Prefect's temporary per-process server cannot hold a schedule).
``infra/prefect.yaml`` holds the same deployment for ``prefect deploy``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from flows.cli.options import LOGS, QUIET, WORKERS
from flows.cli.run import start_flow
from flows.cli.types import positive_int as _positive_int
from pipeline.core.config import CRON, DEFAULT_CHUNK_ROWS, DEPLOYMENT, WINDOW

PROG = "dpmm"
# one run of the deployment at a time: a refit that outlasts the next tick would have a second
# run refit the same partitions (safe, pipeline.ops.registry, but work done twice)
ONE_RUN = 1


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``argparse`` subparsers object; it sets ``func=cmd_serve``."""
    p = subparsers.add_parser(
        "serve",
        help="score and refit new daily partitions on a schedule (Prefect deployment)",
        description="Serve the scheduled-clustering flow: on every tick of --cron, each new "
        "INPUT/date=YYYY-MM-DD partition is scored with the published model (into --scores) and "
        "the model is refitted, warm-started, on the last --window partitions and published as "
        "MODELS/vN (MODELS/LATEST names it). Partitions that fail validation are reported in "
        "MODELS/rejected/ and skipped.",
        parents=[WORKERS, QUIET, LOGS],
    )
    p.add_argument(
        "input", metavar="INPUT", help="directory or URL (s3://...) of date=YYYY-MM-DD partitions"
    )
    p.add_argument(
        "--models", required=True, metavar="DIR", help="model versions and LATEST (path or URL)"
    )
    p.add_argument(
        "--scores", default=None, metavar="DIR", help="path or URL; default: MODELS/../scores"
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        default=WINDOW,
        metavar="DAYS",
        help=f"refit window (default {WINDOW})",
    )
    p.add_argument(
        "--cron", default=CRON, metavar="EXPR", help=f"schedule, cron syntax (default '{CRON}')"
    )
    p.add_argument("--name", default=DEPLOYMENT, help=f"deployment name (default {DEPLOYMENT})")
    p.add_argument("--chunk-rows", type=_positive_int, default=DEFAULT_CHUNK_ROWS, metavar="N")
    p.add_argument("--once", action="store_true", help="run the flow once now and exit")
    p.set_defaults(func=cmd_serve)
    return p


def flow_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The flow's parameters from the parsed options."""
    return {
        "input": args.input,
        "models": args.models,
        "scores": args.scores,
        "window": args.window,
        "chunk_rows": args.chunk_rows,
        "n_workers": args.workers,
    }


def deployment(args: argparse.Namespace) -> Any:
    """The deployment ``dpmm serve`` serves (``flow.to_deployment`` with ``flow.serve``'s
    arguments): what a test inspects without serving forever."""
    from flows.scheduled import scheduled_clustering, serve_kwargs

    return scheduled_clustering.to_deployment(
        **_kwargs(args, serve_kwargs), concurrency_limit=ONE_RUN
    )


def _kwargs(args: argparse.Namespace, serve_kwargs: Any) -> dict[str, Any]:
    params = flow_parameters(args)
    return serve_kwargs(
        params.pop("input"), params.pop("models"), cron=args.cron, name=args.name, **params
    )  # type: ignore[no-any-return]


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the flow on its schedule (blocks), or run it once with ``--once``."""
    from prefect.client.schemas.schedules import CronSchedule

    from flows.scheduled import scheduled_clustering, serve_kwargs
    from pipeline.core.errors import InputError

    try:
        CronSchedule(cron=args.cron)
    except ValueError as err:
        raise InputError(f"--cron {args.cron!r}: not a cron expression") from err
    from pipeline.core import storage

    # a missing bucket or no credentials: one line now, not a failed run at every tick
    storage.check_reachable(args.input, "INPUT")
    storage.check_reachable(args.models, "--models")
    if args.scores is not None:
        storage.check_reachable(args.scores, "--scores")
    from pipeline.ops.registry import Registry

    # MODELS not writable, or LATEST naming no version: one line before Prefect starts
    Registry(args.models).check()
    if args.once:
        from pipeline.ops.schedule import require_partitions

        # nothing to run: one line before Prefect starts (served, partitions may come later)
        require_partitions(args.input)

        from flows.tasks import run_flow

        start_flow(
            args,
            flow_parameters(args),
            runner=lambda **kw: run_flow(scheduled_clustering, **kw),
        )
        return 0
    with schedule_api(quiet=bool(getattr(args, "quiet", False))):
        scheduled_clustering.serve(**_kwargs(args, serve_kwargs), global_limit=ONE_RUN)
    return 0


@contextlib.contextmanager
def schedule_api(quiet: bool = False, timeout: float = 300.0) -> Iterator[str]:
    """The Prefect API the schedule is served against: ``PREFECT_API_URL`` when set; otherwise
    a Prefect server started here on 127.0.0.1 (``dpmm server``'s command, on a free port) for
    as long as the block runs, then stopped. SIGTERM ends the block as Ctrl-C does, so the
    server never outlives the command."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.cli.prefect_api import api_url, terminate
    from flows.cli.server import free_port, server_command, wait_healthy

    given = api_url()
    if given is not None:
        yield given
        return
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(server_command(port), stdout=log, stderr=subprocess.STDOUT)

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt  # flow.serve shuts down on it; the server is stopped below

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            try:
                wait_healthy(api, timeout, proc)
            except RuntimeError as err:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{err}: {' | '.join(tail)}") from None
            if not quiet:
                print(
                    f"{PROG} serve: no PREFECT_API_URL: serving against a Prefect server started "
                    f"for this command at {api} (UI http://127.0.0.1:{port}); it stops with it",
                    file=sys.stderr,
                    flush=True,
                )
            with temporary_settings(updates={PREFECT_API_URL: api}):
                yield api
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            terminate(proc, 30)
