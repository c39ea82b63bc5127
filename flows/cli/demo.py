"""``dpmm demo --out DIR``: ``dpmm run`` (the Prefect flow ``flows.cluster``) on a generated,
labelled data set in DIR/input.parquet, with its results in DIR/result; ``--in-memory``: ``dpmm
cluster`` on a small one in DIR/input.csv instead (``flows.cli.cluster.demo_in_memory``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from flows.cli.cluster import demo_in_memory
from flows.cli.options import LOGS, QUIET, SEED, WORKERS, flow_kwargs
from flows.cli.types import positive_int as _positive_int
from pipeline.core import outputs
from pipeline.core.errors import InputError


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to an ``argparse`` subparsers object; it sets ``func=cmd_demo``."""
    d = subparsers.add_parser(
        "demo",
        help="generate a labelled data set and run the pipeline on it",
        description="Write a seeded 20-cluster Gaussian mixture (10 columns and a true label "
        "column) to DIR/input.parquet and run the distributed pipeline on it ('dpmm run': "
        "Prefect flow, Dask workers, --summaries 200 with BHC stage 2, 10% held out); results "
        "in DIR/result/. With --in-memory: a small data set in DIR/input.csv through "
        "'dpmm cluster' instead.",
        parents=[SEED, WORKERS, QUIET, LOGS],
    )
    d.add_argument("--out", required=True, metavar="DIR", help="output directory")
    d.add_argument(
        "--rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="records (default 200000; 5000 with --in-memory)",
    )
    d.add_argument(
        "--summaries",
        type=int,
        default=200,
        metavar="M",
        help="summaries for stage 2 (default 200; 0 turns stage 2 off)",
    )
    d.add_argument(
        "--threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the local cluster's workers as threads of this process (the default: the kernels "
        "release the GIL; with an empty numba cache a helper process compiles half of them "
        "alongside) or, with --no-threads, worker processes as 'dpmm run' has them",
    )
    d.add_argument(
        "--in-memory",
        action="store_true",
        help="the old demo: 'dpmm cluster' in one process on DIR/input.csv",
    )
    d.set_defaults(func=cmd_demo)
    return d


def cmd_demo(args: argparse.Namespace) -> int:
    """``dpmm demo``: generate DIR/input.parquet (a 20-cluster mixture with ``true_label``) and
    run the ``cluster`` flow on it into DIR/result; ``--in-memory``: ``dpmm cluster`` instead."""
    if args.in_memory:
        return demo_in_memory(args)
    from pipeline.data.demo import LABEL_COLUMN
    from pipeline.data.synthetic import sample_mixture

    out = Path(args.out)
    result = out / "result"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "input.parquet").exists():
        raise InputError(
            f"--out {out}: exists and is not a dpmm demo directory (no input.parquet); "
            "choose a new or empty directory"
        )
    from flows.cli.prefect_api import prestart

    prestart()  # Prefect's temporary server boots while the data are generated
    n = int(args.rows or 200_000)
    k = 20
    # the same data as last time are kept with their dataset store: a second demo ingests nothing
    spec = {"rows": n, "d": 10, "k": k, "seed": int(args.seed)}
    marker = out / "input.json"
    same = (
        (out / "input.parquet").exists() and marker.exists() and outputs.read_json(marker) == spec
    )
    if not same:
        X, y = sample_mixture(n, d=10, k=k, seed=args.seed)
        df = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
        df[LABEL_COLUMN] = y
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out / "datasets", ignore_errors=True)  # stores of earlier data
        tmp = out / ".input.parquet.partial"
        df.to_parquet(tmp, index=False, row_group_size=50_000)
        tmp.replace(out / "input.parquet")
        outputs.write_json(marker, spec)
    if not args.quiet:
        print(
            f"{'wrote' if not same else 'reusing'} demo data ({n:,} rows x 10 columns, {k} "
            f"clusters, label column '{LABEL_COLUMN}') in {out / 'input.parquet'}",
            file=sys.stderr,
            flush=True,
        )
    from flows.cli.run import start_flow
    from flows.cluster import cluster

    kwargs = flow_kwargs(
        args,
        cluster,
        input=str(out / "input.parquet"),
        out=str(result),
        chunk_rows=50_000,
        holdout=0.1,
        label_column=LABEL_COLUMN,
        data_dir=str(out / "datasets"),
        summaries=max(int(args.summaries), 0),
        dashboard_address=None,
        overwrite=True,
        # threads: one process loads the libraries and kernels once, while Prefect's server
        # boots (warm 9 s against 12 s with worker processes: bench_coldstart)
        processes=not args.threads,
    )
    run = start_flow(args, kwargs)
    m = run["metrics"]
    s2 = run.get("stage2_info", {})
    lines = [
        f"{m['n_clusters']} clusters found (true: {k}; stage 1: {m['n_clusters_stage1']}"
        + (f", {m['n_summaries']} summaries -> {s2.get('method')}" if m.get("n_summaries") else "")
        + f"), {m['passes']} passes, objective {m['objective']:.6g}",
        f"NMI {m['nmi']:.4f}, ARI {m['ari']:.4f} against column '{LABEL_COLUMN}'",
        f"held-out mean log density {m['heldout_mean_log_density']:.4f} "
        f"({m['n_heldout']:,} records held out)",
        f"{run['timing']['total']:.1f} s; results in {result}/ (labels.zarr, clusters.parquet, "
        "run.json, report.html"
        + (", tree.parquet, dendrogram.png" if s2.get("n_clusters") else "")
        + ")",
    ]
    print("\n".join(lines), flush=True)
    return 0
