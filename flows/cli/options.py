"""What the ``dpmm`` subcommands share besides value types (``flows.cli.types``): the option
blocks every command that runs a flow takes (argparse parent parsers), and bad input turned into
one line (``bad_input``)."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.cli.types import alpha, family, fraction, nonneg_float, positive_int, prior_scale
from pipeline.core.config import (
    ALPHA,
    DEFAULT_CHUNK_ROWS,
    INIT_SAMPLE,
    MAX_ITER,
    MAX_PASSES,
    MIN_CHANGE,
    TOL,
    TOL_IN_MEMORY,
)
from pipeline.core.errors import InputError, StorageError
from pipeline.data import io as pio
from pipeline.data.dataset import DATA_DIR_ENV, default_root


def _block() -> tuple[argparse.ArgumentParser, Any]:
    """A parent parser and its one argument group, listed after a command's own options."""
    parent = argparse.ArgumentParser(add_help=False)
    return parent, parent.add_argument_group("common options")


SEED, _g = _block()
_g.add_argument(
    "--seed",
    type=int,
    default=0,
    metavar="N",
    help="random seed (default 0, where an estimator's random_state is None: the same command "
    "run again gives the same result, and resumes an interrupted run)",
)
SCHEDULER, _g = _block()
_g.add_argument(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="join this Dask scheduler instead of starting a LocalCluster",
)
WORKERS, _g = _block()
_g.add_argument(
    "--workers",
    type=positive_int,
    default=None,
    metavar="N",
    help="Dask workers of the LocalCluster (default: one per core)",
)
OVERWRITE, _g = _block()
_g.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
QUIET, _g = _block()
_g.add_argument("--quiet", action="store_true", help="no progress lines")
LOGS, _g = _block()
_g.add_argument(
    "--verbose",
    action="store_true",
    help="show Prefect's and Dask's log lines (and a failed task's traceback) on stderr",
)
_g.add_argument(
    "--log-file",
    default=None,
    metavar="PATH",
    help="keep Prefect's and Dask's log lines in PATH (default: a temporary file, deleted "
    "unless the run fails for another reason than its input)",
)
CLUSTER, _g = _block()
_g.add_argument(
    "--cluster",
    choices=("local", "slurm", "pbs"),
    default="local",
    help="where the Dask workers run: a LocalCluster on this machine (default), or batch "
    "jobs of a SLURM or PBS system (dask-jobqueue; needs --cluster-config)",
)
_g.add_argument(
    "--cluster-config",
    default=None,
    metavar="FILE",
    help="YAML of dask-jobqueue's keys for --cluster slurm|pbs (cores, memory, jobs, ...)",
)
del _g
#: what every command that runs a flow on a Dask cluster takes
FLOW = [SEED, SCHEDULER, CLUSTER, WORKERS, OVERWRITE, QUIET, LOGS]

# the flow's parameter of an option named otherwise
_RENAMED = {
    "seed": "random_state",
    "workers": "n_workers",
    "folds": "n_folds",
    "time": "time_column",
}


def flow_kwargs(args: argparse.Namespace, flow: Any, **given: Any) -> dict[str, Any]:
    """The keyword arguments of ``flow`` (a Prefect flow) from the parsed options: every option
    named as one of its parameters (or ``_RENAMED`` to one: ``--seed`` is ``random_state``),
    ``report`` (not ``--no-report``) and ``progress`` (not ``--quiet``); ``given`` over them."""
    params = inspect.signature(flow.fn).parameters
    options = vars(args)
    kwargs: dict[str, Any] = {}
    for opt, value in options.items():
        name = opt if opt in params else _RENAMED.get(opt, "")
        if name in params:
            kwargs[name] = value
    if "no_report" in options and "report" in params:
        kwargs["report"] = not args.no_report
    if "quiet" in options and "progress" in params:
        kwargs["progress"] = not args.quiet
    return {**kwargs, **given}


# the options naming what a command writes: a full device is named among them
WRITES = ("out", "models", "scores", "data_dir")


def places(args: argparse.Namespace) -> list[str]:
    """The local folders the command of ``args`` writes: its outputs, its dataset stores
    (``--data-dir``, else the shared folder) and the temporary folder (``storage.no_space``
    names the fullest)."""
    found = [v for n in WRITES if isinstance(v := getattr(args, n, None), str)]
    if getattr(args, "data_dir", None) is None:
        found.append(str(default_root()))
    return [*found, tempfile.gettempdir()]


def one_line(msg: str) -> str:
    return " ".join(msg.split())


