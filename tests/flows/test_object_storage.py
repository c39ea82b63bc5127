"""``dpmm run`` and ``dpmm score`` with INPUT, OUT and the dataset store on object storage: a
real S3-compatible server (moto's server mode on 127.0.0.1, ``s3_server`` in tests/conftest.py).
The run's labels are those of the same run on local disk; a run killed after a pass leaves
nothing visible and resumes to the same labels; bad URLs exit with status 2 and one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main
from flows.cli.app import URL_COMMANDS
from flows.cluster import cluster
from pipeline.core import outputs, storage
from pipeline.data.dataset import DATA_DIR_ENV
from pipeline.data.store import Store
from pipeline.distributed import loop
from pipeline.estimators.model import load_model

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


def blobs(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    means = 10.0 * np.vstack([np.zeros(3), np.eye(3)])
    y = rng.integers(0, 4, size=n)
    return pd.DataFrame(means[y] + rng.normal(size=(n, 3)), columns=["a", "b", "c"])


def put_parquet(url: str, df: pd.DataFrame) -> None:
    with storage.location(url).open("wb") as fh:
        df.to_parquet(fh, index=False, row_group_size=400)


def labels_of(out: str | Path) -> np.ndarray:
    return np.asarray(zarr.open_array(f"{out}/labels.zarr/label", mode="r")[:])


def objects(url: str) -> list[str]:
    loc = storage.location(url)
    return sorted(loc.files()) if loc.exists() else []


def test_dpmm_run_and_score_on_s3(s3_bucket: str, tmp_path: Path, monkeypatch, capfd) -> None:
    """``dpmm run s3://.../in.parquet --out s3://.../out`` (worker processes, the dataset store
    with OUT on S3), then ``dpmm score`` from the stored model."""
    b = f"s3://{s3_bucket}"
    df = blobs(1600, 0)
    put_parquet(f"{b}/in.parquet", df)
    df.to_parquet(tmp_path / "in.parquet", index=False, row_group_size=400)
    args = {"chunk_rows": 400, "random_state": 1, "report": False}
    cluster(str(tmp_path / "in.parquet"), str(tmp_path / "ref"), **args, **LOCAL)
    # no --data-dir, no $DPMM_DATA_DIR: the dataset store goes with OUT, on S3
    monkeypatch.delenv(DATA_DIR_ENV)
    argv = ["run", f"{b}/in.parquet", "--out", f"{b}/out", "--chunk-rows", "400"]
    code = main([*argv, "--seed", "1", "--workers", "2", "--quiet"])
    assert code == 0, capfd.readouterr().err
    out = storage.location(f"{b}/out")
    manifest = json.loads((out / outputs.MANIFEST).read_text())
    listed = set(manifest["objects"])
    assert {"run.json", "clusters.parquet", "model/model.json", "report.html"} <= listed
    assert "fingerprint.json" not in listed and "labels.zarr/label/zarr.json" in listed
    run = json.loads((out / "run.json").read_text())
    assert run["out"] == f"{b}/out" and run["input"] == f"{b}/in.parquet"
    assert run["dataset"]["path"].startswith(f"{b}/out/datasets/")
    assert "testing" not in (out / "run.json").read_text()  # no credential recorded
    ref = json.loads((tmp_path / "ref" / "run.json").read_text())
    assert run["metrics"]["passes"] == ref["metrics"]["passes"]
    np.testing.assert_array_equal(labels_of(out), labels_of(tmp_path / "ref"))

    day2 = blobs(700, 5)
    put_parquet(f"{b}/day2.parquet", day2)
    argv = ["score", f"{b}/out/model", f"{b}/day2.parquet", "--out", f"{b}/scores"]
    assert main([*argv, "--workers", "2", "--quiet"]) == 0
    model = load_model(f"{b}/out/model")
    np.testing.assert_array_equal(labels_of(f"{b}/scores"), model.predict(day2))
    logd = zarr.open_array(f"{b}/scores/labels.zarr/log_density", mode="r")[:]
    np.testing.assert_allclose(logd, model.score_samples(day2))
    assert outputs.committed(storage.location(f"{b}/scores"))
    assert not any(k.startswith("store.zarr") for k in objects(f"{b}/scores"))
    # a second run to the same OUT is refused; with --overwrite it replaces it
    capfd.readouterr()
    assert main(["run", f"{b}/in.parquet", "--out", f"{b}/out", "--quiet"]) == 2
    # the command's own lines: a worker process of the previous command that is still closing
    # can write its log to the same stderr
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("dpmm")]
    assert said == [f"dpmm: error: --out {b}/out: already exists (pass --overwrite to replace it)"]


def test_a_killed_run_on_s3_is_invisible_and_resumes(
    s3_bucket: str, tmp_path: Path, crash_after_pass, capfd
) -> None:
    b = f"s3://{s3_bucket}"
    df = blobs(2000, 3)
    put_parquet(f"{b}/in.parquet", df)
    df.to_parquet(tmp_path / "in.parquet", index=False, row_group_size=400)
    args = {"chunk_rows": 250, "random_state": 4, "report": False, "init": "sequential"}
    cluster(str(tmp_path / "in.parquet"), str(tmp_path / "ref"), **args, **LOCAL)
    data_dir = f"{b}/datasets"
    with crash_after_pass(2):
        cluster(f"{b}/in.parquet", f"{b}/out", data_dir=data_dir, **args, **LOCAL)
    out = storage.location(f"{b}/out")
    # objects were written under OUT, but without a manifest nothing is visible
    assert objects(f"{b}/out") and not outputs.committed(out)
    ck = Store(out / "state.zarr").load(loop.CHECKPOINT)
    assert ck["state"].pass_no == 2
    capfd.readouterr()
    code = main(["score", f"{b}/out/model", f"{b}/in.parquet", "--out", f"{b}/s", "--quiet"])
    assert code == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith(f"dpmm: error: model {b}/out/model: not a committed output"), err
    assert objects(f"{b}/s") == []
    run = cluster(f"{b}/in.parquet", f"{b}/out", data_dir=data_dir, **args, **LOCAL)
    assert run["resumed"] and outputs.committed(out)
    assert run["dataset"]["reused"]
    ref = json.loads((tmp_path / "ref" / "run.json").read_text())
    assert run["metrics"]["passes"] == ref["metrics"]["passes"]
    np.testing.assert_array_equal(labels_of(out), labels_of(tmp_path / "ref"))


def etags(url: str) -> dict[str, str]:
    loc = storage.location(url)
    return {k: str(v.get("ETag")) for k, v in loc.files().items()} if loc.exists() else {}


@pytest.mark.slow
def test_overwrite_on_s3_keeps_the_old_output_until_the_new_one_is_complete(
    s3_bucket: str, tmp_path: Path, crash_after_pass, capfd
) -> None:
    """``--overwrite`` of a committed OUT: the new run is staged beside it; killed after a pass,
    the old output is still visible and unchanged; run again, it resumes and is swapped in.
    The same for ``dpmm score``."""
    b = f"s3://{s3_bucket}"
    day1, day2 = blobs(1200, 7), blobs(1200, 8)
    put_parquet(f"{b}/d1.parquet", day1)
    put_parquet(f"{b}/d2.parquet", day2)
    day2.to_parquet(tmp_path / "d2.parquet", index=False, row_group_size=400)
    args = {"chunk_rows": 300, "random_state": 2, "report": False, "init": "sequential"}
    cluster(str(tmp_path / "d2.parquet"), str(tmp_path / "ref"), **args, **LOCAL)
    data_dir = f"{b}/datasets"
    cluster(f"{b}/d1.parquet", f"{b}/out", data_dir=data_dir, **args, **LOCAL)
    before = etags(f"{b}/out")
    with crash_after_pass(1):
        cluster(f"{b}/d2.parquet", f"{b}/out", overwrite=True, data_dir=data_dir, **args, **LOCAL)
    out = storage.location(f"{b}/out")
    assert outputs.committed(out) and etags(f"{b}/out") == before
    outputs.require_visible(out / "model")
    assert objects(f"{b}/.out.partial") and not outputs.committed(
        storage.location(f"{b}/.out.partial")
    )
    run = cluster(f"{b}/d2.parquet", f"{b}/out", overwrite=True, data_dir=data_dir, **args, **LOCAL)
    assert run["resumed"] and outputs.committed(out)
    assert objects(f"{b}/.out.partial") == []
    assert json.loads((out / "run.json").read_text())["input"] == f"{b}/d2.parquet"
    np.testing.assert_array_equal(labels_of(out), labels_of(tmp_path / "ref"))
    manifest = json.loads((out / outputs.MANIFEST).read_text())
    assert set(manifest["objects"]) == set(objects(f"{b}/out")) - {outputs.MANIFEST}

    model = load_model(f"{b}/out/model")
    score = ["score", f"{b}/out/model", "--out", f"{b}/s", "--workers", "1", "--quiet"]
    assert main([*score[:2], f"{b}/d1.parquet", *score[2:]]) == 0
    assert main([*score[:2], f"{b}/d2.parquet", *score[2:]]) == 2
    assert "already exists" in capfd.readouterr().err
    assert main([*score[:2], f"{b}/d2.parquet", *score[2:], "--overwrite"]) == 0
    np.testing.assert_array_equal(labels_of(f"{b}/s"), model.predict(day2))
    assert objects(f"{b}/.s.partial") == [] and outputs.committed(storage.location(f"{b}/s"))


def test_dpmm_cv_on_s3_resumes_and_equals_the_local_grid(
    s3_bucket: str, tmp_path: Path, monkeypatch, crash_after_fits
) -> None:
    """``dpmm cv`` with INPUT, OUT and the dataset store on S3: killed after a fit, nothing is
    visible; run again, it skips the fits done and its table equals the local grid's."""
    from flows.cv import run_cv_flow

    b = f"s3://{s3_bucket}"
    df = blobs(600, 11)
    put_parquet(f"{b}/cvin.parquet", df)
    df.to_parquet(tmp_path / "cvin.parquet", index=False, row_group_size=400)
    grid = {"alphas": [0.5, 5.0], "scales": [0.2], "families": ["gaussian"], "n_folds": 3}
    kw = {**grid, "processes": False, "n_workers": 2, "progress": False, "chunk_rows": 200}
    ref = run_cv_flow(input=str(tmp_path / "cvin.parquet"), out=str(tmp_path / "cvref"), **kw)
    monkeypatch.delenv(DATA_DIR_ENV)
    with crash_after_fits(2):
        run_cv_flow(input=f"{b}/cvin.parquet", out=f"{b}/cv", **kw)
    out = storage.location(f"{b}/cv")
    done = [k for k in objects(f"{b}/cv") if k.startswith("fits/")]
    assert len(done) >= 2 and not outputs.committed(out)
    argv = ["cv", f"{b}/cvin.parquet", "--out", f"{b}/cv", "--alpha", "0.5,5", "--folds", "3"]
    argv += ["--prior-scale", "0.2", "--family", "gaussian", "--chunk-rows", "200"]
    assert main([*argv, "--workers", "2", "--quiet"]) == 0
    run = json.loads((out / "cv.json").read_text())
    assert run["resumed"] and run["fits_reused"] == len(done) and run["fits_run"] == 6 - len(done)
    assert run["out"] == f"{b}/cv" and run["dataset"]["path"].startswith(f"{b}/cv/datasets/")
    assert run["chosen"] == ref["chosen"]
    listed = set(json.loads((out / outputs.MANIFEST).read_text())["objects"])
    assert {"cv.parquet", "cv.png", "cv.json", "model/model.json"} <= listed
    assert not any(k.startswith(("fits/", "fingerprint")) for k in listed)
    with (out / "cv.parquet").open("rb") as fh:
        got = pd.read_parquet(fh)
    want = pd.read_parquet(tmp_path / "cvref" / "cv.parquet")
    for col in ("mean_log_density", "se_log_density", "n_clusters", "fold2_log_density"):
        np.testing.assert_array_equal(got[col], want[col])
    model, local = load_model(f"{b}/cv/model"), load_model(tmp_path / "cvref" / "model")
    np.testing.assert_array_equal(model.predict(df), local.predict(df))


