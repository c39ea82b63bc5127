"""``dpmm cv``: a cross-validation grid of MAP-DP configurations as a Prefect flow on Dask.

Every cell (alpha x prior scale x family) is fitted K times, once per held-out fold, and scored by
the mean held-out log predictive density per record (Raykov et al. 2016, eq. 3.4; Appendix A,
option 4). OUT gets ``cv.parquet`` (a row per cell), ``cv.png``, ``cv.json`` and the refit of the
chosen cell; a label column is only reported against. A rerun skips the fits already done.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from flows.cli.options import (
    ANY_INPUT,
    FLOW,
    add_chunk_rows,
    add_data_dir,
    add_input_out,
    add_missing_strict,
    flow_kwargs,
)
from flows.cli.prefect_api import prestart
from flows.cli.run import _hpc_of, start_flow
from flows.cli.types import positive_int as _positive_int
from pipeline.core.config import MAX_ITER, SELECT, TUNE_GRID
from pipeline.core.errors import InputError
from pipeline.data import io as pio


def _floats(text: str) -> list[float]:
    parts = [t.strip() for t in text.split(",")]
    if not parts or any(not t for t in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    try:
        return [float(t) for t in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _names(text: str) -> list[str]:
    parts = [t.strip() for t in text.split(",")]
    if any(not t for t in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return parts


def _join(values: list[Any]) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def add_cv_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``cv`` to an ``argparse`` subparsers object; it sets ``func=cmd_cv``."""
    p = subparsers.add_parser(
        "cv",
        help="choose MAP-DP's hyperparameters by K-fold held-out likelihood (a Prefect grid)",
        description="Fit every cell of a grid (alpha x prior scale x family) once per held-out "
        "fold of INPUT's dataset store, score it by the mean held-out log predictive density "
        "per record, choose a cell and refit it on all records. Writes OUT/cv.parquet, "
        "OUT/cv.png, OUT/cv.json and the refitted model.",
        parents=FLOW,
    )
    add_input_out(p, ANY_INPUT)
    p.add_argument(
        "--alpha",
        type=_floats,
        default=TUNE_GRID["alpha"],
        metavar="A,B,..",
        help=f"concentrations N0 > 0 (default {_join(TUNE_GRID['alpha'])})",
    )
    p.add_argument(
        "--prior-scale",
        type=_floats,
        default=TUNE_GRID["prior_scale"],
        metavar="S,T,..",
        help="share of the data's variance one cluster is expected to carry, each in (0, 1) "
        f"(default {_join(TUNE_GRID['prior_scale'])})",
    )
    p.add_argument(
        "--family",
        type=_names,
        default=["gaussian", "diag-gaussian"],
        metavar="F,G",
        help="covariance of the Gaussian columns: gaussian (full), diag-gaussian (default both)",
    )
    p.add_argument(
        "--folds", type=int, default=5, metavar="K", help="cross-validation folds (default 5)"
    )
    p.add_argument(
        "--select",
        choices=SELECT,
        default="best",
        help="best: the largest mean held-out density; one-se: the fewest clusters within one "
        "standard error of it",
    )
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        metavar="N",
        help="fits in flight at once (default: one per worker)",
    )
    p.add_argument("--label-column", metavar="COL", help="true labels: never used to choose")
    p.add_argument(
        "--max-iter", type=_positive_int, default=MAX_ITER, metavar="N", help="iterations per fit"
    )
    add_chunk_rows(p, "rows per chunk of the dataset store at most (default {default})")
    add_data_dir(p, "shared")
    add_missing_strict(
        p,
        "missing cells: each fold fitted with them latent and scored on the cells a record has "
        "(latent, the default) or refused (refuse)",
    )
    p.set_defaults(func=cmd_cv)
    return p


def cmd_cv(args: argparse.Namespace) -> int:
    """Run the ``cv`` flow; exit status 2 with one line on bad input (``InputError``)."""
    from flows.cv import cv, run_cv_flow
    from pipeline.ops.cv import Grid

    # the grid, the file and --cluster-config are refused before a Dask cluster and Prefect start
    grid = Grid(tuple(args.alpha), tuple(args.prior_scale), tuple(args.family))
    if args.folds < 2:
        raise InputError(f"--folds {args.folds}: at least 2 folds are needed")
    pio.check_file(args.input)
    _hpc_of(args)
    prestart()  # Prefect's temporary server boots while the flow's modules load
    kwargs = flow_kwargs(
        args, cv, alphas=list(grid.alphas), scales=list(grid.scales), families=list(grid.families)
    )
    rows_of = args.input if os.path.isfile(args.input) else None
    run = start_flow(args, kwargs, rows_of=rows_of, runner=run_cv_flow)
    if not args.quiet:
        m = run["metrics"]
        g = run["grid"]
        n_cells = len(g["alpha"]) * len(g["prior_scale"]) * len(g["family"])
        line = (
            f"{n_cells} cells x {run['n_folds']} folds: chosen {run['chosen']}, "
            f"{m['n_clusters']} clusters"
        )
        if "nmi" in m:
            line += f", NMI {m['nmi']:.4f} against '{args.label_column}'"
        print(f"{line}; results in {args.out}/ (cv.parquet, cv.png, cv.json)", flush=True)
    return 0
