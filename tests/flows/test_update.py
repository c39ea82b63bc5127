"""``dpmm update MODEL INPUT --out NEW_MODEL``: one ASUGS-PM pass of new records into a saved
model (``pipeline.estimators.update``, ``flows.cli.update``), end to end through the model
artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import normalized_mutual_info_score

from flows.cli import main
from pipeline import MAPDP
from pipeline.estimators.model import load_model, save_model
from pipeline.estimators.update import update_model

MEANS = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0], [8.0, 8.0], [-8.0, -8.0]])


def batch(n: int, k: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    X = MEANS[y] + rng.normal(size=(n, 2))
    return pd.DataFrame(X, columns=["a", "b"]), y


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, MAPDP]:
    df, _ = batch(800, 4, 0)
    model = MAPDP(random_state=0).fit(df)
    path = tmp_path / "model"
    save_model(model, path)
    return path, model


def test_update_writes_the_updated_model(saved, tmp_path: Path, capsys) -> None:
    path, _model = saved
    df2, y2 = batch(600, 5, 1)  # a fifth cluster appears
    df2.to_csv(tmp_path / "new.csv", index=False)
    before = sorted(p.name for p in path.iterdir())
    out = tmp_path / "model2"
    assert main(["update", str(path), str(tmp_path / "new.csv"), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "600 records streamed into 4 clusters: 5 clusters now" in said
    assert sorted(p.name for p in path.iterdir()) == before  # MODEL is left as it was
    new = load_model(out)
    want, _ = update_model(load_model(path), df2, random_state=0)
    np.testing.assert_array_equal(new.cluster_stats_, want.cluster_stats_)
    assert new.n_clusters_ == 5 and new.cluster_sizes_.sum() == 1400
    assert new.alpha_ == pytest.approx(want.alpha_, rel=1e-12)
    df3, y3 = batch(300, 5, 2)
    assert normalized_mutual_info_score(y3, new.predict(df3)) > 0.95
    np.testing.assert_allclose(new.score_samples(df3), want.score_samples(df3), rtol=1e-12)
    assert normalized_mutual_info_score(y2, want.labels_) > 0.95
    # another update from the updated model: a model updates any number of times
    out3 = tmp_path / "model3"
    assert main(["update", str(out), str(tmp_path / "new.csv"), "--out", str(out3)]) == 0
    assert load_model(out3).cluster_sizes_.sum() == 2000


def test_update_refuses_bad_input_with_one_line(saved, tmp_path: Path, capsys) -> None:
    path, _ = saved
    df2, _ = batch(100, 4, 3)
    good = tmp_path / "new.csv"
    df2.to_csv(good, index=False)
    out = tmp_path / "model2"

    def refused(argv: list[str], *words: str) -> None:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("dpmm: error:"), err
        for w in words:
            assert w in err, err
        assert not out.exists()

    refused(["update", str(tmp_path / "nope"), str(good), "--out", str(out)], "nope")
    df2[["a"]].to_csv(tmp_path / "narrow.csv", index=False)
    refused(["update", str(path), str(tmp_path / "narrow.csv"), "--out", str(out)], "'b'")
    bad = df2.copy()
    bad["a"] = bad["a"].astype(object)
    bad.loc[7, "a"] = "oops"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    refused(["update", str(path), str(tmp_path / "bad.csv"), "--out", str(out)], "bad.csv", "'a'")
    # NEW_MODEL must never be MODEL itself, with or without --overwrite (pipeline.core.paths)
    refused(["update", str(path), str(good), "--out", str(path)], "is the same as MODEL")
    refused(["update", str(path), str(good), "--out", str(path), "--overwrite"], "same as MODEL")
    refused(["update", str(path), str(good), "--out", str(out), "--lam", "0"], "--lam")


def test_an_asugs_model_saves_loads_and_streams_on(tmp_path: Path, capsys) -> None:
    from pipeline import ASUGS

    df1, _ = batch(600, 4, 4)
    df2, y2 = batch(400, 5, 5)
    live = ASUGS(random_state=0).fit(df1)
    live.save(tmp_path / "a")
    loaded = load_model(tmp_path / "a", expect=ASUGS)
    assert loaded.n_seen_ == 600 and loaded.get_params() == live.get_params()
    np.testing.assert_array_equal(loaded.predict(df2), live.predict(df2))
    np.testing.assert_allclose(loaded.score_samples(df2), live.score_samples(df2), rtol=1e-12)
    loaded.partial_fit(df2)
    assert loaded.n_seen_ == 1000 and loaded.n_clusters_ == 5
    assert normalized_mutual_info_score(y2, loaded.labels_) > 0.95
    # dpmm update on an ASUGS model writes an ASUGS model; the metadata keeps every update
    df2.to_csv(tmp_path / "new.csv", index=False)
    assert (
        main(
            [
                "update",
                str(tmp_path / "a"),
                str(tmp_path / "new.csv"),
                "--out",
                str(tmp_path / "b"),
                "--quiet",
            ]
        )
        == 0
    )
    b = load_model(tmp_path / "b", expect=ASUGS)
    np.testing.assert_array_equal(b.cluster_stats_, loaded.cluster_stats_)
    assert (
        main(
            [
                "update",
                str(tmp_path / "b"),
                str(tmp_path / "new.csv"),
                "--out",
                str(tmp_path / "c"),
                "--quiet",
            ]
        )
        == 0
    )
    c = load_model(tmp_path / "c")
    assert [u["records"] for u in c.model_metadata_["updates"]] == [400, 400]
    assert c.n_seen_ == 1400
