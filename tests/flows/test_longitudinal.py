"""The Prefect ``longitudinal`` flow and ``dpmm longitudinal`` end to end, under
``prefect_test_harness``: outputs, cross-validation over subjects, agreement with the in-memory
estimator, bad input (exit status 2, one line, nothing left behind)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import normalized_mutual_info_score

from flows.cli import main
from flows.longitudinal import longitudinal
from pipeline import MixedEffectsDP
from pipeline.data.synthetic import sample_longitudinal
from pipeline.estimators.model import load_model

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}
ARGS = ["--subject", "subject", "--response", "qol", "--covariates", "depression,adl"]


def write_input(path: Path, n: int = 400, seed: int = 3) -> pd.DataFrame:
    df = sample_longitudinal(n, seed=seed)
    df.to_csv(path, index=False)
    return df


def test_flow_writes_every_output_and_cross_validates(tmp_path: Path) -> None:
    df = write_input(tmp_path / "in.csv")
    out = tmp_path / "out"
    run = longitudinal(
        str(tmp_path / "in.csv"),
        str(out),
        "subject",
        "qol",
        ["depression", "adl"],
        time_column="wave",
        folds=3,
        chunk_rows=400,
        **LOCAL,
    )
    assert not list(out.parent.glob(f".{out.name}.*"))
    names = ("subjects.parquet", "clusters.parquet", "run.json", "report.md", "report.html")
    for name in names:
        assert (out / name).exists(), name
    for pic in ("trajectories.png", "random_effects.png", "sizes.png", "objective.png"):
        assert (out / pic).stat().st_size > 1000, pic
    assert not list(out.glob("*.zarr"))
    subjects = pd.read_parquet(out / "subjects.parquet")
    assert len(subjects) == 400 and subjects["subject"].tolist() == list(range(400))
    cols = ["beta_intercept", "beta_wave", "beta_depression", "beta_adl"]
    assert np.isfinite(subjects[cols].to_numpy()).all()
    truth = df.groupby("subject")["subgroup"].first().to_numpy()
    assert normalized_mutual_info_score(truth, subjects["cluster"]) > 0.8
    # every subject is held out exactly once
    assert np.isfinite(subjects["heldout_log_density"]).all()
    cv = run["cv"]
    assert cv["folds"] == 3 and cv["n_subjects"] == 400
    assert cv["mean_heldout_log_density"] == pytest.approx(subjects["heldout_log_density"].mean())
    assert cv["se"] == pytest.approx(subjects["heldout_log_density"].std() / np.sqrt(400))
    clusters = pd.read_parquet(out / "clusters.parquet")
    assert clusters["size"].sum() == 400
    assert {"mean_intercept", "cov_intercept_wave", "cov_adl_adl"} <= set(clusters.columns)
    on_disk = json.loads((out / "run.json").read_text())
    assert on_disk["metrics"]["n_clusters"] == len(clusters) == len(on_disk["clusters"])
    e = [h["objective"] for h in on_disk["history"]]
    assert all(b <= a + 1e-9 * abs(a) for a, b in itertools.pairwise(e))
    # the prior's shrink and its held-out evidence, in run.json and the report
    shrink = on_disk["metrics"]["shrink"]
    assert shrink["subjects"] == 400 and set(shrink["heldout"]) == {"10.0", "3.0", "1.5"}
    said = f"- **prior shrink**: {shrink['chosen']:g}, by held-out log density per subject of 400"
    assert said in (out / "report.md").read_text()


def test_the_distributed_fit_equals_the_in_memory_one(tmp_path: Path) -> None:
    """One chunk holds every subject: the engine's passes are the estimator's, number for
    number (subject ids sorted, so both number the subjects alike)."""
    df = write_input(tmp_path / "in.csv", n=300, seed=4)
    out = tmp_path / "out"
    run = longitudinal(
        str(tmp_path / "in.csv"),
        str(out),
        "subject",
        "qol",
        ["wave", "depression", "adl"],
        chunk_rows=10_000,
        **LOCAL,
    )
    m = MixedEffectsDP().fit(df[["wave", "depression", "adl"]], df["qol"], df["subject"])
    subjects = pd.read_parquet(out / "subjects.parquet")
    np.testing.assert_array_equal(subjects["cluster"], m.labels_)
    beta = subjects[["beta_intercept", "beta_wave", "beta_depression", "beta_adl"]].to_numpy()
    np.testing.assert_allclose(beta, m.random_effects_, rtol=1e-9, atol=1e-9)
    assert run["metrics"]["noise_precision"] == pytest.approx(m.noise_precision_, rel=1e-12)
    # the prior's shrink chosen alike, on the same evidence (``choose_shrink``)
    assert json.loads((out / "run.json").read_text())["metrics"]["shrink"] == m.shrink_evidence_
    assert [h["objective"] for h in run["history"]] == pytest.approx(
        m.objective_history_, rel=1e-12
    )
    np.testing.assert_allclose(
        subjects["log_density"],
        m.score_samples(df[["wave", "depression", "adl"]], df["qol"], df["subject"]),
        rtol=1e-9,
    )
    # OUT/model is the run's fit: it scores and places the training subjects as the run did
    saved = load_model(out / "model", expect=MixedEffectsDP)
    assert saved.engine_ == "mixed_effects" and saved.n_iter_ == run["metrics"]["passes"]
    args = (df[["wave", "depression", "adl"]], df["qol"], df["subject"])
    np.testing.assert_allclose(saved.score_samples(*args), subjects["log_density"], rtol=1e-9)
    np.testing.assert_array_equal(saved.predict(*args), m.predict(*args))
    assert saved.noise_precision_ == pytest.approx(m.noise_precision_, rel=1e-12)


@pytest.mark.parametrize(
    ("edit", "extra", "message"),
    [
        (None, ["--subject", "id"], "no subject column 'id'"),
        (None, ["--covariates", "depression,qol"], "'qol' is both the response and a covariate"),
        (
            lambda d: d.assign(adl=d.adl.astype(object).where(d.index != 6, "abc")),
            [],
            "covariate 'adl', row 6: 'abc' is not a finite number",
        ),
        (lambda d: d.assign(qol=d.qol.where(d.index != 9)), [], "response 'qol', row 9: missing"),
        (lambda d: d.assign(adl=2.0), [], "covariate 'adl' is constant"),
        (
            lambda d: d.assign(adl=(d.subject % 3).astype(float)),
            [],
            "covariate 'adl' does not vary within any subject: a subject-level covariate",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    tmp_path: Path, capsys, edit, extra: list[str], message: str
) -> None:  # type: ignore[no-untyped-def]
    df = sample_longitudinal(30, seed=5)
    if edit is not None:
        df = edit(df.reset_index(drop=True))
    df.to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "out"
    args = ["longitudinal", str(tmp_path / "in.csv"), *ARGS, "--out", str(out), "--workers", "1"]
    for i in range(0, len(extra), 2):
        j = args.index(extra[i])
        args[j + 1] = extra[i + 1]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dpmm: error: ") and message in err[0], err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))


def test_cli_runs_and_reports(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_input(tmp_path / "in.csv", n=200, seed=6)
    out = tmp_path / "out"
    code = main(
        [
            "longitudinal",
            str(tmp_path / "in.csv"),
            *ARGS,
            "--time",
            "wave",
            "--out",
            str(out),
            "--workers",
            "1",
            "--chunk-rows",
            "300",
            "--shrink",
            "3",
        ]
    )
    assert code == 0
    said = capsys.readouterr().out
    assert "200 subjects" in said and str(out) in said
    run = json.loads((out / "run.json").read_text())
    assert run["parameters"]["covariates"] == ["wave", "depression", "adl"]
    # a given shrink is the prior's, not compared, as MixedEffectsDP(shrink=3.0)'s
    assert run["parameters"]["shrink"] == 3.0 and run["metrics"]["shrink"] == {"chosen": 3.0}
    assert load_model(out / "model", expect=MixedEffectsDP).get_params()["shrink"] == 3.0
    bad = ["longitudinal", str(tmp_path / "in.csv"), *ARGS, "--out", str(tmp_path / "o2")]
    assert main([*bad, "--shrink", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "argument --shrink: expected 'auto' or a number > 1, got '1'" in err[0]
    assert not (tmp_path / "o2").exists()
    # an existing output is refused unless --overwrite
    assert main(["longitudinal", str(tmp_path / "in.csv"), *ARGS, "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
