"""``dpmm run`` and ``dpmm score`` on a table with missing cells and a constant column (issue
36): the run fills the holes in its passes, drops the constant column and records both in
run.json and the model, and ``dpmm score`` of its model drops the column too and scores records
with holes on their observed cells, as ``MAPDP.score_samples``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main
from flows.cluster import cluster
from flows.score import score
from pipeline.core.paths import temp_sibling
from pipeline.estimators.model import load_model
from tests.flows.test_run_model import write_mixed

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


def write_holed(path: Path, n: int, seed: int) -> pd.DataFrame:
    """``write_mixed``'s table with a constant column and 10% of the numeric cells missing;
    the true cluster as ``truth``."""
    df = write_mixed(path, n, seed)
    rng = np.random.default_rng(seed + 10)
    num = df[["a", "b", "c"]].to_numpy(copy=True)
    df["truth"] = np.argmax(np.column_stack([np.full(n, 5.0), num]), axis=1)
    num[rng.random(num.shape) < 0.1] = np.nan
    df[["a", "b", "c"]] = num
    df.insert(1, "flat", 7.0)
    df.to_csv(path, index=False)
    return df


def test_run_and_score_with_holes_and_a_constant_column(tmp_path: Path) -> None:
    df = write_holed(tmp_path / "in.csv", 1200, 0)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"),
        str(out),
        chunk_rows=300,
        holdout=0.2,
        random_state=1,
        label_column="truth",
        report=True,
        **LOCAL,
    )
    assert run["dropped_constant_columns"] == {"flat": 7.0}
    assert set(run["missing_cells"]) == {"a", "b", "c"}
    assert run["metrics"]["nmi"] > 0.85
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    assert np.isfinite(logd).all()
    model = load_model(out / "model")
    assert model.schema_.dropped == {"flat": 7.0}
    X = df.drop(columns=["truth"])
    # the run's write-out is the model's predictive, holes included
    np.testing.assert_allclose(logd, model.score_samples(X), rtol=1e-10)
    # dpmm score: the constant column dropped (even where a new day's value differs), the
    # records with holes scored on their observed cells
    day2 = write_holed(tmp_path / "day2.csv", 400, 1).drop(columns=["truth"])
    day2.loc[3, "flat"] = 8.0
    day2.to_csv(tmp_path / "day2.csv", index=False)
    scored = tmp_path / "scored"
    score(str(out / "model"), str(tmp_path / "day2.csv"), str(scored), chunk_rows=150, **LOCAL)
    got = zarr.open_array(str(scored / "labels.zarr/log_density"))[:]
    np.testing.assert_array_equal(got, model.score_samples(day2))
    assert np.isnan(day2[["a", "b", "c"]].to_numpy()).any(axis=1).sum() > 50


def test_strict_and_missing_refuse_exit_2_with_one_line(tmp_path: Path, capfd) -> None:
    write_holed(tmp_path / "in.csv", 300, 2)
    out = tmp_path / "out"
    base = ["run", str(tmp_path / "in.csv"), "--out", str(out), "--workers", "1", "--quiet"]
    base += ["--label-column", "truth"]
    for extra, words in (
        (["--strict", "--missing", "refuse"], ["is NaN", "--missing refuse"]),
        (["--strict"], ["column 'flat' is constant"]),
        (["--engine", "kmeans"], ["column", "(NaN)", "--engine mapdp"]),
    ):
        assert main([*base, *extra]) == 2
        err = capfd.readouterr().err.splitlines()
        assert len(err) == 1 and all(w in err[0] for w in words), err
        assert not out.exists() and not temp_sibling(out).exists()
    # run.json records the options
    assert main([*base]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["parameters"]["missing"] == "latent" and not run["parameters"]["strict"]


def test_cv_with_holes_and_a_constant_column(tmp_path: Path) -> None:
    """``dpmm cv``: the constant column dropped at ingest, every fold fitted with the missing
    cells latent and scored on the held-out records' observed cells (the serial reference:
    ``MAPDP.score`` over the store's own folds)."""
    import warnings

    from flows.cv import run_cv_flow
    from pipeline.data.store import Store
    from pipeline.ops import cv as pcv

    write_holed(tmp_path / "in.csv", 300, 3)
    grid = {"alphas": [1.0], "scales": [0.3], "families": ["gaussian"]}
    run = run_cv_flow(
        input=str(tmp_path / "in.csv"),
        out=str(tmp_path / "out"),
        n_folds=2,
        data_dir=str(tmp_path / "d"),
        label_column="truth",
        **grid,
        **{k: v for k, v in LOCAL.items() if k != "dashboard_address"},
    )
    table = pd.read_parquet(tmp_path / "out" / "cv.parquet")
    store = Store(run["dataset"]["path"])
    info = store.info
    assert info.schema.dropped == {"flat": 7.0} and info.first_missing is not None
    X = np.asarray(store.array("X")[:])
    fold = np.asarray(store.array("fold")[:])
    params = {k: table.iloc[0][k] for k in ("family", "prior_scale", "alpha")}
    for j in range(2):
        est = pcv.estimator(info, params, 0, 100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(pcv._frame(X[fold != j], info))
        want = est.score(pcv._frame(X[fold == j], info))
        assert np.isfinite(want)
        assert table.iloc[0][f"fold{j}_log_density"] == pytest.approx(want, rel=1e-12)
    assert "flat" not in load_model(tmp_path / "out" / "model").schema_.features
