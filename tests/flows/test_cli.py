"""End-to-end tests of the ``dpmm`` command line and of ``pipeline.data.io``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cli import build_parser, main
from pipeline.core import outputs as core_outputs
from pipeline.core.errors import InputError
from pipeline.data import io as pio
from pipeline.data import sources
from pipeline.models.mapdp import auto_restarts

CENTERS = np.array([[0.0, 0.0], [30.0, 30.0], [-30.0, 30.0]])


def blobs(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """Three far-apart round clusters in 2-D with a ``truth`` column."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n // 3)
    X = CENTERS[y] + rng.normal(size=(y.size, 2))
    perm = rng.permutation(y.size)
    return pd.DataFrame({"a": X[perm, 0], "b": X[perm, 1], "truth": y[perm]})


def run(args: list[str]) -> int:
    return main([str(a) for a in args])


def outputs(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    labels = pd.read_parquet(out / "labels.parquet")
    clusters = pd.read_parquet(out / "clusters.parquet")
    info = json.loads((out / "run.json").read_text())
    return labels, clusters, info


def no_leftovers(out: Path) -> bool:
    """No hidden sibling of OUT: a writer's staged copy or an old output moved aside."""
    return not list(out.parent.glob(f".{out.name}.*"))


@pytest.fixture
def csv_path(tmp_path: Path) -> Path:
    p = tmp_path / "data.csv"
    blobs().to_csv(p, index=False)
    return p


# -- cluster -----------------------------------------------------------------------------------
def test_cluster_csv_with_label_column(csv_path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    rc = run(["cluster", csv_path, "--out", out, "--label-column", "truth", "--seed", 0])
    assert rc == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "iteration" in captured.out  # progress
    assert "NMI" in captured.out and str(out) in captured.out  # summary
    labels, clusters, info = outputs(out)
    assert list(labels.columns) == ["row", "label", "log_density"]
    assert len(labels) == 300
    np.testing.assert_array_equal(labels["row"], np.arange(300))
    assert np.isfinite(labels["log_density"]).all()
    assert len(clusters) == info["metrics"]["n_clusters"] == labels["label"].nunique()
    assert {"cluster", "size", "weight"} <= set(clusters.columns)
    assert clusters["size"].sum() == 300
    m = info["metrics"]
    assert m["nmi"] > 0.9 and m["ari"] > 0.9
    assert m["mean_log_density"] == pytest.approx(labels["log_density"].mean())
    assert info["data"]["columns"] == ["a", "b"]  # the label column is not a feature
    assert info["parameters"]["seed"] == 0
    assert set(info["versions"]) >= {"python", "numpy", "numba", "dpmm-pipeline"}
    assert set(info["timings_seconds"]) >= {"read", "fit", "write"}
    hist = info["objective_history"]
    assert hist and hist[-1] == pytest.approx(m["objective"])
    assert len(info["restart_objectives"]) == auto_restarts(300)  # n_restarts="auto"
    assert no_leftovers(out)


@pytest.mark.parametrize("form", ["parquet-file", "parquet-dir", "npy", "tsv", "csv.gz"])
def test_other_formats(form: str, tmp_path: Path, capsys) -> None:
    df = blobs()
    if form == "parquet-file":
        p = tmp_path / "data.parquet"
        df.to_parquet(p)
    elif form == "parquet-dir":
        p = tmp_path / "data.parquet"
        p.mkdir()
        df.iloc[:150].to_parquet(p / "part-0.parquet")
        df.iloc[150:].to_parquet(p / "part-1.parquet")
    elif form == "npy":
        p = tmp_path / "data.npy"
        np.save(p, df.to_numpy(dtype=np.float64))
    elif form == "tsv":
        p = tmp_path / "data.tsv"
        df.to_csv(p, sep="\t", index=False)
    else:
        p = tmp_path / "data.csv.gz"
        df.to_csv(p, index=False)
    label = "x2" if form == "npy" else "truth"
    read = sources.read_table(p)
    assert read.shape == (300, 3)
    np.testing.assert_allclose(read.to_numpy(dtype=float), df.to_numpy(dtype=float))
    out = tmp_path / "out"
    rc = run(["cluster", p, "--out", out, "--label-column", label, "--seed", 1, "--quiet"])
    assert rc == 0
    assert "iteration" not in capsys.readouterr().out
    labels, _clusters, info = outputs(out)
    assert len(labels) == 300
    assert info["metrics"]["nmi"] > 0.9


def test_columns_family_and_no_labels(tmp_path: Path) -> None:
    df = blobs()
    rng = np.random.default_rng(2)
    df["visits"] = rng.poisson(np.where(df["truth"] == 0, 2.0, 15.0))
    df["note"] = "x"
    p = tmp_path / "data.csv"
    df.to_csv(p, index=False)
    out = tmp_path / "out"
    rc = run(
        [
            "cluster",
            p,
            "--out",
            out,
            "--columns",
            "a,b,visits",
            "--family",
            "visits=poisson",
            "--alpha",
            "2.5",
            "--restarts",
            "1",
            "--quiet",
        ]
    )
    assert rc == 0
    labels, clusters, info = outputs(out)
    assert info["data"]["families"] == {"a": "gaussian", "b": "gaussian", "visits": "poisson"}
    assert "nmi" not in info["metrics"]
    assert info["metrics"]["alpha"] == 2.5
    assert len(info["restart_objectives"]) == 1
    assert "visits:rate" in clusters.columns
    assert len(labels) == 300


def test_drop_constant(tmp_path: Path, capsys) -> None:
    df = blobs()
    df["flat"] = 7.0
    p = tmp_path / "data.csv"
    df.to_csv(p, index=False)
    out = tmp_path / "out"
    assert run(["cluster", p, "--out", out, "--label-column", "truth", "--drop-constant"]) == 0
    # the model's warning (``Schema.dropped_lines``), as ``dpmm run`` gives it
    assert "constant columns dropped (they cannot inform the clustering): 'flat'" in (
        capsys.readouterr().err
    )
    _l, _c, info = outputs(out)
    assert info["data"]["dropped_constant_columns"] == {"flat": 7.0}
    assert info["data"]["columns"] == ["a", "b"]


def test_demo(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert run(["demo", "--in-memory", "--out", out, "--rows", 1200, "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "NMI" in text and str(out) in text
    data = pd.read_csv(out / "input.csv")
    assert data.shape == (1200, 5)
    assert data["true_label"].nunique() == 6
    labels, _clusters, info = outputs(out)
    assert len(labels) == 1200
    assert info["input"] == str(out / "input.csv")
    assert info["parameters"]["label_column"] == "true_label"
    assert info["metrics"]["nmi"] > 0.9
    assert no_leftovers(out)


def test_rerun_replaces_only_on_success(csv_path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert run(["cluster", csv_path, "--out", out, "--seed", 1, "--quiet"]) == 0
    assert outputs(out)[2]["parameters"]["seed"] == 1
    (out / "stale.txt").write_text("from an earlier run")
    assert run(["cluster", csv_path, "--out", out, "--seed", 2, "--quiet"]) == 0
    assert outputs(out)[2]["parameters"]["seed"] == 2
    assert not (out / "stale.txt").exists()  # replaced, not merged
    before = (out / "run.json").read_bytes()
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,inf\n")
    capsys.readouterr()
    assert run(["cluster", bad, "--out", out, "--quiet"]) == 2
    assert (out / "run.json").read_bytes() == before  # a failed run leaves the old results
    assert no_leftovers(out)


def test_refuses_to_replace_a_foreign_directory(csv_path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert run(["cluster", csv_path, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a dpmm output directory" in err
    assert (out / "thesis.tex").read_text() == "precious"
    # nor one that holds the input
    assert run(["cluster", csv_path, "--out", tmp_path, "--quiet"]) == 2
    assert csv_path.exists()


def test_usage_errors_are_one_line(capsys) -> None:
    assert main([]) == 2
    assert main(["cluster", "x.csv"]) == 2  # --out missing
    assert main(["cluster", "x.csv", "--out", "o", "--restarts", "0"]) == 2
    assert main(["cluster", "x.csv", "--out", "o", "--family", "a=poisson,b"]) == 2
    assert main(["run", "x.csv", "--out", "o", "--prior-scale", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5
    assert all(line.startswith("dpmm: error: ") for line in err)
    assert "--out" in err[1] and "--restarts" in err[2] and "--family" in err[3]
    assert "--prior-scale" in err[4] and "a number in (0, 1)" in err[4]
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "--help"])
    assert exc.value.code == 0


def test_parser_has_subcommands() -> None:
    parser = build_parser()
    args = parser.parse_args(["cluster", "in.csv", "--out", "o", "--family", "a=poisson"])
    assert args.family == {"a": "poisson"} and args.alpha == "learn" and callable(args.func)


@pytest.mark.parametrize(
    ("argv", "threads"),
    [
        ([], False),  # mapdp: chunk tasks in parallel, one worker process per core
        (["--engine", "asugs"], True),  # sequential: one chain of chunk tasks
        (["--engine", "asugs", "--no-threads"], False),
        (["--threads"], True),
    ],
)
def test_run_workers_are_threads_for_a_sequential_engine(argv: list[str], threads: bool) -> None:
    from flows.cli.run import _threads

    args = build_parser().parse_args(["run", "in.parquet", "--out", "o", *argv])
    assert _threads(args) is threads


def test_run_dtype_option() -> None:
    """``--dtype float32`` (a float32 dataset store, ``cluster(dtype=...)``); float64 by
    default, nothing else accepted."""
    args = build_parser().parse_args(["run", "in.parquet", "--out", "o", "--dtype", "float32"])
    assert args.dtype == "float32"
    assert build_parser().parse_args(["run", "in.parquet", "--out", "o"]).dtype == "float64"
    with pytest.raises(InputError, match="--dtype"):
        build_parser().parse_args(["run", "in.parquet", "--out", "o", "--dtype", "float16"])


def test_real_subprocess(csv_path: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("dpmm")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flows.cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "out"
    proc = subprocess.run(
        [*cmd, "cluster", str(csv_path), "--out", str(out), "--label-column", "truth"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "NMI" in proc.stdout
    labels, _clusters, info = outputs(out)
    assert len(labels) == 300 and info["metrics"]["nmi"] > 0.9
    bad = tmp_path / "bad.parquet"
    bad.write_text("a,b\n1,2\n")
    proc = subprocess.run(
        [*cmd, "cluster", str(bad), "--out", str(tmp_path / "out2")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"dpmm: error: {bad}: not a Parquet file (bad magic bytes)"]
    assert not (tmp_path / "out2").exists()


# -- pipeline.data.io
# -------------------------------------------------------------------------------
def test_read_table_columns_and_rows(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text('a,b,c\n1,2,3\n\n4,5,6\n"7",8,9\n')
    df = sources.read_table(p, columns=["c", "a"])
    assert list(df.columns) == ["c", "a"] and df.shape == (3, 2)
    assert pio.describe_row(p, 0) == "row 0 (line 2)"
    assert pio.describe_row(p, 1) == "row 1 (line 4)"  # the blank line is skipped
    assert pio.describe_row(tmp_path / "d.parquet", 1) == "row 1 (0-based)"
    st = np.zeros(3, dtype=[("u", "f8"), ("v", "i4")])
    np.save(tmp_path / "s.npy", st)
    assert list(sources.read_table(tmp_path / "s.npy").columns) == ["u", "v"]


def test_staged_dir_failure_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "res"
    with pytest.raises(RuntimeError), core_outputs.staged_dir(out) as tmp:
        (tmp / "x.txt").write_text("half")
        raise RuntimeError("boom")
    assert not out.exists() and no_leftovers(out)
    with core_outputs.staged_dir(out) as tmp:
        core_outputs.write_outputs(
            tmp, {"t": pd.DataFrame({"a": [1]})}, {"run": {"v": np.float64(1)}}
        )
    assert sorted(f.name for f in out.iterdir()) == ["run.json", "t.parquet"]
    assert json.loads((out / "run.json").read_text()) == {"v": 1.0}


def test_logs_to_moves_terminal_handlers_and_puts_them_back(tmp_path: Path) -> None:
    import logging

    import prefect  # noqa: F401  (configures its handlers on import)

    from flows.cli.logs import logs_to

    def terminal() -> dict[str, list[logging.Handler]]:
        loggers = [("", logging.getLogger())] + [
            (n, lg) for n, lg in logging.Logger.manager.loggerDict.items()
        ]
        return {
            n: [
                h
                for h in lg.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
            ]
            for n, lg in loggers
            if isinstance(lg, logging.Logger)
        }

    before = {n: hs for n, hs in terminal().items() if hs}
    assert before  # Prefect's console handler, at least
    log = tmp_path / "run.log"
    with logs_to(log):
        assert not any(terminal().values())
        # a logger without Prefect's API handler, which warns outside a flow run
        logging.getLogger("prefect.dpmm-test").error("Task run failed with exception")
    assert "Task run failed with exception" in log.read_text()
    # back in place for a library user in the same process
    assert {n: hs for n, hs in terminal().items() if hs} == before


_COMMAND = """
import argparse, logging, os, sys
import flows.cluster  # noqa: F401  (as dpmm's command does: Prefect's logging set up first)
from flows.cli.run import start_flow

# distributed, imported now, leaves its lines to the root's handler
assert logging.getLogger().handlers and "distributed" not in sys.modules


def prints():
    print("worker-print", file=sys.stderr, flush=True)
    logging.getLogger("distributed.worker").error("worker-log")
    return os.getpid()


def runner(scheduler, **kwargs):
    from distributed import Client

    with Client(scheduler) as c:
        assert c.submit(prints, pure=False).result(timeout=120) != os.getpid()
    return {}


args = argparse.Namespace(verbose=False, quiet=False, log_file=sys.argv[1], program=True)
start_flow(args, {"n_workers": 1, "dashboard_address": None}, runner=runner, engine="none")
"""


def test_a_commands_workers_print_into_its_log_not_on_its_terminal(tmp_path: Path) -> None:
    """``start_flow`` in a process that imports as ``dpmm`` does (Prefect before distributed,
    whose loggers then have no handler of their own): what a worker of the LocalCluster prints or
    logs (a failed task's "Compute Failed" and traceback) goes to the run's log. Before, the
    workers were never told the file, and the fault campaign found those lines on the terminal."""
    log = tmp_path / "run.log"
    res = subprocess.run(
        [sys.executable, "-c", _COMMAND, str(log)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    text = log.read_text()
    for line in ("worker-print", "worker-log"):
        assert line in text, text
        assert line not in res.stderr, res.stderr


def test_stage2_warm_names_follow_the_flow_default():
    from flows.cli.run import _stage2_warm

    assert _stage2_warm({"summaries": 200}) == ["bhc"]
    assert _stage2_warm({"summaries": 0}) == []
    assert _stage2_warm({"summaries": 200, "stage2": "none"}) == []
    assert _stage2_warm({"summaries": 0, "stage2": "bhc"}) == ["bhc"]


@pytest.mark.parametrize(
    ("argv", "threads"), [([], True), (["--threads"], True), (["--no-threads"], False)]
)
def test_demo_workers_are_threads_unless_asked(argv: list[str], threads: bool) -> None:
    args = build_parser().parse_args(["demo", "--out", "d", *argv])
    assert args.threads is threads


@pytest.mark.parametrize(
    ("argv", "status"),
    [(["--help"], 0), (["run"], 2), (["run", "missing.csv", "--out", "o"], 2)],
    ids=["help", "usage", "bad-input"],
)
def test_the_program_ends_at_once_with_its_status(tmp_path: Path, argv, status) -> None:
    """As the program, ``dpmm`` ends right after its exit handlers (``flows.cli._exit_now``)
    with the status ``main`` returned or argparse exited with, its output written out."""
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == status, proc.stderr
    if status == 0:
        # the whole help, up to its last line, reached the pipe
        assert proc.stdout.rstrip().endswith(build_parser().format_help().rstrip())
    else:
        assert proc.stderr.startswith(("usage: dpmm", "dpmm: error:"))
    assert not (tmp_path / "o").exists()


def test_main_called_from_python_keeps_the_interpreters_exit() -> None:
    """``main(argv)`` from Python (tests, notebooks) registers no exit handler: only the program
    (``argv`` None) ends the process early."""
    import atexit

    before = atexit._ncallbacks()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert atexit._ncallbacks() == before
