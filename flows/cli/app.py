"""The ``dpmm`` command line: parsing, messages and exit status; the work is ``pipeline``'s.

``dpmm cluster INPUT --out DIR``  fit MAP-DP in this process to a CSV / Parquet / NumPy table
``dpmm demo --out DIR``           ``dpmm run`` on a generated, labelled data set
``dpmm run INPUT --out DIR``      the distributed pipeline: the Prefect flow ``flows.cluster``
                                  (``flows.cli.run``)
``dpmm cv INPUT --out DIR``       a cross-validation grid as the Prefect flow ``flows.cv``
                                  (``flows.cli.cv``)
``dpmm score MODEL INPUT --out DIR`` a fitted model's labels and log densities for new records
                                  (``flows.score``, ``flows.cli.score``)
``dpmm serve INPUT --models DIR`` score and refit daily partitions on a cron schedule
                                  (``flows.scheduled``, ``flows.cli.serve``)
``dpmm update MODEL INPUT --out NEW_MODEL``  one ASUGS-PM pass of new records into a saved
                                  model (``flows.cli.update``)
``dpmm server``                   a long-lived Prefect server for repeated runs
                                  (``flows.cli.server``)
``dpmm longitudinal INPUT ...``   the mixed-effects model of seed 000 Section 7 over subjects
                                  (``flows.longitudinal``, ``flows.cli.longitudinal``)
``dpmm hmm INPUT --sequence-column COL --time-column COL --out DIR``
                                  MAP-iHMM over many sequences: the flow ``flows.hmm``
                                  (``flows.cli.hmm``)

Exit status: 0 on success; 2 on bad input or usage, with exactly one line
``dpmm: error: <message>`` on stderr; anything unexpected raises (traceback, status 1).

Adding a subcommand: write ``cmd_<name>(args) -> int``, register it in ``build_parser`` with
``set_defaults(func=cmd_<name>)``, and wrap the steps that read or validate user input in
``with bad_input(...)`` so that their ``ValueError`` / ``TypeError`` / ``OSError`` become the one
line and status 2 (``pipeline.core.errors.InputError`` always does). ``add_fit_options`` holds the
options shared with ``cluster``.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from flows.cli import prefect_api
from flows.cli.cv import add_cv_parser
from flows.cli.hmm import add_hmm_parser
from flows.cli.longitudinal import add_longitudinal_parser
from flows.cli.options import bad_input, one_line
from flows.cli.run import add_log_options, add_run_parser
from flows.cli.score import add_score_parser
from flows.cli.serve import add_serve_parser
from flows.cli.server import add_server_parser
from flows.cli.types import alpha as _alpha
from flows.cli.types import family as _family
from flows.cli.types import positive_int as _positive_int
from flows.cli.update import add_update_parser
from pipeline.core import outputs, storage
from pipeline.core.errors import InputError
from pipeline.data import io as pio
from pipeline.data import sources

PROG = "dpmm"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``InputError`` line instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see '{self.prog} --help')")


# -- option parsing ----------------------------------------------------------------------------


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
    g.add_argument(
        "--alpha",
        type=_alpha,
        default="learn",
        metavar="FLOAT|learn",
        help="DP concentration N0; 'learn' (default) sets it to its MAP value",
    )
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
        default=100,
        metavar="N",
        help="maximum iterations per restart (default 100)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="random seed (default: a fresh one, recorded in run.json)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``dpmm`` parser; each subcommand sets ``func(args) -> int``."""
    parser = _Parser(
        prog=PROG,
        description="Bayesian nonparametric clustering (MAP-DP for Dirichlet process mixtures).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "cluster",
        help="cluster the records of a table",
        description="Fit MAP-DP to the records of INPUT and write labels.parquet, "
        "clusters.parquet and run.json into DIR (replaced only when everything succeeded).",
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
        help="drop columns holding one value (reporting them) instead of failing",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    add_fit_options(p)
    p.set_defaults(func=cmd_cluster)

    d = sub.add_parser(
        "demo",
        help="generate a labelled data set and run the pipeline on it",
        description="Write a seeded 20-cluster Gaussian mixture (10 columns and a true label "
        "column) to DIR/input.parquet and run the distributed pipeline on it ('dpmm run': "
        "Prefect flow, Dask workers, --summaries 200 with BHC stage 2, 10%% held out); results "
        "in DIR/result/. With --in-memory: a small data set in DIR/input.csv through "
        "'dpmm cluster' instead.",
    )
    d.add_argument("--out", required=True, metavar="DIR", help="output directory")
    d.add_argument(
        "--rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="records (default 200000; 5000 with --in-memory)",
    )
    d.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    d.add_argument(
        "--summaries",
        type=int,
        default=200,
        metavar="M",
        help="summaries for stage 2 (default 200; 0 turns stage 2 off)",
    )
    d.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="Dask workers (default: one per core)",
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
    d.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    add_log_options(d)
    d.set_defaults(func=cmd_demo)

    add_run_parser(sub)
    add_cv_parser(sub)
    add_score_parser(sub)
    add_serve_parser(sub)
    add_update_parser(sub)
    add_server_parser(sub)
    add_longitudinal_parser(sub)
    add_hmm_parser(sub)
    return parser


# -- the cluster pipeline ----------------------------------------------------------------------
@dataclass
class ClusterOptions:
    """What ``run_cluster`` needs; the fields mirror the ``cluster`` options."""

    columns: list[str] | None = None
    label_column: str | None = None
    family: str | dict[str, str] = "auto"
    alpha: float | str = "learn"
    restarts: int | str = "auto"
    max_iter: int = 100
    seed: int | None = None
    drop_constant: bool = False
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClusterOptions:
        return cls(
            columns=getattr(args, "columns", None),
            label_column=getattr(args, "label_column", None),
            family=getattr(args, "family", "auto"),
            alpha=getattr(args, "alpha", "learn"),
            restarts=getattr(args, "restarts", None) or "auto",
            max_iter=getattr(args, "max_iter", 100),
            seed=getattr(args, "seed", None),
            drop_constant=getattr(args, "drop_constant", False),
            quiet=getattr(args, "quiet", False),
        )


@dataclass
class ClusterResult:
    """What ``run_cluster`` found and wrote."""

    run: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def _version() -> str:
    return outputs.versions()["dpmm-pipeline"]


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
    """Read ``input_path``, fit MAP-DP, write labels / clusters / run.json into ``out_dir``.

    ``out_dir`` should be a staging directory (``pipeline.core.outputs.staged_dir``).
    ``shown_input`` /
    ``shown_out`` are the paths named in messages and run.json (default: the real ones).
    Problems with the input raise ``InputError``.
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from pipeline.estimators.mapdp import MAPDP
    from pipeline.families.schema import constant_columns

    path = Path(input_path)
    name = str(shown_input if shown_input is not None else input_path)
    timings: dict[str, float] = {}

    # -- read --------------------------------------------------------------------------------
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

    # -- validate ----------------------------------------------------------------------------
    family = opts.family
    dropped: dict[str, Any] = {}
    if opts.drop_constant:
        dropped = constant_columns(df)
        if dropped:
            if len(dropped) == df.shape[1]:
                raise InputError(f"{name}: every column is constant: {dropped}")
            df = df.drop(columns=list(dropped))
            if isinstance(family, dict):
                family = {c: k for c, k in family.items() if c not in dropped}
            shown = ", ".join(f"{c} (every row is {v!r})" for c, v in dropped.items())
            _say(opts, f"dropped constant column(s): {shown}")

    # -- fit ---------------------------------------------------------------------------------
    seed = opts.seed if opts.seed is not None else secrets.randbits(32)
    model = MAPDP(
        alpha=opts.alpha,
        family=family,
        n_restarts=opts.restarts,
        max_iter=opts.max_iter,
        random_state=seed,
        verbose=0 if opts.quiet else 1,
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
            if "is constant" in msg and not opts.drop_constant:
                sep = " " if msg.endswith("drop the column") else "; "
                raise InputError(f"{msg}{sep}or pass --drop-constant") from err.__cause__
            raise
        timings["fit"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        log_density = model.score_samples(df)
        timings["score"] = time.perf_counter() - t0
    warned = [f"{w.category.__name__}: {w.message}" for w in caught]
    for w in warned:
        print(f"{PROG}: warning: {w}", file=sys.stderr)

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

    # -- write -------------------------------------------------------------------------------
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
            "label_column": label,
            "family": opts.family,
            "alpha": opts.alpha,
            "restarts": opts.restarts,
            "max_iter": opts.max_iter,
            "seed": seed,
            "drop_constant": opts.drop_constant,
        },
        "data": {
            "n_rows": int(df.shape[0]),
            "n_columns": int(df.shape[1]),
            "columns": list(df.columns),
            "families": dict(model.schema_.kinds),
            "dropped_constant_columns": dropped,
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


def cmd_demo(args: argparse.Namespace) -> int:
    """``dpmm demo``: generate DIR/input.parquet (20-cluster mixture with a ``true_label``
    column; kept when a later demo asks for the same data) and run the ``cluster`` flow on it
    into DIR/result with the label column, ``--summaries`` and 10% held out (its dataset store
    in DIR/datasets); ``--in-memory``: the ``cluster`` path on DIR/input.csv."""
    if args.in_memory:
        return _demo_in_memory(args)
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
    # the same data as last time are kept, and so is their dataset store (DIR/datasets): a
    # second demo ingests nothing
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

    kwargs = dict(
        input=str(out / "input.parquet"),
        out=str(result),
        chunk_rows=50_000,
        holdout=0.1,
        random_state=args.seed,
        label_column=LABEL_COLUMN,
        data_dir=str(out / "datasets"),
        summaries=max(int(args.summaries), 0),
        n_workers=args.workers,
        dashboard_address=None,
        overwrite=True,
        progress=not args.quiet,
    )
    # threads: one process loads the libraries and kernels once, while Prefect's server boots
    # (warm 9 s against 12 s with worker processes on 2 cores; cold, with the warm-up's helper
    # process, 28-30 s against 30-32 s: bench_coldstart)
    kwargs["processes"] = not args.threads
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


def _demo_in_memory(args: argparse.Namespace) -> int:
    """``dpmm demo --in-memory``: DIR/input.csv, then the ``cluster`` path with its label
    column."""
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


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, an output of the command (``--out``, ``--models``,
    ``--scores``) that is, is inside or contains one of its inputs (INPUT, MODEL,
    ``--warm-start``, the dataset stores' directory): ``pipeline.core.paths.check_separate``."""
    from pipeline.core.paths import check_separate

    if args.command == "demo":  # DIR holds the demo's own input and result by design
        return
    inputs: list[tuple[str, Any]] = [
        ("INPUT", getattr(args, "input", None)),
        ("MODEL", getattr(args, "model", None)),
        ("--warm-start", getattr(args, "warm_start", None)),
    ]
    if hasattr(args, "data_dir"):
        from pipeline.data.dataset import default_root

        # the stores later runs reuse: never replaced or written into by an output
        inputs.append(("--data-dir", args.data_dir or default_root()))
    outputs = [(f"--{n}", getattr(args, n, None)) for n in ("out", "models", "scores")]
    check_separate(outputs, inputs)


# the commands whose INPUT, OUT, MODEL and --data-dir may be URLs (``pipeline.core.storage``)
URL_COMMANDS = ("run", "score", "cv", "longitudinal", "hmm", "update", "serve")


def _refuse_urls(args: argparse.Namespace) -> None:
    """One line, before anything starts, for a URL given to a command that writes local
    directories only (never a directory named ``s3:`` on this disk)."""
    if args.command in URL_COMMANDS:
        return
    for name in ("input", "out", "model", "models", "scores", "data_dir", "warm_start"):
        value = getattr(args, name, None)
        if isinstance(value, str) and storage.is_url(value):
            raise InputError(
                f"{storage.redact(value)}: dpmm {args.command} reads and writes local paths "
                f"only (object storage URLs: dpmm {', '.join(URL_COMMANDS)})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpmm`` with ``argv`` (default: this program's arguments); returns the exit status."""
    prefect_api.set_defaults()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        # no argv: this process is the dpmm program, whose logging ``flows.cli.logs`` may keep
        args.program = argv is None
        _refuse_urls(args)
        check_paths(args)
        return int(args.func(args))
    except InputError as err:
        print(f"{PROG}: error: {one_line(str(err))}", file=sys.stderr, flush=True)
        return 2
