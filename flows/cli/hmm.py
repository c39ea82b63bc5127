"""``dpmm hmm``: the infinite HMM (MAP-iHMM, Raykov et al. 2016, Section 6) over many sequences, as
the Prefect flow ``flows.hmm``, on ``dpmm run``'s defaults.

OUT: rows.parquet, sequences.parquet, states.parquet, transitions.csv, run.json, report.html and
model/ (the fitted MAPiHMM); bad input leaves nothing there.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from flows.cli.options import (
    FLOW,
    add_chunk_rows,
    add_family,
    add_holdout,
    add_input_out,
    add_no_report,
    add_prior_scale,
    add_start,
    add_stop_options,
    flow_kwargs,
)
from flows.cli.types import positive_float as _positive_float
from pipeline.core.config import GAMMA, IHMM_ALPHA
from pipeline.data import io as pio


def _temper(text: str) -> str | float:
    from pipeline.models.ihmm import check_temper

    try:
        return check_temper(text if text == "auto" else _positive_float(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_hmm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``hmm`` to an ``argparse`` subparsers object; it sets ``func=cmd_hmm``."""
    p = subparsers.add_parser(
        "hmm",
        help="fit an infinite HMM (MAP-iHMM) to many sequences with Dask under Prefect",
        description="Fit MAP-iHMM (Raykov et al. 2016, Section 6) to the sequences of INPUT "
        "(one row per time step) and write OUT/rows.parquet, sequences.parquet, states.parquet, "
        "transitions.csv, run.json, a report and model/ (pipeline.load_model).",
        parents=FLOW,
    )
    add_input_out(p, "CSV or Parquet file")
    p.add_argument("--sequence-column", required=True, metavar="COL", help="sequence ids")
    p.add_argument(
        "--time-column",
        required=True,
        metavar="COL",
        help="time stamps (numbers or dates), strictly increasing within each sequence",
    )
    p.add_argument(
        "--alpha",
        type=_positive_float,
        default=IHMM_ALPHA,
        metavar="N0",
        help="transition concentration N0 (default 1)",
    )
    p.add_argument(
        "--gamma",
        type=_positive_float,
        default=GAMMA,
        metavar="M0",
        help="top-level concentration M0 (default 2; new states need M0 > 1)",
    )
    add_family(p, "emission family: auto (default), one for every column, or COL=KIND,...")
    add_prior_scale(p, "state", "the ihmm engine's, 0.1")
    add_chunk_rows(p, "rows per chunk (default {default}); a sequence never straddles two chunks")
    add_holdout(p, "fraction of sequences held out and scored (default 0)")
    add_start(
        p,
        ("auto", "sample", "sequential"),
        "start of pass 1: auto = sample (in-memory MAP-iHMM with Viterbi, merge and split moves "
        "on the first training sequences, about --init-sample rows), or sequential",
    )
    add_stop_options(p)
    p.add_argument(
        "--temper",
        type=_temper,
        default="auto",
        metavar="auto|W",
        help="emission weight w in (0, 1] of every record (MAPiHMM's temper): auto (default) "
        "measures the lag-1 autocorrelation rho of the records within the sample start's states "
        "and, where significant, weighs them by (1 - rho) / (1 + rho); 1 = untempered",
    )
    add_no_report(p)
    p.set_defaults(func=cmd_hmm)
    return p


def cmd_hmm(args: argparse.Namespace) -> int:
    """Run the ``hmm`` flow; exit status 2 with one line on bad input (``InputError``)."""
    from flows.cli.prefect_api import prestart
    from flows.cli.run import start_flow
    from flows.hmm import hmm  # the CLI starts the flow: the one upward import
    from flows.tasks import run_flow

    pio.check_file(args.input)
    prestart()  # Prefect's temporary server boots while the flow's modules load
    kwargs = flow_kwargs(args, hmm)
    rows_of = args.input if os.path.isfile(args.input) else None
    start_flow(
        args, kwargs, rows_of=rows_of, runner=lambda **kw: run_flow(hmm, **kw), engine="ihmm"
    )
    return 0
