"""The Prefect ``cluster`` flow and ``dpmm run`` end to end, under ``prefect_test_harness``:
outputs, resume after a crash, bad input (exit status 2, nothing left behind)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from sklearn.metrics import normalized_mutual_info_score

from flows.cli import main
from flows.cli.run import add_run_parser
from flows.cluster import cluster
from pipeline.core.config import INIT_SAMPLE
from pipeline.core.paths import temp_sibling
from pipeline.data.sources import REFUSE_HINT
from pipeline.data.store import Store
from pipeline.distributed import loop
from tests import prefect_db

pytestmark = pytest.mark.usefixtures("prefect_harness")


def write_blobs(path: Path, n: int = 1500, seed: int = 0, label: str | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = 10.0 * np.vstack([np.zeros(3), np.eye(3)])
    y = rng.integers(0, 4, size=n)
    X = means[y] + rng.normal(size=(n, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    if label:
        df[label] = y
    df.to_csv(path, index=False)
    return y


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


def test_flow_writes_every_output(tmp_path: Path):
    y = write_blobs(tmp_path / "in.csv")
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"), str(out), chunk_rows=200, holdout=0.2, random_state=1, **LOCAL
    )
    assert not temp_sibling(out).exists()
    for name in ("labels.zarr", "clusters.parquet", "run.json", "report.html", "report.md"):
        assert (out / name).exists(), name
    for pic in ("objective.png", "sizes.png", "projection.png"):
        assert (out / pic).stat().st_size > 1000
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    hold = zarr.open_array(str(out / "labels.zarr/holdout"))[:]
    assert label.shape == (1500,) and np.isfinite(logd).all()
    assert normalized_mutual_info_score(y, label) > 0.95
    saved = json.loads((out / "run.json").read_text())
    assert saved["metrics"]["n_clusters"] == run["metrics"]["n_clusters"]
    assert saved["metrics"]["heldout_mean_log_density"] == pytest.approx(logd[hold].mean())
    assert saved["n_train"] == 1500 - int(hold.sum())
    assert len(saved["passes"]) == saved["metrics"]["passes"]
    assert all({"objective", "seconds", "records_per_second"} <= set(p) for p in saved["passes"])
    assert {"ingest", "passes", "write_out", "total"} <= set(saved["timing"])
    assert saved["versions"]["prefect"]
    clusters = pd.read_parquet(out / "clusters.parquet")
    assert clusters["size"].sum() == saved["n_train"]


def test_rerun_after_a_crash_resumes_with_the_same_labels(tmp_path: Path, crash_after_pass):
    write_blobs(tmp_path / "in.csv", n=2000, seed=3)
    args = {"chunk_rows": 250, "random_state": 4, "report": False, "init": "sequential", **LOCAL}
    cluster(str(tmp_path / "in.csv"), str(tmp_path / "ref"), **args)
    out = tmp_path / "out"
    with crash_after_pass(2):
        cluster(str(tmp_path / "in.csv"), str(out), **args)
    assert not out.exists()
    ck = Store(temp_sibling(out) / "state.zarr").load(loop.CHECKPOINT)
    assert ck["state"].pass_no == 2
    run = cluster(str(tmp_path / "in.csv"), str(out), **args)
    assert run["resumed"]
    ref = json.loads((tmp_path / "ref" / "run.json").read_text())
    assert run["metrics"]["passes"] == ref["metrics"]["passes"]
    a = zarr.open_array(str(out / "labels.zarr/label"))[:]
    b = zarr.open_array(str(tmp_path / "ref" / "labels.zarr/label"))[:]
    assert np.array_equal(a, b)


BAD_CSV = "a,b\n1,2\n3,4\n5,\n7,8\n"
# refused on request: by default the MAP-DP engine takes missing cells (tests/pipeline/
# distributed/test_missing.py)
BAD_LINE = "column 'b': row 2 (line 4) is NaN (missing value)" + REFUSE_HINT
REFUSE = ["--missing", "refuse"]


def test_cli_bad_input_exits_2_and_leaves_nothing(tmp_path: Path, capfd):
    path = tmp_path / "bad.csv"
    path.write_text(BAD_CSV)
    out = tmp_path / "out"
    code = main(
        ["run", str(path), "--out", str(out), "--workers", "1", "--quiet", "--missing", "refuse"]
    )
    captured = capfd.readouterr()
    assert code == 2
    # the failed task's traceback and Prefect's lines went to the log file, not to stderr
    assert captured.err.splitlines() == [f"dpmm: error: {path}: {BAD_LINE}"]
    assert captured.out == ""
    assert not out.exists() and not temp_sibling(out).exists()
    # without --quiet, progress lines (the dashboard) may come first, and nothing else
    log_file = tmp_path / "run.log"
    argv = ["run", str(path), "--out", str(out), "--workers", "1", "--log-file", str(log_file)]
    argv += ["--missing", "refuse"]
    code = main(argv)
    lines = capfd.readouterr().err.splitlines()
    assert code == 2
    assert lines[-1] == f"dpmm: error: {path}: {BAD_LINE}"
    assert all(line.startswith(("Dask dashboard:", "ingest:")) for line in lines[:-1]), lines
    log = log_file.read_text()
    assert "Traceback" in log and "Finished in state Failed" in log, log
    assert not out.exists() and not temp_sibling(out).exists()


def test_dpmm_run_program_on_bad_input_prints_one_line(tmp_path: Path):
    """A real ``dpmm run`` process, as a new user runs it: status 2 and the one line on stderr;
    no traceback, no Prefect log line (not even the temporary server's at exit)."""
    path = tmp_path / "bad.csv"
    path.write_text(BAD_CSV)
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("dpmm")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flows.cli"]
    env = {
        **os.environ,
        # its own Prefect database; a loaded machine may start the temporary server slowly
        "PREFECT_HOME": prefect_db.new_home(tmp_path / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    }
    proc = subprocess.run(
        [*cmd, "run", str(path), "--out", str(out), "--workers", "1", "--quiet", *REFUSE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=800,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"dpmm: error: {path}: {BAD_LINE}"]
    assert proc.stdout == ""
    assert not out.exists() and not temp_sibling(out).exists()


def test_cli_refuses_an_existing_out(tmp_path: Path, capsys, monkeypatch):
    """Refused before Prefect's server, the cluster and the kernels start (it was refused by
    the flow, half a minute later on an empty numba cache)."""
    from flows.cli import run as cli_run

    def no_start(*args, **kwargs):
        raise AssertionError("the flow started")

    monkeypatch.setattr(cli_run, "prestart", no_start)
    monkeypatch.setattr(cli_run, "start_flow", no_start)
    write_blobs(tmp_path / "in.csv", n=50)
    (tmp_path / "out").mkdir()
    code = main(["run", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    out = tmp_path / "out"
    assert err == f"dpmm: error: --out {out}: already exists (pass --overwrite to replace it)\n"


def test_run_parser_options():
    parser = argparse.ArgumentParser()
    add_run_parser(parser.add_subparsers())
    argv = "run x.csv --out o --chunk-rows 500 --holdout 0.1 --engine kmeans --alpha 2.5"
    args = parser.parse_args([*argv.split(), "--family", "a=poisson,b=gaussian"])
    assert (args.chunk_rows, args.holdout, args.engine, args.alpha) == (500, 0.1, "kmeans", 2.5)
    assert args.family == {"a": "poisson", "b": "gaussian"}
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "x.csv", "--out", "o", "--holdout", "1.5"])
    args = parser.parse_args(["run", "x.csv", "--out", "o"])
    assert (args.summaries, args.stage2, args.mcmc, args.label_column) == (0, None, 0, None)
    assert (args.tol, args.min_change, args.init) == (1e-5, 1e-3, "auto")
    assert args.init_sample == INIT_SAMPLE
    more = "--summaries 300 --stage2 none --mcmc 50 --label-column y --min-change 0.01"
    args = parser.parse_args(["run", "x.csv", "--out", "o", *more.split(), "--init-sample", "9"])
    assert (args.summaries, args.stage2, args.mcmc, args.label_column) == (300, "none", 50, "y")
    assert (args.min_change, args.init_sample) == (0.01, 9)
    for bad in ("--summaries -1", "--stage2 gibbs", "--mcmc x", "--init-sample 0"):
        with pytest.raises(SystemExit):
            parser.parse_args(["run", "x.csv", "--out", "o", *bad.split()])


def test_label_column_summaries_and_stage2(tmp_path: Path, capsys):
    """``dpmm run --label-column truth --summaries 40``: the label column is not fitted, NMI and
    ARI are reported, stage 1 is split into about 40 summaries and BHC maps them back."""
    from sklearn.metrics import adjusted_rand_score

    y = write_blobs(tmp_path / "in.csv", n=3000, seed=5, label="truth")
    out = tmp_path / "out"
    argv = ["run", str(tmp_path / "in.csv"), "--out", str(out), "--chunk-rows", "500"]
    argv += ["--label-column", "truth", "--summaries", "40", "--workers", "2", "--no-report"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "NMI 1.0000" in err
    run = json.loads((out / "run.json").read_text())
    assert run["columns"] == ["a", "b", "c"]
    assert run["parameters"]["label_column"] == "truth"
    assert run["parameters"]["stage2"] == "bhc"
    m = run["metrics"]
    assert m["n_clusters_stage1"] == 4 and 36 <= m["n_summaries"] <= 44
    assert m["n_clusters"] == 4
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    assert m["nmi"] == pytest.approx(normalized_mutual_info_score(y, label), abs=1e-9)
    assert m["ari"] == pytest.approx(adjusted_rand_score(y, label), abs=1e-9)
    assert m["nmi"] > 0.99
    assert run["stage2_info"]["method"] == "bhc" and run["stage2_info"]["seconds"] >= 0
    assert {"summaries", "stage2"} <= set(run["timing"])
    for name in ("tree.parquet", "linkage.npy", "dendrogram.png"):
        assert (out / name).exists(), name
    clusters = pd.read_parquet(out / "clusters.parquet")
    assert len(clusters) == 4 and clusters["size"].sum() == 3000


def test_summaries_with_identity_stage2(tmp_path: Path):
    y = write_blobs(tmp_path / "in.csv", n=2000, seed=6)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"),
        str(out),
        chunk_rows=400,
        summaries=12,
        stage2="none",
        report=False,
        **LOCAL,
    )
    m = run["metrics"]
    assert m["n_clusters"] == m["n_summaries"] and 10 <= m["n_summaries"] <= 14
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    assert len(np.unique(label)) == m["n_summaries"]
    # every summary lies inside one true cluster
    tab = pd.crosstab(label, y)
    assert ((tab > 0).sum(axis=1) == 1).all()
    assert not (out / "tree.parquet").exists()


def test_demo_runs_the_flow(tmp_path: Path, capsys):
    from flows.cli import main as dpmm

    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--rows", "20000", "--summaries", "50", "--quiet"]
    assert dpmm([*argv, "--workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "NMI" in text and "held-out mean log density" in text and str(out) in text
    data = pd.read_parquet(out / "input.parquet")
    assert data.shape == (20000, 11) and data["true_label"].nunique() == 20
    run = json.loads((out / "result" / "run.json").read_text())
    assert run["metrics"]["nmi"] > 0.95
    assert run["parameters"]["holdout"] == 0.1 and run["parameters"]["summaries"] == 50
    assert not run["dataset"]["reused"]
    assert Path(run["dataset"]["path"]).parent == out / "datasets"
    # again into the same directory: the result is replaced; the same data and their dataset
    # store are kept
    stamp = (out / "input.parquet").stat().st_mtime_ns
    assert dpmm([*argv, "--workers", "2"]) == 0
    again = json.loads((out / "result" / "run.json").read_text())
    assert again["dataset"]["reused"] and (out / "input.parquet").stat().st_mtime_ns == stamp
    # other data: a new input and a new store, the old one removed
    assert dpmm([*argv[:4], "21000", *argv[5:], "--workers", "2"]) == 0
    third = json.loads((out / "result" / "run.json").read_text())
    assert not third["dataset"]["reused"] and len(list((out / "datasets").iterdir())) == 1


def test_a_second_run_of_the_same_input_reuses_its_dataset_store(tmp_path: Path):
    """Ingest once, fit many: the dataset store lives outside any run's output (under
    ``data_dir``), keyed on the input's fingerprint and the ingest options."""
    write_blobs(tmp_path / "in.csv", n=800, seed=5)
    args = {"chunk_rows": 200, "holdout": 0.1, "report": False, "data_dir": str(tmp_path / "d")}
    first = cluster(str(tmp_path / "in.csv"), str(tmp_path / "o1"), **args, **LOCAL)
    second = cluster(
        str(tmp_path / "in.csv"), str(tmp_path / "o2"), engine="kmeans", **args, **LOCAL
    )
    assert not first["dataset"]["reused"] and second["dataset"]["reused"]
    assert first["dataset"]["path"] == second["dataset"]["path"]
    assert Path(first["dataset"]["path"]).parent == tmp_path / "d"
    assert not (tmp_path / "o1" / "store.zarr").exists()
    # another ingest option is another store
    third = cluster(
        str(tmp_path / "in.csv"), str(tmp_path / "o3"), **{**args, "holdout": 0.2}, **LOCAL
    )
    assert not third["dataset"]["reused"] and third["dataset"]["path"] != first["dataset"]["path"]


def test_a_group_column_keeps_each_group_in_one_chunk(tmp_path: Path):
    """``group_column``: the rows of a group share a chunk and a fold; labels.zarr holds the
    store's row order with each row's index in the input."""
    rng = np.random.default_rng(6)
    y = write_blobs(tmp_path / "in.csv", n=900, seed=6)
    df = pd.read_csv(tmp_path / "in.csv")
    df["subject"] = rng.integers(0, 60, size=900).astype(str)
    df.to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"),
        str(out),
        chunk_rows=200,
        holdout=0.2,
        group_column="subject",
        report=False,
        **LOCAL,
    )
    assert run["n_rows"] == 900 and run["columns"] == ["a", "b", "c"]
    row = zarr.open_array(str(out / "labels.zarr/row"))[:]
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    hold = zarr.open_array(str(out / "labels.zarr/holdout"))[:]
    real = row >= 0
    assert np.array_equal(np.sort(row[real]), np.arange(900))
    by_input = np.empty(900, dtype=np.int64)
    by_input[row[real]] = label[real]
    assert normalized_mutual_info_score(y, by_input) > 0.95
    held = np.zeros(900, dtype=bool)
    held[row[real]] = hold[real]
    for s in df["subject"].unique():
        assert len(set(held[df["subject"].to_numpy() == s])) == 1  # one fold per subject


# -- ASUGS (Tsiligkaridis and Forsythe 2015): the streaming engine and the start of the MAP-DP
# passes -----------------


def test_dpmm_run_engine_asugs_is_one_streaming_pass(tmp_path: Path, capsys):
    """``dpmm run --engine asugs``: one pass over the chunks in order, every row labelled and
    scored; the state is ``pipeline.ASUGS`` streaming the chunks' training rows."""
    from pipeline import ASUGS
    from pipeline.core.config import FitParams
    from pipeline.engines.asugs import ENGINE

    y = write_blobs(tmp_path / "in.csv", n=3000, seed=7, label="truth")
    out = tmp_path / "out"
    argv = ["run", str(tmp_path / "in.csv"), "--out", str(out), "--engine", "asugs"]
    argv += ["--chunk-rows", "400", "--holdout", "0.1", "--label-column", "truth", "--lam", "2"]
    assert main([*argv, "--workers", "2", "--no-report", "--quiet"]) == 0
    run = json.loads((out / "run.json").read_text())
    m = run["metrics"]
    assert m["passes"] == 1 and m["stop"] == "one pass" and m["n_clusters"] == 4
    assert m["nmi"] > 0.99
    assert run["parameters"]["engine"] == "asugs"
    assert run["parameters"]["engine_options"] == {"lam": 2.0}
    (rec,) = run["passes"]
    assert rec["lam"] == 2.0 and rec["n_seen"] == run["n_train"]
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    assert np.isfinite(logd).all() and label.shape == y.shape
    assert m["nmi"] == pytest.approx(normalized_mutual_info_score(y, label), abs=1e-9)
    data = Store(run["dataset"]["path"])
    X = np.asarray(data.array("X")[:])
    hold = np.asarray(data.array("holdout")[:], dtype=bool)
    # the run's prior: chosen on the store's sample as ``pipeline.ASUGS`` chooses it
    fam = ENGINE.run_info(data.load("info"), FitParams(engine="asugs")).family
    ref = ASUGS(lam=2.0, family=fam).fit(X[~hold])
    clusters = pd.read_parquet(out / "clusters.parquet")
    np.testing.assert_array_equal(np.sort(clusters["size"]), np.sort(ref.cluster_sizes_))
    np.testing.assert_array_equal(label[~hold], ref.labels_)
    # the run's model takes new records: dpmm update, one ASUGS-PM pass
    new = tmp_path / "new.csv"
    write_blobs(new, n=500, seed=9)
    assert main(["update", str(out / "model"), str(new), "--out", str(tmp_path / "m2")]) == 0
    assert "500 records streamed into 4 clusters: 4 clusters now" in capsys.readouterr().out
    # the summaries pass needs per-record cluster labels the stream does not keep
    code = main([*argv, "--summaries", "10", "--overwrite", "--quiet"])
    assert code == 2
    assert "has no summaries pass" in capsys.readouterr().err


def test_dpmm_run_init_asugs_starts_the_mapdp_passes(tmp_path: Path):
    y = write_blobs(tmp_path / "in.csv", n=3000, seed=8)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"), str(out), chunk_rows=500, init="asugs", report=False, **LOCAL
    )
    assert run["init"]["init"] == "asugs" and run["init"]["asugs_records"] == 3000
    assert run["parameters"]["init"] == "asugs"
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    assert normalized_mutual_info_score(y, label) > 0.99
    assert run["metrics"]["converged"]