@contextlib.contextmanager
def bad_input(prefix: str | None = None, rows_of: str | Path | None = None) -> Iterator[None]:
    """Turn ``ValueError`` / ``TypeError`` / ``OSError`` raised in the block into ``InputError``,
    with ``prefix`` in front of the message and a 0-based ``row N`` located in the file
    ``rows_of`` (``pipeline.data.io.locate_rows``)."""
    try:
        yield
    except StorageError:
        raise
    except (ValueError, TypeError, OSError) as err:
        msg = str(err) or type(err).__name__
        if rows_of is not None:
            msg = pio.locate_rows(msg, rows_of)
        if prefix and not msg.startswith(prefix):
            msg = f"{prefix}: {msg}"
        raise InputError(one_line(msg)) from err


#: what INPUT may be for a command that reads it with ``pipeline.data.sources``
ANY_INPUT = "CSV, Parquet file or directory, .npy, zarr"


def add_alpha(p: Any, help: str | None = None) -> None:
    """``--alpha FLOAT|learn``, the DP concentration (default ``config.ALPHA``)."""
    p.add_argument("--alpha", type=alpha, default=ALPHA, metavar="FLOAT|learn", help=help)


def add_input_out(p: argparse.ArgumentParser, input_help: str) -> None:
    """INPUT and ``--out OUT``."""
    p.add_argument("input", metavar="INPUT", help=input_help)
    p.add_argument("--out", required=True, metavar="OUT", help="output directory")


def add_chunk_rows(p: Any, help: str) -> None:
    """``--chunk-rows N``; ``help`` names the default as ``{default}``."""
    p.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=DEFAULT_CHUNK_ROWS,
        metavar="N",
        help=help.format(default=f"{DEFAULT_CHUNK_ROWS:,}"),
    )


def add_stop_options(p: argparse.ArgumentParser) -> None:
    """The pass loop's stop rule (``FitParams``): ``--max-passes``, ``--tol``, ``--min-change``."""
    p.add_argument(
        "--max-passes",
        type=positive_int,
        default=MAX_PASSES,
        metavar="N",
        help=f"stop after N passes (default {MAX_PASSES}; an in-memory fit's max_iter is "
        f"{MAX_ITER})",
    )
    p.add_argument(
        "--tol",
        type=nonneg_float,
        default=TOL,
        metavar="F",
        help="stop when a pass lowers the objective by at most F * |objective| (relative; "
        f"default {TOL:g}; an in-memory fit's tol is {TOL_IN_MEMORY:g}: its iterations are "
        "cheap, a pass reads the whole store)",
    )
    p.add_argument(
        "--min-change",
        type=fraction,
        default=MIN_CHANGE,
        metavar="F",
        help="stop when at most this fraction of the training records changed cluster in a "
        f"pass (default {MIN_CHANGE:g})",
    )


def add_missing_strict(p: Any, missing_help: str) -> None:
    """``--missing latent|refuse`` (``missing_help``) and ``--strict``."""
    p.add_argument("--missing", choices=("latent", "refuse"), default="latent", help=missing_help)
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a column holding one value instead of dropping it",
    )


def add_data_dir(p: argparse.ArgumentParser, what: str) -> None:
    """``--data-dir DIR``; ``what``: what is done with the stores there."""
    p.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help=f"where dataset stores are {what} (default ${DATA_DIR_ENV} or ~/.cache/dpmm/datasets)",
    )


def add_family(p: Any, help: str) -> None:
    p.add_argument("--family", type=family, default="auto", metavar="SPEC", help=help)


def add_prior_scale(p: argparse.ArgumentParser, what: str, default: str) -> None:
    """``--prior-scale F``: the share of the variance one ``what`` (cluster, state) carries."""
    p.add_argument(
        "--prior-scale",
        type=prior_scale,
        default=None,
        metavar="F",
        help=f"share of the data's variance one {what} is expected to carry under the "
        f"empirical-Bayes prior, in (0, 1) (default: {default})",
    )


def add_holdout(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--holdout", type=fraction, default=0.0, metavar="F", help=help)


def add_start(p: argparse.ArgumentParser, inits: tuple[str, ...], init_help: str) -> None:
    """The start of pass 1: ``--init`` (one of ``inits``, default "auto") and ``--init-sample``."""
    p.add_argument("--init", choices=inits, default="auto", help=init_help)
    p.add_argument(
        "--init-sample",
        type=positive_int,
        default=INIT_SAMPLE,
        metavar="N",
        help=f"rows of the sample start (default {INIT_SAMPLE:,}; more finds smaller clusters "
        "before pass 1, at the cost of a longer start)",
    )


def add_no_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-report", action="store_true", help="skip the report pictures")
