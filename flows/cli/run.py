"""``dpmm run``: the whole pipeline (Prefect flow ``flows.cluster``) from the command line.

INPUT is a CSV file, a Parquet file or directory, a ``.npy`` file or a zarr array. Bad input
exits with status 2 and one line on stderr; nothing is left at OUT. Missing cells are filled by
the MAP-DP engine (the other engines refuse them); ``--strict`` refuses a constant column.
Running the same command again after a crash resumes from the last completed pass. Prefect's and
Dask's log lines go to a temporary log file (``flows.cli.logs``), named on stderr only when the
run fails; ``--log-file PATH`` keeps them, ``--verbose`` shows them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.cli.options import (
    ANY_INPUT,
    FLOW,
    add_alpha,
    add_chunk_rows,
    add_data_dir,
    add_family,
    add_holdout,
    add_input_out,
    add_missing_strict,
    add_no_report,
    add_prior_scale,
    add_start,
    add_stop_options,
    flow_kwargs,
)
from flows.cli.prefect_api import flow_api, prestart
from flows.cli.types import nonneg_int, positive_float, positive_int
from pipeline.core import outputs, storage
from pipeline.core.config import (
    DEFAULT_CHUNK_ROWS,
    DEVICES,
    GPU_ENGINES,
    INITS,
    MIXTURE_ENGINES,
    N_FOLDS,
)
from pipeline.core.errors import InputError, StorageError
from pipeline.data import io as pio
from pipeline.data.store import STORE_DTYPES

PROG = "dpmm"


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to an ``argparse`` subparsers object; it sets ``func=cmd_run``."""
    p = subparsers.add_parser(
        "run",
        help="cluster a large input with Dask (ingest, passes, write-out) under Prefect",
        description="Cluster the records of INPUT with distributed MAP-DP, Bayes K-means or "
        "one streaming ASUGS-PM pass (--engine asugs) and write OUT/labels.zarr, "
        "OUT/clusters.parquet, OUT/run.json and a report.",
        parents=FLOW,
    )
    add_input_out(p, ANY_INPUT)
    add_chunk_rows(
        p,
        "rows per chunk at most (default {default}); 32 chunks or more are made a little "
        "shorter to divide evenly among 2, 4, 8, ... workers; a Dask task sweeps one or more "
        "consecutive chunks",
    )
    add_holdout(p, "fraction of rows held out of the fit and scored (default 0)")
    p.add_argument("--engine", choices=MIXTURE_ENGINES, default="mapdp", help="stage-1 sweep")
    p.add_argument(
        "--dtype",
        choices=STORE_DTYPES,
        default="float64",
        help="what the dataset store holds: float64 (default), or float32 (half the store and "
        "the passes' reads; the records rounded to float32, statistics stay float64)",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the passes run: cpu (default), or gpu: NVIDIA GPUs, one Dask worker per "
        "GPU (engines mapdp and kmeans; needs the GPU extra: pip install -e '.[gpu]')",
    )
    add_family(p, "auto (default), one family for every column, or COL=KIND,COL=KIND")
    add_alpha(p)
    add_start(
        p,
        INITS,
        "start of pass 1 (auto = sample: in-memory MAP-DP with split/merge moves on a hash "
        "sample of --init-sample training rows; MAPDP in memory starts 'sequential', which "
        "here would be one more pass over the whole store)",
    )
    add_stop_options(p)
    add_prior_scale(
        p,
        "cluster",
        "the engine's; for mapdp up to 20,000 training records, the one of lowest objective "
        "on the covariance's sample, as MAPDP chooses it, else 0.3; 0.3 for kmeans",
    )
    p.add_argument(
        "--lam",
        type=positive_float,
        default=None,
        metavar="F",
        help="lambda of ASUGS's adaptive concentration alpha_i = k_i / (lambda + log i) "
        "(--engine asugs with --alpha learn, and --init asugs; default 0.3)",
    )
    p.add_argument(
        "--label-column",
        default=None,
        metavar="COL",
        help="true labels: left out of the fit; NMI and ARI against them are reported",
    )
    p.add_argument(
        "--group-column",
        default=None,
        metavar="COL",
        help="group key (a subject, a sequence): left out of the fit; all rows of a group share "
        "a chunk and a fold",
    )
    p.add_argument(
        "--folds",
        type=positive_int,
        default=N_FOLDS,
        metavar="F",
        help=f"fold ids drawn per row (or per group) into the dataset store (default {N_FOLDS})",
    )
    add_data_dir(p, "kept and reused by later runs of the same input")
    p.add_argument(
        "--summaries",
        type=nonneg_int,
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
        type=nonneg_int,
        default=0,
        metavar="ITER",
        help="tree-guided MCMC iterations after BHC in stage 2 (default 0)",
    )
    p.add_argument(
        "--threads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the LocalCluster's workers as threads of this process instead of worker "
        "processes: less memory, one copy of the libraries (default: threads for a sequential "
        "engine such as asugs, whose chunks run one after another; processes otherwise)",
    )
    p.add_argument(
        "--warm-start",
        default=None,
        metavar="MODEL",
        help="start the passes from a fitted model's clusters (a model directory, e.g. an "
        "earlier run's OUT/model); the input must have the model's columns and kinds",
    )
    add_missing_strict(
        p,
        "missing cells: filled by iterated conditional modes and each record scored on the cells "
        "it has (latent, the default; --engine mapdp only) or refused (refuse)",
    )
    add_no_report(p)
    p.set_defaults(func=cmd_run)
    return p