def test_dpmm_longitudinal_on_s3_equals_the_local_run(
    s3_bucket: str, tmp_path: Path, capfd
) -> None:
    """``dpmm longitudinal`` with INPUT and OUT on S3 writes what the same run writes locally;
    a bad value exits 2 naming the URL, column and row, and leaves nothing on S3."""
    from pipeline.data.synthetic import sample_longitudinal

    b = f"s3://{s3_bucket}"
    df = sample_longitudinal(120, seed=4)
    df.to_csv(tmp_path / "lon.csv", index=False)
    storage.location(f"{b}/lon.csv").write_bytes((tmp_path / "lon.csv").read_bytes())
    args = ["--subject", "subject", "--response", "qol", "--covariates", "depression,adl"]
    args += ["--time", "wave", "--workers", "1", "--chunk-rows", "300", "--quiet"]
    local = ["longitudinal", str(tmp_path / "lon.csv"), "--out", str(tmp_path / "l")]
    assert main([*local, *args]) == 0
    assert main(["longitudinal", f"{b}/lon.csv", *args, "--out", f"{b}/lon"]) == 0, (
        capfd.readouterr().err
    )
    out = storage.location(f"{b}/lon")
    listed = set(json.loads((out / outputs.MANIFEST).read_text())["objects"])
    assert {"subjects.parquet", "clusters.parquet", "run.json", "model/model.json"} <= listed
    assert not any(".zarr/" in k or k.startswith("fingerprint") for k in listed)
    with (out / "subjects.parquet").open("rb") as fh:
        got = pd.read_parquet(fh)
    pd.testing.assert_frame_equal(got, pd.read_parquet(tmp_path / "l" / "subjects.parquet"))
    run = json.loads((out / "run.json").read_text())
    assert run["parameters"]["input"] == f"{b}/lon.csv"

    bad = df.astype({"qol": object})
    bad.loc[7, "qol"] = "n/a"
    storage.location(f"{b}/bad.csv").write_text(bad.to_csv(index=False))
    capfd.readouterr()
    assert main(["longitudinal", f"{b}/bad.csv", *args, "--out", f"{b}/lon2"]) == 2
    # the command's own lines (a closing worker of the run before may log to the same stderr)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("dpmm")]
    assert len(err) == 1 and err[0].startswith(f"dpmm: error: {b}/bad.csv"), err
    assert "qol" in err[0] and objects(f"{b}/lon2") == []


