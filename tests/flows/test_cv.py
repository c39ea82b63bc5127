"""The Prefect ``cv`` flow and ``dpmm cv``: outputs against a serial reference over the store's
folds, resume after a crash, bad input (exit status 2, one line, nothing left behind)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cli import main
from flows.cv import run_cv_flow
from pipeline.core.paths import temp_sibling
from pipeline.data.store import Store
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.model import load_model
from pipeline.ops import cv as pcv

pytestmark = pytest.mark.usefixtures("prefect_harness")


def write_blobs(path: Path, n: int = 240, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    means = np.array([[0.0, 0.0, 0.0], [8.0, 0.0, 0.0], [0.0, 8.0, 0.0]])
    X = means[y] + rng.normal(size=(n, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["truth"] = y
    df.to_csv(path, index=False)
    return y


GRID = {"alphas": [0.1, 3.0], "scales": [0.3, 0.05], "families": ["gaussian", "diag-gaussian"]}
LOCAL = {"processes": False, "n_workers": 2, "progress": False, "label_column": "truth"}


def test_cv_flow_outputs_and_reference(tmp_path: Path) -> None:
    y = write_blobs(tmp_path / "in.csv")
    out = tmp_path / "out"
    run = run_cv_flow(
        input=str(tmp_path / "in.csv"),
        out=str(out),
        n_folds=4,
        data_dir=str(tmp_path / "d"),
        **GRID,
        **LOCAL,
    )
    assert not temp_sibling(out).exists()
    for name in ("cv.parquet", "cv.png", "cv.json"):
        assert (out / name).exists(), name
    table = pd.read_parquet(out / "cv.parquet")
    assert len(table) == 8 and table["chosen"].sum() == 1
    assert run["fits_run"] == 32 and run["fits_reused"] == 0
    # the serial reference: each cell's fold fits by hand over the store's own folds
    store = Store(run["dataset"]["path"])
    info = store.info
    X = np.asarray(store.array("X")[:])
    fold = np.asarray(store.array("fold")[:])
    assert sorted(np.unique(fold)) == [0, 1, 2, 3]
    row = table.iloc[5]
    params = {k: row[k] for k in ("family", "prior_scale", "alpha")}
    scores = []
    for j in range(4):
        est = pcv.estimator(info, params, 0, 100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(pd.DataFrame(X[fold != j], columns=info.names))
        scores.append(est.score(pd.DataFrame(X[fold == j], columns=info.names)))
    np.testing.assert_allclose([row[f"fold{j}_log_density"] for j in range(4)], scores, rtol=1e-12)
    assert row["mean_log_density"] == pytest.approx(np.mean(scores))
    assert row["se_log_density"] == pytest.approx(np.std(scores, ddof=1) / 2)
    # the choice is the largest mean; the refit recovers the three blobs
    best = int(np.argmax(table["mean_log_density"]))
    assert bool(table["chosen"].iloc[best])
    cvj = json.loads((out / "cv.json").read_text())
    assert cvj["chosen"]["family"] == table["family"].iloc[best]
    assert cvj["metrics"]["nmi"] > 0.9
    assert cvj["timing"]["fits_sum"] > 0
    # the refit is MAP-DP of the chosen cell on all the records
    ref = MAPDP(
        **{k: cvj["chosen"][k] for k in ("alpha", "prior_scale")},
        family=pcv.family_spec(info, cvj["chosen"]["family"]),
        random_state=0,
    ).fit(pd.DataFrame(X, columns=info.names))
    assert cvj["metrics"]["n_clusters"] == ref.n_clusters_
    # ... written as a model artifact that loads into the same model
    assert cvj["model"]["artifact"] == "model"
    loaded = load_model(out / "model")
    Xdf = pd.DataFrame(X, columns=info.names)[list(info.schema.columns)]
    np.testing.assert_array_equal(loaded.predict(Xdf), ref.predict(Xdf))
    np.testing.assert_allclose(loaded.score_samples(Xdf), ref.score_samples(Xdf), rtol=1e-12)
    assert len(y) == info.n_rows


def test_cv_resumes_after_a_crash(tmp_path: Path, crash_after_fits) -> None:
    write_blobs(tmp_path / "in.csv", seed=1)
    kw = dict(input=str(tmp_path / "in.csv"), n_folds=3, data_dir=str(tmp_path / "d"))
    grid = {"alphas": [0.5, 5.0], "scales": [0.2], "families": ["gaussian"]}
    full = run_cv_flow(out=str(tmp_path / "ref"), **kw, **grid, **LOCAL)
    assert full["fits_run"] == 6
    out = tmp_path / "out"
    with crash_after_fits(2):
        run_cv_flow(out=str(out), **kw, **grid, **LOCAL)
    assert not out.exists()
    done = list((temp_sibling(out) / "fits").glob("*.json"))
    assert len(done) >= 2
    run = run_cv_flow(out=str(out), **kw, **grid, **LOCAL)
    assert run["resumed"] and run["fits_reused"] == len(done) and run["fits_run"] == 6 - len(done)
    a = pd.read_parquet(tmp_path / "ref" / "cv.parquet")
    b = pd.read_parquet(out / "cv.parquet")
    for col in ("mean_log_density", "se_log_density", "n_clusters", "fold2_log_density"):
        np.testing.assert_array_equal(a[col], b[col])
    assert run["chosen"] == full["chosen"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--alpha", "1,0"], "--alpha 0.0: a concentration must be > 0"),
        (["--alpha", "-2"], "a concentration must be > 0"),
        (["--prior-scale", "0.1,0"], "--prior-scale 0.0: prior_scale must be in (0, 1)"),
        (["--prior-scale", "1.5"], "prior_scale must be in (0, 1)"),
        (["--family", "poisson"], "--family 'poisson': choose among gaussian, diag-gaussian"),
        (["--folds", "1"], "--folds 1: at least 2 folds are needed"),
        (["--alpha", ""], "expected comma-separated numbers"),
        (["--folds", "500"], "--folds 500: more folds than records (240)"),
    ],
)
def test_cli_bad_input(tmp_path: Path, capsys, argv, message) -> None:
    write_blobs(tmp_path / "in.csv")
    out = tmp_path / "out"
    code = main(
        [
            "cv",
            str(tmp_path / "in.csv"),
            "--out",
            str(out),
            "--workers",
            "1",
            "--quiet",
            "--data-dir",
            str(tmp_path / "d"),
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("dpmm")]
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists() and not temp_sibling(out).exists()


def test_cli_missing_input(tmp_path: Path, capsys) -> None:
    code = main(["cv", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    assert "nope.csv" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
