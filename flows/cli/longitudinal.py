"""``dpmm longitudinal``: the semiparametric mixed-effects model of Raykov et al. 2016, Section 7
(Prefect flow ``flows.longitudinal``) from the command line.

Defaults as ``dpmm run``; bad input exits with status 2 and one line naming the column and row.
"""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli.options import (
    FLOW,
    add_alpha,
    add_chunk_rows,
    add_no_report,
    add_stop_options,
    flow_kwargs,
)
from flows.cli.prefect_api import prestart
from flows.cli.run import start_flow
from flows.cli.types import positive_int as _positive_int
from flows.cli.types import shrink as shrink_type
from pipeline.core import storage
from pipeline.core.errors import InputError
from pipeline.data import io as pio
from pipeline.models.mixed_effects_start import SHRINK

PROG = "dpmm"


def _columns(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError("expected column names separated by commas")
    return cols


def add_longitudinal_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``longitudinal`` to an ``argparse`` subparsers object (``func=cmd_longitudinal``)."""
    p = subparsers.add_parser(
        "longitudinal",
        help="random-effects model of longitudinal data with a DP mixture of subgroups",
        description="Fit the semiparametric mixed-effects model y_i = X_i beta_i + eps_i, beta_i "
        "from a Dirichlet-process mixture of Gaussians (Raykov et al. 2016, Section 7), to the "
        "subjects of INPUT; write OUT/subjects.parquet, OUT/clusters.parquet, OUT/run.json, a "
        "report and OUT/model (pipeline.load_model).",
        parents=FLOW,
    )
    p.add_argument("input", metavar="INPUT", help="CSV or Parquet, one row per observation")
    p.add_argument("--subject", required=True, metavar="COL", help="subject id column")
    p.add_argument("--response", required=True, metavar="COL", help="response column")
    p.add_argument(
        "--covariates",
        required=True,
        type=_columns,
        metavar="A,B,...",
        help="covariates of the random effects (an intercept is added)",
    )
    p.add_argument(
        "--time",
        default=None,
        metavar="COL",
        help="time column: a covariate (added if not listed) and the trajectories' x-axis",
    )
    p.add_argument("--out", required=True, metavar="OUT", help="output directory")
    p.add_argument(
        "--folds",
        type=_positive_int,
        default=None,
        metavar="K",
        help="K-fold cross-validation over subjects: mean held-out log predictive density "
        "per subject with its standard error (Table 5's protocol)",
    )
    add_chunk_rows(p, "rows per chunk, whole subjects (default {default})")
    add_alpha(p)
    p.add_argument(
        "--shrink",
        type=shrink_type,
        default=SHRINK,
        metavar="auto|FLOAT",
        help="the prior's shrink: a cluster's expected covariance of the random effects is "
        "1/shrink of the subjects'; 'auto' (default) chooses 10, 3 or 1.5 by the held-out "
        "density of the start's subjects, as MixedEffectsDP",
    )
    add_stop_options(p)
    add_no_report(p)
    p.set_defaults(func=cmd_longitudinal)
    return p


def cmd_longitudinal(args: argparse.Namespace) -> int:
    """Run the ``longitudinal`` flow; status 2 and one line on bad input."""
    from flows.longitudinal import longitudinal
    from flows.tasks import run_flow

    pio.check_file(args.input)
    if args.folds is not None and args.folds < 2:
        raise InputError(f"--folds must be at least 2, got {args.folds}")
    prestart()  # Prefect's temporary server boots while the flow's modules load
    kwargs = flow_kwargs(args, longitudinal)
    run = start_flow(
        args, kwargs, runner=lambda **kw: run_flow(longitudinal, **kw), engine="mixed_effects"
    )
    if not args.quiet:
        m = run["metrics"]
        line = (
            f"{m['n_subjects']:,} subjects, {m['n_clusters']} clusters, tau "
            f"{m['noise_precision']:.4g}, {m['passes']} passes"
        )
        if "cv" in run:
            cv = run["cv"]
            line += (
                f"; {cv['folds']}-fold held-out log density per subject "
                f"{cv['mean_heldout_log_density']:.4f} +/- {cv['se']:.4f}"
            )
        print(f"{line}\nresults in {storage.redact(args.out)}/", flush=True)
    return 0
