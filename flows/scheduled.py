"""The ``scheduled-clustering`` flow: score each new day's partition with the published model,
refit warm-started on a rolling window, publish the refit as the next model version.

For every partition ``INPUT/date=YYYY-MM-DD`` not done yet, in date order
(``pipeline.ops.schedule`` has the layout):

1. score it with the published model (the ``score`` flow, into ``SCORES/date=YYYY-MM-DD``),
   which validates it against the model's schema;
2. refit on the last ``window`` accepted partitions (the ``cluster`` flow on the list of their
   files, warm-started from the published model; the first version starts cold);
3. publish the refit as the next ``MODELS/vN`` and move ``MODELS/LATEST`` to it last.

INPUT, MODELS and SCORES are local directories or object-storage prefixes (fsspec URLs,
``pipeline.core.storage``). Several runs may write one MODELS at once (a backfill while the
schedule fires): each refit is built in a place of its own and published under the next free
number, and ``LATEST`` only moves forward (``pipeline.ops.registry``); a partition another run
published meanwhile is not published twice.

A partition that fails validation (a ``ValueError``: a missing column, a value of another kind,
an unseen category) is reported (``MODELS/rejected/date=...json`` and the flow's log) and
skipped; the published model stays the last good one. A partition already done (or rejected,
unchanged) is skipped, so rerunning the flow for a day already done changes nothing.

``dpmm serve`` runs it on a cron schedule (``scheduled_clustering.serve``); ``infra/prefect.yaml``
holds the same deployment for a Prefect server.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.cluster import cluster
from flows.score import score
from pipeline.core import outputs, storage
from pipeline.core.config import CRON, DEFAULT_CHUNK_ROWS, DEPLOYMENT, MAX_PASSES, WINDOW
from pipeline.core.errors import InputError
from pipeline.core.paths import safe_name
from pipeline.ops import schedule

__all__ = ["CRON", "DEPLOYMENT", "WINDOW", "scheduled_clustering", "serve_kwargs"]


@flow(name="scheduled-clustering", validate_parameters=False)
def scheduled_clustering(
    input: str,
    models: str,
    scores: str | None = None,
    window: int = WINDOW,
    until: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    max_passes: int = MAX_PASSES,
    random_state: int = 0,
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Process the new partitions of ``input`` (module docstring).

    Parameters
    ----------
    input : str
        Directory (or object-storage prefix, an fsspec URL) of ``date=YYYY-MM-DD`` partitions.
    models : str
        Directory or prefix of the model versions ``vN`` and the pointer ``LATEST``.
    scores : str, optional
        Where each partition's scores go (``date=YYYY-MM-DD/``); default ``models/../scores``.
        Each of the three may be a local path or a URL (``pipeline.core.storage``; credentials
        from the environment, never recorded).
    window : int
        Partitions (days) in the rolling window of each refit.
    until : str, optional
        Last date to process (YYYY-MM-DD); default every partition present.
    chunk_rows, max_passes, random_state, scheduler, n_workers, processes, dashboard_address,
    progress
        As the ``cluster`` flow.

    Returns
    -------
    dict with the dates ``published`` ({date: version}), ``rejected`` ({date: error}),
    ``skipped`` (done before) and the ``latest`` version's directory.
    """
    log = get_run_logger()
    if int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    models_loc = storage.location(models)
    # a missing bucket, or no credentials, is one line naming the URL before anything starts
    storage.check_reachable(models_loc, "--models")
    reg = schedule.Registry(models_loc)
    resumed = reg.finish_publish()
    if resumed is not None:
        log.warning("an interrupted publish of v%s was completed (LATEST switched)", resumed)
    scores_root = storage.location(scores) if scores is not None else models_loc.parent / "scores"
    storage.check_reachable(scores_root, "--scores")
    parts = schedule.require_partitions(input)
    all_dates = [d for d, _ in parts]
    paths = dict(parts)
    local: dict[str, Any] = {
        "chunk_rows": chunk_rows,
        "scheduler": scheduler,
        "n_workers": n_workers,
        "processes": processes,
        "dashboard_address": dashboard_address,
        "progress": progress,
    }
    refit = {"max_passes": max_passes, "random_state": random_state}
    report: dict[str, Any] = {"published": {}, "rejected": {}, "skipped": []}
    # one object per version on object storage: read again only before a refit, which other
    # writers of MODELS may have done meanwhile
    done = reg.done()
    for date, path in parts:
        if until is not None and date > until:
            break
        rej = reg.rejected(date)
        if date not in done:
            done = reg.done()
        if date in done or (rej is not None and rej["fingerprint"] == schedule.fingerprint(path)):
            report["skipped"].append(date)
            continue
        current = reg.latest()
        staged = reg.stage()
        dates = schedule.window_dates(all_dates, set(done), date, window)
        try:
            scored = scores_root / safe_name(f"date={date}", "partition")
            run = _score_and_refit(
                current, path, scored, staged, [(d, paths[d]) for d in dates], local, refit
            )
        except ValueError as err:
            msg = " ".join(str(err).split())
            reg.reject(date, path, msg)
            report["rejected"][date] = msg
            log.warning("partition %s rejected and skipped: %s", date, msg)
            storage.rmtree(staged, ignore_errors=True)
            continue
        except BaseException:
            storage.rmtree(staged, ignore_errors=True)
            raise
        done = reg.done()
        if date in done:
            storage.rmtree(staged, ignore_errors=True)
            report["skipped"].append(date)
            log.info("partition %s: v%s published by another run meanwhile", date, done[date])
            continue
        final = _publish(reg, staged, date, path, dates, current, run)
        done[date] = int(final.name[1:])
        report["published"][date] = final.name
        log.info("partition %s: published %s (window %s)", date, final.name, dates)
    latest = reg.latest()
    report["latest"] = None if latest is None else storage.redact(str(latest))
    return report


