"""``dpmm score`` (the ``score`` flow) and ``dpmm run --warm-start``: a run's model labels and
scores a new day's records exactly as ``MAPDP.predict`` / ``score_samples``; bad records, a
damaged model and a model of other columns are refused with one line and nothing left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from flows.cli import main
from flows.cluster import cluster
from flows.score import score
from pipeline.estimators.model import load_model
from tests.flows.test_run_model import write_mixed

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


@pytest.fixture(scope="module")
def day1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run on day 1's records; its OUT."""
    d = tmp_path_factory.mktemp("day1")
    write_mixed(d / "in.csv", 1500, 0)
    cluster(
        str(d / "in.csv"), str(d / "out"), chunk_rows=300, random_state=1, report=False, **LOCAL
    )
    return d / "out"


def _nothing_left(out: Path) -> None:
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))


def test_score_flow_is_the_models_predictive(day1: Path, tmp_path: Path) -> None:
    df = write_mixed(tmp_path / "day2.csv", 700, 1)
    out = tmp_path / "scored"
    rec = score(str(day1 / "model"), str(tmp_path / "day2.csv"), str(out), chunk_rows=200, **LOCAL)
    model = load_model(day1 / "model")
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    np.testing.assert_array_equal(label, model.predict(df))
    np.testing.assert_array_equal(logd, model.score_samples(df))
    assert rec["n_rows"] == 700 and rec["metrics"]["new_cluster"] == int((label < 0).sum())
    assert rec["metrics"]["mean_log_density"] == pytest.approx(logd.mean())
    assert json.loads((out / "score.json").read_text())["n_clusters"] == model.n_clusters_
    # the encoded copy of the input is not an output
    assert sorted(p.name for p in out.iterdir()) == ["labels.zarr", "score.json"]
    assert not list(tmp_path.glob(".scored.*"))


def test_dpmm_score_cli(day1: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    df = write_mixed(tmp_path / "day2.csv", 500, 2)
    df.to_parquet(tmp_path / "day2.parquet")
    out = tmp_path / "scored"
    argv = ["score", str(day1 / "model"), str(tmp_path / "day2.parquet"), "--out", str(out)]
    assert main([*argv, "--workers", "1", "--quiet", "--chunk-rows", "128"]) == 0
    model = load_model(day1 / "model")
    np.testing.assert_array_equal(
        zarr.open_array(str(out / "labels.zarr/log_density"))[:], model.score_samples(df)
    )
    capfd.readouterr()
    # an existing OUT is refused, and replaced with --overwrite
    assert main([*argv, "--workers", "1", "--quiet"]) == 2
    assert "already exists" in capfd.readouterr().err
    assert main([*argv, "--workers", "1", "--quiet", "--overwrite"]) == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda df: df.drop(columns=["b"]),
            "the columns differ from those the model was fitted with: missing ['b']",
        ),
        (
            lambda df: df.assign(a=df["a"].astype(object).where(df.index != 7, "twelve")),
            "column 'a': row 7 (line 9) has 'twelve', which is not a number",
        ),
        (
            lambda df: df.assign(shop=df["shop"].where(df.index != 5, "harbour")),
            "column 'shop': row 5 (line 7) has category 'harbour', not one of the 4 categories "
            "seen in fit",
        ),
    ],
    ids=["missing-column", "other-kind", "unseen-category"],
)
def test_score_refuses_bad_records(
    day1: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], edit, message: str
) -> None:
    df = write_mixed(tmp_path / "ok.csv", 300, 3)
    edit(df).to_csv(tmp_path / "bad.csv", index=False)
    out = tmp_path / "scored"
    argv = ["score", str(day1 / "model"), str(tmp_path / "bad.csv"), "--out", str(out)]
    assert main([*argv, "--workers", "1", "--quiet"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert err == [f"dpmm: error: {tmp_path / 'bad.csv'}: {message}"], err
    _nothing_left(out)


def test_score_refuses_a_damaged_model(
    day1: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    write_mixed(tmp_path / "day2.csv", 100, 4)
    shutil.copytree(day1 / "model", tmp_path / "model")
    (tmp_path / "model" / "model.json").write_text("{not json")
    out = tmp_path / "scored"
    argv = ["score", str(tmp_path / "model"), str(tmp_path / "day2.csv"), "--out", str(out)]
    assert main([*argv, "--workers", "1", "--quiet"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and f"{tmp_path / 'model' / 'model.json'}: not valid JSON" in err[0]
    _nothing_left(out)


def test_warm_start_starts_from_the_models_clusters(day1: Path, tmp_path: Path) -> None:
    write_mixed(tmp_path / "day2.csv", 1500, 5)
    args = {"chunk_rows": 300, "random_state": 2, "report": False, **LOCAL}
    cold = cluster(str(tmp_path / "day2.csv"), str(tmp_path / "cold"), **args)
    warm = cluster(
        str(tmp_path / "day2.csv"), str(tmp_path / "warm"), warm_start=str(day1 / "model"), **args
    )
    model = load_model(day1 / "model")
    assert warm["init"]["init"] == "warm" and warm["init"]["n_clusters"] == model.n_clusters_
    assert warm["parameters"]["warm_start"] == str(day1 / "model")
    # the same four clusters: the warm start has nothing left to find
    assert warm["metrics"]["n_clusters"] == cold["metrics"]["n_clusters"] == 4
    # pass 1 assigns every record against the model's clusters, pass 2 finds nothing to move
    assert warm["metrics"]["passes"] <= 2 and warm["metrics"]["converged"]
    refit = load_model(tmp_path / "warm" / "model")
    # the model's encoders and prior are kept
    assert refit.schema_ == model.schema_
    assert refit.family_.signature() == model.family_.signature()


def test_warm_start_refuses_other_columns(
    day1: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    df = write_mixed(tmp_path / "day2.csv", 300, 6)
    df.rename(columns={"c": "z"}).to_csv(tmp_path / "other.csv", index=False)
    out = tmp_path / "out"
    argv = ["run", str(tmp_path / "other.csv"), "--out", str(out), "--warm-start"]
    assert main([*argv, str(day1 / "model"), "--workers", "1", "--quiet"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert err == [
        f"dpmm: error: {tmp_path / 'other.csv'}: the columns differ from those the model was "
        "fitted with: missing ['c']; unexpected ['z']"
    ], err
    _nothing_left(out)
    assert main([*argv, str(tmp_path / "nothing"), "--workers", "1", "--quiet"]) == 2
    assert "no such model directory" in capfd.readouterr().err
    _nothing_left(out)
    assert main([*argv, str(day1 / "model"), "--family", "gaussian", "--quiet"]) == 2
    assert "the model's family and prior are used" in capfd.readouterr().err
    _nothing_left(out)


def test_score_records_with_missing_cells(tmp_path: Path) -> None:
    """A model fitted in memory on a real table with holes (``missing="latent"``) scores a file
    with holes through the flow exactly as ``predict`` / ``score_samples``: each record on the
    cells it has (issue 36)."""
    import pandas as pd

    from pipeline.estimators.mapdp import MAPDP

    src = Path(__file__).resolve().parents[1] / "data" / "real" / "clust_housevotes84.csv"
    df = pd.read_csv(src).drop(columns=["label"])
    model = MAPDP(random_state=0, n_restarts=1).fit(df)
    model.save(tmp_path / "model")
    df.to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "scored"
    score(str(tmp_path / "model"), str(tmp_path / "in.csv"), str(out), chunk_rows=200, **LOCAL)
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    np.testing.assert_array_equal(label, model.predict(df))
    np.testing.assert_allclose(logd, model.score_samples(df), rtol=1e-12)
