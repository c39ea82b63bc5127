"""``dpmm run``: the whole pipeline (Prefect flow ``flows.cluster``) from the command line.

    dpmm run INPUT --out OUT [--chunk-rows N] [--holdout F] [--engine mapdp|kmeans]
             [--family SPEC] [--alpha FLOAT|learn] [--max-passes N] [--tol F]
             [--min-change F] [--seed N] [--label-column COL] [--summaries M]
             [--stage2 none|bhc] [--mcmc ITER] [--scheduler ADDRESS] [--workers N]
             [--overwrite] [--no-report] [--quiet]

INPUT is a CSV file, a Parquet file or directory, a ``.npy`` file or a zarr array. Bad input
exits with status 2 and a one-line message naming the file and the row; nothing is left at OUT.
Running the same command again after a crash resumes from the last completed pass.

Wiring (``pipeline/cli.py``)::

    from pipeline.run_cli import add_run_parser
    add_run_parser(sub)          # in build_parser(), next to the other subcommands
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.cli_types import alpha as _alpha
from pipeline.cli_types import family as _family
from pipeline.cli_types import fraction as _fraction
from pipeline.cli_types import nonneg_float as _nonneg_float
from pipeline.cli_types import nonneg_int as _nonneg_int
from pipeline.cli_types import positive_int as _positive_int
from pipeline.distributed import DEFAULT_CHUNK_ROWS, ENGINES, INIT_SAMPLE, INITS, InjectedFault


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to an ``argparse`` subparsers object; it sets ``func=cmd_run``."""
    p = subparsers.add_parser(
        "run",
        help="cluster a large input with Dask (ingest, passes, write-out) under Prefect",
        description="Cluster the records of INPUT with distributed MAP-DP or Bayes K-means and "
        "write OUT/labels.zarr, OUT/clusters.parquet, OUT/run.json and a report.",
    )
    p.add_argument("input", metavar="INPUT", help="CSV, Parquet file or directory, .npy, zarr")
    p.add_argument("--out", required=True, metavar="OUT", help="output directory")
    p.add_argument(
        "--chunk-rows",
        type=_positive_int,
        default=DEFAULT_CHUNK_ROWS,
        metavar="N",
        help=f"rows per chunk, one Dask task each (default {DEFAULT_CHUNK_ROWS:,})",
    )
    p.add_argument(
        "--holdout",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="fraction of rows held out of the fit and scored (default 0)",
    )
    p.add_argument("--engine", choices=ENGINES, default="mapdp", help="stage-1 sweep")
    p.add_argument(
        "--family",
        type=_family,
        default="auto",
        metavar="SPEC",
        help="auto (default), one family for every column, or COL=KIND,COL=KIND",
    )
    p.add_argument("--alpha", type=_alpha, default="learn", metavar="FLOAT|learn")
    p.add_argument(
        "--init",
        choices=INITS,
        default="auto",
        help="start of pass 1 (auto = sample: in-memory MAP-DP with split/merge moves on a "
        "hash sample of --init-sample training rows)",
    )
    p.add_argument(
        "--init-sample",
        type=_positive_int,
        default=INIT_SAMPLE,
        metavar="N",
        help=f"rows of the sample start (default {INIT_SAMPLE:,}; more finds smaller clusters "
        "before pass 1, at the cost of a longer start)",
    )
    p.add_argument("--max-passes", type=_positive_int, default=50, metavar="N")
    p.add_argument(
        "--tol",
        type=_nonneg_float,
        default=1e-5,
        metavar="F",
        help="stop when a pass lowers the objective by at most F * |objective| (relative; "
        "default 1e-5)",
    )
    p.add_argument(
        "--min-change",
        type=_fraction,
        default=1e-3,
        metavar="F",
        help="stop when at most this fraction of the training records changed cluster in a "
        "pass (default 1e-3)",
    )
    p.add_argument(
        "--label-column",
        default=None,
        metavar="COL",
        help="true labels: left out of the fit; NMI and ARI against them are reported",
    )
    p.add_argument(
        "--summaries",
        type=_nonneg_int,
        default=0,
        metavar="M",
        help="split the stage-1 clusters into about M summaries for stage 2 (default 0: off)",
    )
    p.add_argument(
        "--stage2",
        choices=("none", "bhc"),
        default=None,
        help="stage 2 over the summaries (default: bhc with --summaries, else none)",
    )
    p.add_argument(
        "--mcmc",
        type=_nonneg_int,
        default=0,
        metavar="ITER",
        help="tree-guided MCMC iterations after BHC in stage 2 (default 0)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="join this Dask scheduler instead of starting a LocalCluster",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="LocalCluster worker processes (default: one per core)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--no-report", action="store_true", help="skip the report pictures")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args: argparse.Namespace) -> int:
    """Run the ``cluster`` flow; exit status 2 with one line on bad input."""
    from flows.cluster import run_cluster_flow  # the CLI starts the flow: the one upward import

    try:
        run_cluster_flow(
            input=args.input,
            out=args.out,
            chunk_rows=args.chunk_rows,
            holdout=args.holdout,
            engine=args.engine,
            family=args.family,
            alpha=args.alpha,
            init=args.init,
            init_sample=args.init_sample,
            max_passes=args.max_passes,
            tol=args.tol,
            min_change=args.min_change,
            random_state=args.seed,
            label_column=args.label_column,
            summaries=args.summaries,
            stage2=args.stage2,
            mcmc=args.mcmc,
            scheduler=args.scheduler,
            n_workers=args.workers,
            overwrite=args.overwrite,
            report=not args.no_report,
            progress=not args.quiet,
        )
    except InjectedFault as err:
        print(f"dpmm run: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"dpmm run: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.run_cli run INPUT --out OUT`` until ``dpmm run`` is wired."""
    parser = argparse.ArgumentParser(prog="dpmm")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