def test_dpmm_hmm_and_update_on_s3_equal_the_local_runs(s3_bucket: str, tmp_path: Path) -> None:
    """``dpmm hmm`` and ``dpmm update`` with INPUT, MODEL and OUT on S3 write what the same
    commands write locally; ``update --overwrite`` of a committed model swaps it whole."""
    from pipeline.estimators.mapdp import MAPDP
    from pipeline.estimators.model import save_model
    from tests.pipeline.engines.test_ihmm_engine import sequences_frame

    b = f"s3://{s3_bucket}"
    df, _ = sequences_frame(600, seed=2)
    df["t"] = (np.arange(600) % 40) * 1.5
    df.to_csv(tmp_path / "seq.csv", index=False)
    storage.location(f"{b}/seq.csv").write_bytes((tmp_path / "seq.csv").read_bytes())
    hmm_args = ["--sequence-column", "seq", "--time-column", "t", "--workers", "1", "--quiet"]
    assert main(["hmm", str(tmp_path / "seq.csv"), "--out", str(tmp_path / "h"), *hmm_args]) == 0
    assert main(["hmm", f"{b}/seq.csv", "--out", f"{b}/h", *hmm_args]) == 0
    out = storage.location(f"{b}/h")
    listed = set(json.loads((out / outputs.MANIFEST).read_text())["objects"])
    assert {"rows.parquet", "states.parquet", "run.json", "model/model.json"} <= listed
    for name in ("rows.parquet", "sequences.parquet"):
        with (out / name).open("rb") as fh:
            pd.testing.assert_frame_equal(
                pd.read_parquet(fh), pd.read_parquet(tmp_path / "h" / name)
            )

    blobs_df = blobs(400, 9)
    save_model(MAPDP(random_state=0).fit(blobs_df), f"{b}/m")
    save_model(load_model(f"{b}/m"), tmp_path / "m")
    new = blobs(300, 10)
    new.to_csv(tmp_path / "new.csv", index=False)
    storage.location(f"{b}/new.csv").write_bytes((tmp_path / "new.csv").read_bytes())
    assert (
        main(
            [
                "update",
                str(tmp_path / "m"),
                str(tmp_path / "new.csv"),
                "--out",
                str(tmp_path / "m2"),
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["update", f"{b}/m", f"{b}/new.csv", "--out", f"{b}/m2", "--quiet"]) == 0
    got, want = load_model(f"{b}/m2"), load_model(tmp_path / "m2")
    np.testing.assert_array_equal(got.cluster_stats_, want.cluster_stats_)
    # --overwrite: the committed model is replaced whole, and nothing is left beside it
    assert main(["update", f"{b}/m2", f"{b}/new.csv", "--out", f"{b}/m2", "--quiet"]) == 2
    assert (
        main(["update", f"{b}/m", f"{b}/new.csv", "--out", f"{b}/m2", "--overwrite", "--quiet"])
        == 0
    )
    assert load_model(f"{b}/m2").cluster_sizes_.sum() == 700
    assert objects(f"{b}/.m2.partial") == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "foo://bkt/in.parquet", "--out", "{b}/out"],
            "foo://bkt/in.parquet: unknown storage scheme foo://",
        ),
        (
            ["run", "s3://no-such-bucket-x/in.parquet", "--out", "{b}/out"],
            "s3://no-such-bucket-x/in.parquet: the bucket 'no-such-bucket-x' does not exist",
        ),
        (["run", "{b}/missing.parquet", "--out", "{b}/out"], "{b}/missing.parquet: no such"),
        (
            ["run", "{b}/in.parquet", "--out", "s3://no-such-bucket-x/out"],
            "--out s3://no-such-bucket-x/out: the bucket 'no-such-bucket-x' does not exist",
        ),
        (
            # refused on request (missing cells are latent by default)
            ["run", "{b}/bad.csv", "--out", "{b}/out", "--missing", "refuse"],
            "{b}/bad.csv: column 'b': row 2 is NaN (missing value)",
        ),
        (
            ["score", "{b}/nomodel", "{b}/in.parquet", "--out", "{b}/out"],
            "model {b}/nomodel: not a committed output",
        ),
    ],
)
def test_bad_urls_exit_2_with_one_line_and_leave_nothing(
    s3_bucket: str, argv: list[str], message: str, capfd
) -> None:
    b = f"s3://{s3_bucket}"
    put_parquet(f"{b}/in.parquet", blobs(300, 0))
    storage.location(f"{b}/bad.csv").write_text("a,b\n1,2\n3,4\n5,\n7,8\n")
    before = objects(b)
    code = main([a.format(b=b) for a in argv] + ["--workers", "1", "--quiet"])
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"dpmm: error: {message.format(b=b)}"), lines
    assert objects(b) == before


