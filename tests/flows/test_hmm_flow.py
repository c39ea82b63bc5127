"""The Prefect ``hmm`` flow and ``dpmm hmm`` end to end (MAP-iHMM over many sequences), under
``prefect_test_harness``: every output, the per-sequence held-out log likelihood against the
estimator's forward algorithm, and bad input (exit status 2, one line naming row and column,
nothing left behind)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import normalized_mutual_info_score

from flows.cli import main
from flows.hmm import hmm
from pipeline.core.paths import temp_sibling
from tests.pipeline.engines.test_ihmm_engine import sequences_frame

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


def write_sequences(path: Path, n: int = 2400, seed: int = 1) -> tuple[pd.DataFrame, np.ndarray]:
    df, z = sequences_frame(n, seed=seed)
    df["t"] = (np.arange(n) % 40) * 1.5
    # sequences interleaved in the file, each in time order
    order = np.lexsort((df.seq.to_numpy(), df.t.to_numpy()))
    df, z = df.iloc[order].reset_index(drop=True), z[order]
    df.to_csv(path, index=False)
    return df, z


def test_flow_writes_every_output(tmp_path: Path) -> None:
    df, z = write_sequences(tmp_path / "in.csv")
    out = tmp_path / "out"
    run = hmm(
        str(tmp_path / "in.csv"),
        str(out),
        "seq",
        "t",
        chunk_rows=800,
        holdout=0.2,
        prior_scale=0.1,
        **LOCAL,
    )
    assert not temp_sibling(out).exists()
    for name in (
        "rows.parquet",
        "sequences.parquet",
        "states.parquet",
        "transitions.csv",
        "run.json",
        "report.html",
        "report.md",
    ):
        assert (out / name).exists(), name
    for pic in ("sequences.png", "transitions.png", "sizes.png"):
        assert (out / pic).stat().st_size > 1000
    rows = pd.read_parquet(out / "rows.parquet")
    assert len(rows) == len(df)
    np.testing.assert_array_equal(rows.seq.to_numpy(), df.seq.to_numpy())
    assert np.isfinite(rows.log_density).all()
    assert normalized_mutual_info_score(z, rows.state) > 0.9
    # training rows are decoded under the final model as held-out rows are, not left at the
    # sweep's labels: their NMI is not below the held-out rows'
    held_rows = rows.heldout.to_numpy()
    nmi_train = normalized_mutual_info_score(z[~held_rows], rows.state[~held_rows])
    nmi_held = normalized_mutual_info_score(z[held_rows], rows.state[held_rows])
    assert nmi_train >= nmi_held - 0.02, (nmi_train, nmi_held)
    seqs = pd.read_parquet(out / "sequences.parquet")
    assert len(seqs) == df.seq.nunique() and 0 < seqs.heldout.sum() < len(seqs)
    assert seqs.length.sum() == len(df)
    saved = json.loads((out / "run.json").read_text())
    m = saved["metrics"]
    assert (
        m["n_states"] == run["metrics"]["n_states"] == len(pd.read_parquet(out / "states.parquet"))
    )
    held = seqs[seqs.heldout]
    assert m["heldout_log_likelihood"] == pytest.approx(held.log_likelihood.sum())
    trans = pd.read_csv(out / "transitions.csv", index_col=0)
    np.testing.assert_allclose(trans.to_numpy().sum(axis=1), 1.0)
    assert len(saved["passes"]) == m["passes"]
    assert saved["parameters"]["prior_scale"] == 0.1
    # emissions independent given the state: the sample start's rho is not significant
    assert saved["parameters"]["temper"] == "auto" and saved["temper"]["w"] == 1.0
    # OUT/model: the final MAP model; its Viterbi labels and forward log likelihoods are the
    # write-out's
    from pipeline import MAPiHMM, load_model

    model = load_model(out / "model", expect=MAPiHMM)
    assert model.engine_ == "ihmm" and model.prior_scale == 0.1 and model.temper_ == 1.0
    assert model.n_states_ == m["n_states"]
    feats = df.drop(columns=["t"])
    np.testing.assert_array_equal(
        model.predict(feats, sequence_column="seq", time_column=None), rows.state.to_numpy()
    )
    ll = model.score_samples(feats, sequence_column="seq")
    np.testing.assert_allclose(ll, seqs.log_likelihood.to_numpy(), rtol=1e-9)


def test_cli_prior_scale_is_checked(capsys) -> None:
    assert (
        main(
            [
                "hmm",
                "x.csv",
                "--sequence-column",
                "s",
                "--time-column",
                "t",
                "--out",
                "o",
                "--prior-scale",
                "1",
            ]
        )
        == 2
    )
    assert "a number in (0, 1)" in capsys.readouterr().err


def base_frame() -> pd.DataFrame:
    df, _ = sequences_frame(200, seed=0)
    df["t"] = (np.arange(200) % 40) * 1.0
    return df


def edit(df: pd.DataFrame, col: str, row: int, value: object) -> pd.DataFrame:
    df = df.astype({col: object}) if value is None or isinstance(value, str) else df.copy()
    df.loc[row, col] = value
    return df


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (lambda: edit(base_frame(), "t", 45, 2.0), ["'t'", "row 45", "backwards"]),
        (lambda: edit(base_frame(), "t", 45, 4.0), ["'t'", "row 45", "duplicated"]),
        (lambda: edit(base_frame(), "seq", 12, None), ["'seq'", "row 12", "missing"]),
        (lambda: edit(base_frame(), "t", 7, None), ["'t'", "row 7", "missing"]),
        (lambda: edit(base_frame(), "a", 30, np.nan), ["'a'", "30"]),
        (lambda: base_frame().drop(columns="t"), ["--time-column", "'t'"]),
    ],
    ids=["unsorted-time", "duplicated-time", "missing-id", "missing-time", "nan", "no-column"],
)
def test_bad_input_exits_2_and_leaves_nothing(tmp_path: Path, capsys, frame, words) -> None:
    path = tmp_path / "in.csv"
    frame().to_csv(path, index=False)
    out = tmp_path / "out"
    argv = [
        "hmm",
        str(path),
        "--sequence-column",
        "seq",
        "--time-column",
        "t",
        "--out",
        str(out),
        "--workers",
        "1",
        "--quiet",
    ]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dpmm: error:"), err
    for w in words:
        assert w in err[0], (w, err[0])
    assert not out.exists() and not temp_sibling(out).exists()


def beavers(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    """tests/data/seq_beavers.csv without its ``label`` (two beavers as two sequences)."""
    df = pd.read_csv(Path(__file__).parents[1] / "data" / "seq_beavers.csv", comment="#")
    path = tmp_path / "beavers.csv"
    df.drop(columns=["label"]).to_csv(path, index=False)
    return path, df


def test_flow_tempers_a_real_sequence_as_the_estimator(tmp_path: Path) -> None:
    """Issue 36: on the beavers' temperatures (autocorrelated within their states) ``dpmm hmm``
    with its defaults finds what ``MAPiHMM()`` in memory finds (2 states, NMI 0.704; untempered,
    the flow found 5 states, NMI 0.436): the sample start measures rho, the passes and the
    write-out weigh the emissions by w, and OUT/model decodes with the same w."""
    from pipeline import MAPiHMM, load_model

    path, df = beavers(tmp_path)
    out = tmp_path / "out"
    run = hmm(str(path), str(out), "beaver", "t", report=False, **LOCAL)
    m = MAPiHMM(random_state=0).fit(
        df[["beaver", "t", "temp"]], sequence_column="beaver", time_column="t"
    )
    rows = pd.read_parquet(out / "rows.parquet")
    assert run["metrics"]["n_states"] == m.n_states_ == 2
    assert normalized_mutual_info_score(df.label, rows.state) >= 0.65
    saved = json.loads((out / "run.json").read_text())
    assert saved["temper"]["w"] == pytest.approx(m.temper_, rel=1e-12) and m.temper_ < 0.5
    assert saved["temper"]["rho"] == pytest.approx(m.residual_autocorrelation_, rel=1e-12)
    model = load_model(out / "model", expect=MAPiHMM)
    assert model.temper_ == saved["temper"]["w"]
    feats = df[["beaver", "t", "temp"]]
    np.testing.assert_array_equal(
        model.predict(feats, sequence_column="beaver", time_column="t"), rows.state.to_numpy()
    )
    seqs = pd.read_parquet(out / "sequences.parquet")
    np.testing.assert_allclose(
        model.score_samples(feats, sequence_column="beaver", time_column="t"),
        seqs.log_likelihood.to_numpy(),
        rtol=1e-9,
    )


def test_cli_temper_1_keeps_the_untempered_run(tmp_path: Path) -> None:
    """``--temper 1``: today's untempered run (5 states, NMI 0.436 on the beavers before
    issue 36's tempering reached ``dpmm hmm``), w = 1 in run.json and the model."""
    from pipeline import MAPiHMM, load_model

    path, df = beavers(tmp_path)
    out = tmp_path / "out"
    argv = ["hmm", str(path), "--sequence-column", "beaver", "--time-column", "t"]
    argv += ["--out", str(out), "--temper", "1", "--workers", "1", "--quiet", "--no-report"]
    assert main(argv) == 0
    saved = json.loads((out / "run.json").read_text())
    assert saved["temper"] == {"w": 1.0, "rho": None} and saved["parameters"]["temper"] == 1.0
    rows = pd.read_parquet(out / "rows.parquet")
    assert saved["metrics"]["n_states"] == 5
    assert normalized_mutual_info_score(df.label, rows.state) == pytest.approx(0.4361, abs=1e-4)
    assert load_model(out / "model", expect=MAPiHMM).temper_ == 1.0


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "on"])
def test_cli_temper_is_checked(capsys, bad: str) -> None:
    argv = ["hmm", "x.csv", "--sequence-column", "s", "--time-column", "t", "--out", "o"]
    assert main([*argv, "--temper", bad]) == 2
    assert "--temper" in capsys.readouterr().err
