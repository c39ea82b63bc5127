"""Every ``dpmm run`` writes ``OUT/model/``: a MAPDP whose predict / score_samples are the run's
write-out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cluster import cluster
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.model import load_model

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}


def write_mixed(path: Path, n: int, seed: int) -> pd.DataFrame:
    """Three Gaussian columns and a text column whose levels depend on the cluster."""
    rng = np.random.default_rng(seed)
    means = 10.0 * np.vstack([np.zeros(3), np.eye(3)])
    y = rng.integers(0, 4, size=n)
    df = pd.DataFrame(means[y] + rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    shop = np.array(["north", "south", "east", "west"])
    df["shop"] = np.where(rng.random(n) < 0.8, shop[y], shop[rng.integers(0, 4, size=n)])
    df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("summaries", [0, 30])
def test_run_writes_a_model_that_scores_as_the_write_out(tmp_path: Path, summaries: int) -> None:
    df = write_mixed(tmp_path / "in.csv", 1200, 0)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.csv"),
        str(out),
        chunk_rows=300,
        holdout=0.25,
        random_state=1,
        report=False,
        summaries=summaries,
        **LOCAL,
    )
    model = load_model(out / "model", expect=MAPDP)
    assert model.n_clusters_ == run["metrics"]["n_clusters"]
    assert model.alpha_ == run["metrics"]["alpha"]
    assert model.engine_ == "mapdp"
    assert model.model_metadata_["passes"] == run["metrics"]["passes"]
    assert model.schema_.kinds["shop"] == "categorical"
    label = zarr.open_array(str(out / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(out / "labels.zarr/log_density"))[:]
    hold = zarr.open_array(str(out / "labels.zarr/holdout"))[:].astype(bool)
    # eq. 3.4 of every record and eq. 3.5 of the held-out ones: the write-out's own numbers
    np.testing.assert_array_equal(model.score_samples(df), logd)
    np.testing.assert_array_equal(model.predict(df)[hold], label[hold])
    sizes = pd.read_parquet(out / "clusters.parquet")["size"].to_numpy()
    np.testing.assert_array_equal(model.cluster_sizes_, sizes)
