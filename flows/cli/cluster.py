"""``dpmm cluster INPUT --out DIR``: MAP-DP fitted in this process to a table, with labels.parquet,
clusters.parquet and run.json written into DIR; and ``dpmm demo --in-memory`` (``demo_in_memory``).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flows.cli.options import QUIET, add_alpha, add_missing_strict, bad_input
from flows.cli.types import family as _family
from flows.cli.types import positive_int as _positive_int
from pipeline.core import outputs
from pipeline.core.config import ALPHA, MAX_ITER, N_RESTARTS
from pipeline.core.errors import InputError
from pipeline.data import io as pio
from pipeline.data import sources

PROG = "dpmm"


def _column_list(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return cols


def add_fit_options(p: argparse.ArgumentParser) -> None:
    """The MAP-DP options of ``cluster`` (for subcommands that fit the same way)."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--family",
        type=_family,
        default="auto",
        metavar="SPEC",
        help="likelihood family: auto (default), one name for every column (gaussian, "
        "diag-gaussian, categorical, poisson, bernoulli, binomial, exponential, geometric), or "
        "COL=KIND,COL=KIND with auto for the other columns",
    )
    add_alpha(g, "DP concentration N0; 'learn' (default) sets it to its MAP value")
    g.add_argument(
        "--restarts",
        type=_positive_int,
        default=None,
        metavar="N",
        help="restarts (default: 3 up to 20,000 records, else 1)",
    )
    g.add_argument(
        "--max-iter",
        type=_positive_int,
        default=MAX_ITER,
        metavar="N",
        help=f"maximum iterations per restart (default {MAX_ITER})",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="random seed (default: a fresh one, recorded in run.json)",
    )