def test_missing_credentials_exit_2(s3_bucket: str, monkeypatch, capfd) -> None:
    import s3fs

    b = f"s3://{s3_bucket}"
    put_parquet(f"{b}/in.parquet", blobs(300, 0))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        code = main(["run", f"{b}/in.parquet", "--out", f"{b}/out", "--quiet"])
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"dpmm: error: {b}/in.parquet: no credentials for s3://")


@pytest.mark.parametrize(
    "argv",
    [
        ["cluster", "s3://bkt/in.csv", "--out", "o"],
        ["cluster", "in.csv", "--out", "s3://bkt/o"],
        ["demo", "--out", "s3://bkt/demo"],
    ],
)
def test_local_only_commands_refuse_urls(
    argv: list[str], tmp_path: Path, monkeypatch, capfd
) -> None:
    """Commands that write local directories refuse a URL with one line, writing nothing (not
    a directory named ``s3:``)."""
    monkeypatch.chdir(tmp_path)
    url = next(a for a in argv if "://" in a)
    assert main(argv) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines == [
        f"dpmm: error: {url}: dpmm {argv[0]} reads and writes local paths only (object "
        f"storage URLs: dpmm {', '.join(URL_COMMANDS)})"
    ]
    assert list(tmp_path.iterdir()) == []
