"""``dpmm score MODEL INPUT --out OUT``: a fitted model's label and eq. 3.4 log density for every
record of INPUT (the Prefect flow ``flows.score``); INPUT must have the model's columns and kinds.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from flows.cli.options import (
    ANY_INPUT,
    LOGS,
    OVERWRITE,
    QUIET,
    SCHEDULER,
    WORKERS,
    add_chunk_rows,
    add_input_out,
    flow_kwargs,
)
from flows.cli.run import start_flow
from pipeline.core import outputs, storage
from pipeline.data import io as pio


def add_score_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``score`` to an ``argparse`` subparsers object; it sets ``func=cmd_score``."""
    p = subparsers.add_parser(
        "score",
        help="label and score new records with a fitted model (Dask, under Prefect)",
        description="Write OUT/labels.zarr (label: the most probable cluster, -1 for a new one, "
        "eq. 3.5; log_density: the log predictive density, eq. 3.4; one row per record of "
        "INPUT, in order) and OUT/score.json. Categories the model never saw are refused.",
        parents=[SCHEDULER, WORKERS, OVERWRITE, QUIET, LOGS],
    )
    p.add_argument("model", metavar="MODEL", help="model directory (a run's OUT/model)")
    add_input_out(p, ANY_INPUT)
    add_chunk_rows(
        p, "rows per chunk (default {default}); a Dask task scores one or more consecutive chunks"
    )
    p.set_defaults(func=cmd_score)
    return p


def cmd_score(args: argparse.Namespace) -> int:
    """Run the ``score`` flow; exit status 2 with one line on bad input."""
    from flows.cli.prefect_api import prestart
    from flows.score import run_score_flow, score

    pio.check_file(args.input)
    # a model or OUT on object storage that cannot be reached (``pipeline.core.storage``)
    storage.check_reachable(args.model, "model")
    outputs.require_visible(storage.location(args.model), "model")
    storage.check_reachable(args.out, "--out")
    prestart()  # Prefect's temporary server boots while the flow's modules load
    kwargs = flow_kwargs(args, score)
    rows_of = args.input if os.path.isfile(args.input) else None
    start_flow(args, kwargs, rows_of=rows_of, runner=run_score_flow)
    return 0