def add_cluster_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``cluster`` to an ``argparse`` subparsers object; it sets ``func=cmd_cluster``."""
    p = subparsers.add_parser(
        "cluster",
        help="cluster the records of a table",
        description="Fit MAP-DP to the records of INPUT and write labels.parquet, "
        "clusters.parquet and run.json into DIR (replaced only when everything succeeded).",
        parents=[QUIET],
    )
    p.add_argument("input", metavar="INPUT", help=".csv, .csv.gz, .tsv, .parquet, .pq or .npy")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument(
        "--columns",
        type=_column_list,
        metavar="A,B,C",
        help="feature columns to use (default: all but the label column)",
    )
    p.add_argument(
        "--label-column",
        metavar="COL",
        help="true labels: not used for fitting; NMI and ARI against them are reported",
    )
    p.add_argument(
        "--drop-constant",
        action="store_true",
        help="drop columns holding one value, reporting them (the default; kept for scripts)",
    )
    add_missing_strict(
        p,
        "missing cells: cluster each record on the cells it has (latent, the default) or refuse "
        "them (refuse)",
    )
    add_fit_options(p)
    p.set_defaults(func=cmd_cluster)
    return p


@dataclass
class ClusterOptions:
    """What ``run_cluster`` needs; the fields mirror the ``cluster`` options."""

    columns: list[str] | None = None
    label_column: str | None = None
    family: str | dict[str, str] = "auto"
    alpha: float | str = ALPHA
    restarts: int | str = N_RESTARTS
    max_iter: int = MAX_ITER
    seed: int | None = None
    drop_constant: bool = False
    strict: bool = False
    missing: str = "latent"
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClusterOptions:
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**{**given, "restarts": given.get("restarts") or N_RESTARTS})


@dataclass
class ClusterResult:
    """What ``run_cluster`` found and wrote."""

    run: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def _say(opts: ClusterOptions, msg: str) -> None:
    if not opts.quiet:
        print(msg, flush=True)


def run_cluster(
    input_path: str | Path,
    out_dir: str | Path,
    opts: ClusterOptions,
    shown_input: str | Path | None = None,
    shown_out: str | Path | None = None,
) -> ClusterResult:
    """Read ``input_path``, fit MAP-DP, write labels / clusters / run.json into ``out_dir`` (a
    staging directory); ``shown_input`` / ``shown_out`` are the paths messages name. Bad input
    raises ``InputError``."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    path = Path(input_path)
    name = str(shown_input if shown_input is not None else input_path)
    timings: dict[str, float] = {}
    df, y = _read(path, name, opts, timings)
    model, seed, log_density, warned = _fit(df, opts.family, opts, path, name, timings)

    metrics: dict[str, Any] = {
        "n_clusters": int(model.n_clusters_),
        "objective": float(model.objective_),
        "alpha": float(model.alpha_),
        "n_iter": int(model.n_iter_),
        "mean_log_density": float(np.mean(log_density)),
    }
    if y is not None:
        metrics["nmi"] = float(normalized_mutual_info_score(y, model.labels_))
        metrics["ari"] = float(adjusted_rand_score(y, model.labels_))

    t0 = time.perf_counter()
    labels = pd.DataFrame(
        {
            "row": np.arange(df.shape[0], dtype=np.int64),
            "label": np.asarray(model.labels_, dtype=np.int64),
            "log_density": np.asarray(log_density, dtype=np.float64),
        }
    )
    files = outputs.write_outputs(
        out_dir, tables={"labels": labels, "clusters": model.cluster_summary()}
    )
    timings["write"] = time.perf_counter() - t0
    run: dict[str, Any] = {
        "command": "cluster",
        "input": name,
        "out": str(shown_out if shown_out is not None else out_dir),
        "parameters": {
            "columns": opts.columns,
            "label_column": opts.label_column,
            "family": opts.family,
            "alpha": opts.alpha,
            "restarts": opts.restarts,
            "max_iter": opts.max_iter,
            "seed": seed,
            "strict": opts.strict,
            "missing": opts.missing,
        },
        "data": {
            "n_rows": int(df.shape[0]),
            "n_columns": int(df.shape[1]),
            "columns": [c for c in df.columns if c not in model.schema_.dropped],
            "families": dict(model.schema_.kinds),
            "dropped_constant_columns": dict(model.schema_.dropped),
            "dropped_collinear_columns": list(model.schema_.collinear),
            "missing_cells": int(df.isna().to_numpy().sum()),
            "family_notes": list(model.schema_.notes),
        },
        "versions": outputs.versions(),
        "objective_history": [float(v) for v in model.objective_history_],
        "restart_objectives": [float(v) for v in model.restart_objectives_],
        "timings_seconds": timings,
        "metrics": metrics,
        "warnings": warned,
    }
    files += outputs.write_outputs(out_dir, json_files={"run": run})
    return ClusterResult(run=run, files=files)