def _publish(
    reg: schedule.Registry,
    staged: Any,
    date: str,
    path: Any,
    dates: list[str],
    current: Any,
    run: dict[str, Any],
) -> Any:
    """The refit in ``staged/run`` published as the next version (its model, run.json and
    clusters, with where it came from); the version's directory."""
    for name in ("model", "run.json", "clusters.parquet"):
        storage.move(staged / "run" / name, staged / name)
    for name in ("run", "datasets"):
        storage.rmtree(staged / name, ignore_errors=True)
    return reg.publish(
        staged,
        {
            "date": date,
            "window": dates,
            "warm_start": None if current is None else current.name,
            "partition": storage.redact(str(path)),
            "fingerprint": schedule.fingerprint(path),
            "n_rows": run["n_rows"],
            "n_clusters": run["metrics"]["n_clusters"],
            "passes": run["metrics"]["passes"],
        },
    )


def _score_and_refit(
    current: Any,
    path: Any,
    scored: Any,
    staged: Any,
    window: list[tuple[str, Any]],
    local: dict[str, Any],
    refit: dict[str, Any],
) -> dict[str, Any]:
    """Score the partition at ``path`` with the published model ``current`` (None: none yet)
    into ``scored`` unless done, then refit on the ``window``'s partitions (the last is this
    one) into ``staged/run``, warm-started from ``current``; the refit's run.json."""
    # the partition's files (markers such as _SUCCESS left out), as the refit reads them
    own = schedule.window_files([window[-1]])
    if not own:
        raise InputError(f"{storage.redact(str(path))}: the partition holds no records")
    if current is not None and not outputs.committed(scored):
        try:
            score(model=str(current / "model"), input=own, out=str(scored), **local)
        except ValueError:
            # another run scored the partition meanwhile: its scores stand, and the refit
            # below refuses the partition itself if it is bad
            if not outputs.committed(scored):
                raise
    # the window's files as one input: a list of paths or URLs, nothing linked
    run: dict[str, Any] = cluster(
        input=schedule.window_files(window),
        out=str(staged / "run"),
        data_dir=str(staged / "datasets"),
        warm_start=None if current is None else str(current / "model"),
        report=False,
        **refit,
        **local,
    )
    return run


def serve_kwargs(
    input: str,
    models: str,
    cron: str = CRON,
    name: str = DEPLOYMENT,
    **parameters: Any,
) -> dict[str, Any]:
    """The arguments of ``scheduled_clustering.serve`` / ``.to_deployment`` for ``dpmm serve``:
    the deployment ``name`` on the ``cron`` schedule with the flow's parameters."""
    return {
        "name": name,
        "cron": cron,
        "parameters": {"input": str(input), "models": str(models), **parameters},
    }
