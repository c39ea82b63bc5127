"""``OUT/report.html`` of ``dpmm run`` as a user's browser shows it (headless Chromium, a 1280 px
window: ``tests/browser.py``): for a run of 10 features (with categorical columns) and one of 60,
with a label column and stage 2's tree, the page fits the window without horizontal scrolling,
every picture it names exists and loads, and its numbers are run.json's rounded for reading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cluster import cluster
from tests.browser import Browser, check_page

pytestmark = pytest.mark.usefixtures("prefect_harness")


LOCAL = {"processes": False, "n_workers": 1, "dashboard_address": None, "progress": False}


def write_input(path: Path, d: int, categorical: bool, n: int = 1500, k: int = 6) -> np.ndarray:
    """``n`` records of ``d`` Gaussian features from ``k`` separated clusters, a ``truth``
    column, and with ``categorical`` two categorical columns that follow the clusters."""
    rng = np.random.default_rng(d)
    y = rng.integers(0, k, size=n)
    X = rng.normal(scale=5.0, size=(k, d))[y] + rng.normal(size=(n, d))
    df = pd.DataFrame(X, columns=[f"feature_{j}" for j in range(d)])
    if categorical:
        df["colour"] = np.array(["red", "green", "blue", "grey"])[y % 4]
        df["grade"] = np.array(["low", "mid", "high"])[(y + (rng.random(n) < 0.2)) % 3]
    df["truth"] = y
    df.to_parquet(path, index=False)
    return y


@pytest.mark.parametrize("d", [10, 60])
def test_report_fits_a_1280_px_window_with_every_picture(
    tmp_path: Path, d: int, browser: Browser
) -> None:
    write_input(tmp_path / "in.parquet", d, categorical=d == 10)
    out = tmp_path / "out"
    run = cluster(
        str(tmp_path / "in.parquet"),
        str(out),
        chunk_rows=500,
        holdout=0.1,
        label_column="truth",
        summaries=30,
        random_state=0,
        **LOCAL,
    )
    page = out / "report.html"
    measured = check_page(page, browser)
    shown = {i["src"] for i in measured["images"]}
    expected = {"profile.png", "dendrogram.png", "contingency.png", "objective.png", "sizes.png"}
    assert expected <= shown
    assert ("categories.png" in shown) == (d == 10)
    text = page.read_text()
    saved = json.loads((out / "run.json").read_text())
    m = saved["metrics"]
    assert m["n_clusters"] == run["metrics"]["n_clusters"]
    # the numbers a user reads are run.json's, rounded: 4 significant digits for the density
    held = m["heldout_mean_log_density"]
    assert f"{held:.4g}" in text and repr(held) not in text
    assert f"NMI {m['nmi']:.3f}, ARI {m['ari']:.3f}" in text
    # run.json keeps full precision, and times the report
    assert held == run["metrics"]["heldout_mean_log_density"]
    assert saved["timing"]["report"] > 0
    # the profile is ordered by the tree: every final cluster once
    order = saved["stage2_info"]["cluster_order"]
    assert sorted(order) == list(range(m["n_clusters"]))
    assert (out / "report.md").read_text().count("![") == len(measured["images"])