def _read(
    path: Path, name: str, opts: ClusterOptions, timings: dict[str, float]
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The features of the table at ``path`` and its label column's values (None without)."""
    t0 = time.perf_counter()
    label = opts.label_column
    columns = opts.columns
    if columns is not None and label is not None:
        if label in columns:
            raise InputError(f"--label-column {label!r} is also one of --columns")
        columns = [*columns, label]
    _say(opts, f"reading {name}")
    with bad_input(prefix=name):
        df = sources.read_table(path, columns=columns)
    y = None
    if label is not None:
        if label not in df.columns:
            raise InputError(f"{name}: no column {label!r}; columns are {list(df.columns)}")
        y_s = df.pop(label)
        if y_s.isna().any():
            i = int(np.flatnonzero(y_s.isna().to_numpy())[0])
            raise InputError(
                f"{name}: label column '{label}': {pio.describe_row(path, i)} is missing"
            )
        y = y_s.to_numpy()
        if df.shape[1] == 0:
            raise InputError(f"{name}: no feature columns besides the label column '{label}'")
    timings["read"] = time.perf_counter() - t0
    _say(opts, f"read {df.shape[0]} rows x {df.shape[1]} columns in {timings['read']:.2f} s")

    return df, y


def _fit(
    df: pd.DataFrame,
    family: Any,
    opts: ClusterOptions,
    path: Path,
    name: str,
    timings: dict[str, float],
) -> tuple[Any, int, np.ndarray, list[str]]:
    """MAP-DP fitted to ``df``: the model, its seed, the records' log densities and warnings."""
    from pipeline.estimators.mapdp import MAPDP

    seed = opts.seed if opts.seed is not None else secrets.randbits(32)
    model = MAPDP(
        alpha=opts.alpha,
        family=family,
        n_restarts=opts.restarts,
        max_iter=opts.max_iter,
        random_state=seed,
        verbose=0 if opts.quiet else 1,
        missing=opts.missing,
        strict=opts.strict,
    )
    _say(opts, f"fitting MAP-DP ({opts.restarts} restarts, seed {seed})")
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with bad_input(prefix=name, rows_of=path):
                model.fit(df)
        except InputError as err:
            msg = str(err)
            if "is constant" in msg:
                sep = " " if msg.endswith("drop the column") else "; "
                raise InputError(f"{msg}{sep}or leave out --strict") from err.__cause__
            if "is NaN" in msg and opts.missing == "refuse":
                raise InputError(f"{msg}; or leave out --missing refuse") from err.__cause__
            raise
        timings["fit"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        log_density = model.score_samples(df)
        timings["score"] = time.perf_counter() - t0
    warned = [f"{w.category.__name__}: {w.message}" for w in caught]
    for w in warned:
        print(f"{PROG}: warning: {w}", file=sys.stderr)

    return model, seed, log_density, warned


def _check_out(out: Path, inputs: Sequence[Path] = ()) -> None:
    """Refuse an output directory that replacing would lose something in."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    for inp in inputs:
        with contextlib.suppress(OSError):
            if inp.resolve().is_relative_to(out.resolve()):
                raise InputError(
                    f"--out {out}: contains the input {inp}, which replacing it would delete"
                )
    if out.is_dir() and any(out.iterdir()) and not (out / "run.json").exists():
        raise InputError(
            f"--out {out}: exists and is not a dpmm output directory (no run.json); "
            "choose a new or empty directory"
        )


def _summary(res: ClusterResult, out: Path) -> None:
    m = res.run["metrics"]
    lines = [
        f"{m['n_clusters']} clusters, objective {m['objective']:.6g}, alpha {m['alpha']:.4g}, "
        f"mean log density {m['mean_log_density']:.4g}"
    ]
    if "nmi" in m:
        lines.append(
            f"NMI {m['nmi']:.4f}, ARI {m['ari']:.4f} against column "
            f"'{res.run['parameters']['label_column']}'"
        )
    names = ", ".join(f.name for f in res.files)
    lines.append(f"results in {out}/: {names}")
    print("\n".join(lines), flush=True)


def cmd_cluster(args: argparse.Namespace) -> int:
    """``dpmm cluster``."""
    out = Path(args.out)
    inp = Path(args.input)
    _check_out(out, [inp])
    opts = ClusterOptions.from_args(args)
    with contextlib.ExitStack() as stack:
        with bad_input(prefix=f"--out {out}"):
            tmp = stack.enter_context(outputs.staged_dir(out))
        res = run_cluster(inp, tmp, opts, shown_out=out)
    _summary(res, out)
    return 0


def demo_in_memory(args: argparse.Namespace) -> int:
    """``dpmm demo --in-memory``: DIR/input.csv, then the ``cluster`` path with its labels."""
    from pipeline.data.demo import LABEL_COLUMN, make_demo

    out = Path(args.out)
    _check_out(out)
    opts = ClusterOptions(label_column=LABEL_COLUMN, seed=args.seed, quiet=args.quiet)
    with contextlib.ExitStack() as stack:
        with bad_input(prefix=f"--out {out}"):
            tmp = stack.enter_context(outputs.staged_dir(out))
        df = make_demo(n_rows=int(args.rows or 5000), random_state=args.seed)
        df.to_csv(tmp / "input.csv", index=False)
        _say(opts, f"wrote demo data ({df.shape[0]} rows, 6 clusters) to {out / 'input.csv'}")
        res = run_cluster(
            tmp / "input.csv", tmp, opts, shown_input=out / "input.csv", shown_out=out
        )
    res.files.insert(0, out / "input.csv")
    _summary(res, out)
    return 0