def start_flow(
    args: argparse.Namespace,
    kwargs: dict[str, Any],
    rows_of: str | None = None,
    runner: Any = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Run ``flows.cluster.run_cluster_flow(**kwargs)`` (or ``runner(**kwargs)``) with the log
    lines sent where ``args`` says (``--verbose``, ``--log-file``, ``--quiet``).

    Parameters
    ----------
    args : Namespace
        The parsed options (``verbose``, ``log_file``, ``quiet`` and ``program`` when present).
    kwargs : dict
        The flow's keyword arguments.
    rows_of : str, optional
        The input file, for ``bad_input``'s ``rows_of``.
    runner : callable, optional
        The flow to run (default ``flows.cluster.run_cluster_flow``).
    engine : str, optional
        The engine the local workers warm up (default ``kwargs["engine"]``, else "mapdp").

    Returns
    -------
    dict, the content of OUT/run.json.

    Raises
    ------
    InputError
        The flow refused its input or parameters, as one line.
    """
    if runner is None:
        from flows.cluster import run_cluster_flow as runner  # the CLI starts the flow

    verbose = bool(getattr(args, "verbose", False))
    quiet = bool(getattr(args, "quiet", False))
    log_file = getattr(args, "log_file", None)
    keep = log_file is not None
    log: Path | None = None
    if not verbose:
        if log_file is not None:
            log = Path(log_file)
        else:
            fd, name = tempfile.mkstemp(prefix="dpmm-run-", suffix=".log")
            os.close(fd)
            log = Path(name)
    try:
        with contextlib.ExitStack() as stack:
            if log is not None:
                from flows.cli.logs import logs_to

                stack.enter_context(logs_to(log, not getattr(args, "program", False)))
                if quiet:
                    # with --quiet the flow's dashboard and resume lines belong in the log
                    fh = stack.enter_context(open(log, "a", encoding="utf-8"))
                    stack.enter_context(contextlib.redirect_stderr(fh))
            kwargs = stack.enter_context(
                _local_cluster(
                    kwargs, engine or str(kwargs.get("engine") or "mapdp"), _hpc_of(args)
                )
            )
            stack.enter_context(flow_api())
            return runner(**kwargs)  # type: ignore[no-any-return]
    except StorageError:
        raise
    except ValueError as err:
        msg = " ".join(str(err).split()) or type(err).__name__
        if rows_of is not None:
            msg = pio.locate_rows(msg, rows_of)
        raise InputError(msg) from err
    except BaseException as err:
        # a full device is one line (``app.main``), whose fix the log would not add to
        if isinstance(err, Exception) and storage.no_space(err) is not None:
            raise
        if log is not None and not keep:
            keep = True
            print(f"{PROG}: the log of the run is in {log}", file=sys.stderr, flush=True)
        raise
    finally:
        if log is not None and not keep:
            log.unlink(missing_ok=True)


@contextlib.contextmanager
def _local_cluster(
    kwargs: dict[str, Any], engine: str, hpc: tuple[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Start the flow's ``LocalCluster`` here, while Prefect's temporary server boots, and yield
    the flow's keyword arguments with it as ``scheduler`` (unchanged when they name a scheduler
    or ask for threads); ``hpc`` (kind, config file): a dask-jobqueue cluster instead."""
    if hpc is not None:
        from pipeline.distributed.hpc import hpc_client

        with hpc_client(hpc[0], hpc[1], warm=[engine]) as client:
            yield {**kwargs, "scheduler": client.scheduler.address}
        return
    if kwargs.get("scheduler"):
        yield kwargs
        return
    if not kwargs.get("processes", True):
        # the workers will be threads of this process: load their kernels while Prefect boots
        from pipeline.distributed.worker_setup import warm_here_with_helper

        with warm_here_with_helper(_warm_names(kwargs, engine)):
            yield kwargs
        return
    from pipeline.distributed.client import dask_client

    dashboard = kwargs.get("dashboard_address", "127.0.0.1:8787")
    with dask_client(
        None,
        kwargs.get("n_workers"),
        dashboard_address=dashboard,
        quiet=True,  # the flow prints the dashboard of the cluster it joins
        warm=_warm_names(kwargs, engine),
        device=kwargs.get("device", "cpu"),
    ) as client:
        yield {**kwargs, "scheduler": client.scheduler.address}


def _warm_names(kwargs: dict[str, Any], engine: str) -> list[str]:
    """The kernels the workers load while they start: the engine's, stage 2's, the family's."""
    from pipeline.distributed.worker_setup import warm_names

    names = [engine, *_stage2_warm(kwargs)]
    source = kwargs.get("input")
    if "family" not in kwargs or not isinstance(source, (str, Path)):
        return names
    from pipeline.data.ingest import peek_family

    family = peek_family(
        source,
        kwargs.get("family") or "auto",
        kwargs.get("chunk_rows") or DEFAULT_CHUNK_ROWS,
        drop=(kwargs.get("label_column"), kwargs.get("group_column")),
    )
    return warm_names(names, family)


def _stage2_warm(kwargs: dict[str, Any]) -> list[str]:
    """["bhc"] when the flow will run stage 2's BHC, so that a worker compiles it early."""
    stage2 = kwargs.get("stage2") or ("bhc" if int(kwargs.get("summaries") or 0) > 0 else "none")
    return ["bhc"] if stage2 == "bhc" else []


def _hpc_of(args: argparse.Namespace) -> tuple[str, str] | None:
    """(kind, checked config) of ``--cluster slurm|pbs --cluster-config FILE``, or None."""
    kind = getattr(args, "cluster", "local") or "local"
    config = getattr(args, "cluster_config", None)
    if kind == "local":
        if config is not None:
            raise InputError("--cluster-config: only with --cluster slurm or pbs")
        return None
    if config is None:
        raise InputError(f"--cluster {kind}: needs --cluster-config FILE (dask-jobqueue's keys)")
    if getattr(args, "scheduler", None):
        raise InputError(f"--cluster {kind}: give either --cluster or --scheduler, not both")
    from pipeline.distributed.hpc import read_config

    try:
        read_config(kind, config)
    except ValueError as err:
        raise InputError(" ".join(str(err).split())) from err
    return kind, str(config)


def _threads(args: argparse.Namespace) -> bool:
    """Workers as threads: as asked, else for a sequential engine (one chain of tasks)."""
    if args.threads is not None:
        return bool(args.threads)
    from pipeline.engines import get_engine

    return bool(get_engine(args.engine).sequential)


def _check_device(args: argparse.Namespace) -> None:
    """One line naming what ``--device gpu`` lacks here, never a run on the CPU instead."""
    if args.device != "gpu":
        return
    if args.engine not in GPU_ENGINES:
        raise InputError(f"--device gpu: engine {args.engine!r} has no GPU version ({GPU_ENGINES})")
    if getattr(args, "scheduler", None):
        return  # the workers of an existing cluster have the cards; its tasks check them
    from pipeline.engines.gpu import missing_device

    why = missing_device()
    if why is not None:
        raise InputError(f"--device gpu: {why}")


def cmd_run(args: argparse.Namespace) -> int:
    """Run the ``cluster`` flow; exit status 2 with one line on bad input (``InputError``)."""
    # what can be seen of the file itself is refused before a Dask cluster and Prefect start
    pio.check_file(args.input)
    _check_device(args)
    _hpc_of(args)  # a bad --cluster-config is refused before anything starts
    # and an OUT or --data-dir on object storage that cannot be reached (``pipeline.core.storage``)
    storage.check_reachable(args.out, "--out")
    outputs.check_new_output(args.out, args.overwrite)
    if args.data_dir is not None:
        storage.check_reachable(args.data_dir, "--data-dir")
    prestart()  # Prefect's temporary server boots while the flow's modules load
    from flows.cluster import cluster

    kwargs = flow_kwargs(
        args,
        cluster,
        engine_options={} if args.lam is None else {"lam": args.lam},
        processes=not _threads(args),
    )
    rows_of = args.input if os.path.isfile(args.input) else None
    start_flow(args, kwargs, rows_of=rows_of)
    return 0
