"""The run report (``pipeline.ops.report``) and its page layout (``pipeline.ops.page``) on
synthetic runs: rounding, the degenerate-fit warning box, the profile of 100 clusters x 50
features in a 1280 px browser window, the contingency table of the write-out."""

from __future__ import annotations

import html
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pipeline.core.diagnose import degenerate_fit, sequence_fit
from pipeline.data.labels import WriteResult
from pipeline.distributed.writeout import summarize_written
from pipeline.families.schema import Schema, cluster_table
from pipeline.ops import profile
from pipeline.ops import report as rep
from pipeline.ops.hmm import hmm_page
from pipeline.ops.page import Page, Picture, fmt
from tests.browser import Browser, check_page, image_sources


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-17.18765752969187, "-17.19"),
        (328123.7, "328,124"),
        (0.938912, "0.9389"),
        (1234.5, "1,234"),  # from a thousand up: no exponent, separators
        (0.000123456, "1.235e-04"),
        (0.0, "0"),
        (42, "42"),
        (1234567, "1,234,567"),
        (np.int64(7), "7"),
        (float("nan"), "\u2013"),
        (None, "\u2013"),
        (True, "yes"),
        ("text", "text"),
    ],
)
def test_fmt_rounds_for_reading(value: Any, text: str) -> None:
    assert fmt(value) == text


def test_page_writes_the_same_content_as_html_and_markdown(tmp_path: Path) -> None:
    page = Page("a <report>", [("density", -17.18765752969187), ("n", 12345)], ["be <careful>"])
    sec = page.section("pictures")
    sec.text("a & b").pictures(Picture("a.png"), Picture("b.png", wide=True))
    sec.table(pd.DataFrame({"k": [1, 2], "v": [0.123456, 98765.4]}), "t", folded=True)
    assert page.write(tmp_path) == ["report.html", "report.md"]
    text = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert "<h1>a &lt;report&gt;</h1>" in text and "be &lt;careful&gt;" in text
    assert 'class="warn"' in text and "> **Warning:** be <careful>" in md
    assert "-17.19" in text and "-17.19" in md and "12,345" in text
    assert "0.1235" in text and "98,765" in text
    assert "| 1 | 0.1235 |" in md and "| 2 | 98,765 |" in md
    assert image_sources(tmp_path / "report.html") == page.pictures() == ["a.png", "b.png"]
    assert md.count("![") == 2
    assert "<details>" in text


def test_contingency_of_the_write_out_adds_the_chunks() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, size=300)
    z = (y + (rng.random(300) < 0.2)) % 5
    results = []
    for c, (a, b) in enumerate([(0, 100), (100, 220), (220, 300)]):
        both, counts = np.unique(np.vstack([y[a:b], z[a:b]]), axis=1, return_counts=True)
        pairs = np.vstack([both, counts]).astype(np.int64)
        results.append(
            WriteResult(c, 0.0, 0, 0.0, b - a, 0, np.zeros((0, 2)), np.zeros(0, np.int64), pairs)
        )
    info: Any = SimpleNamespace(label_column="y")
    written = summarize_written(results[::-1], info, 0.0)
    assert written.contingency is not None
    C = rep.contingency_frame(written.contingency)
    ref = pd.crosstab(y, z)
    np.testing.assert_array_equal(C.to_numpy(), ref.to_numpy())
    assert list(C.index) == list(ref.index) and list(C.columns) == list(ref.columns)


def synthetic_run(K: int, d: int, n: int = 20_000, seed: int = 0) -> tuple[dict, pd.DataFrame, Any]:
    """A run of K clusters (sizes Zipf-like) over d Gaussian features and two categorical
    columns, as ``pipeline.ops.run.finish`` hands it to the report."""
    rng = np.random.default_rng(seed)
    y = np.minimum(rng.zipf(1.4, size=n) - 1, K - 1)
    y[:K] = np.arange(K)  # every cluster holds a record
    X = rng.normal(scale=3, size=(K, d))[y] + rng.normal(size=(n, d))
    df = pd.DataFrame(X, columns=[f"measurement_{j}" for j in range(d)])
    df["colour"] = pd.Categorical(np.array(list("abcdefgh"))[(y + rng.integers(0, 2, n)) % 8])
    df["region"] = pd.Categorical(np.array(["north", "south", "east", "west"])[y % 4])
    schema = Schema.infer(df, "auto", from_frame=True)
    Xe = schema.encode(df, fitting=True)
    fam = schema.build_family(Xe)
    Xa = fam.arrange(Xe)
    stats = fam.stats_of(Xa, y.astype(np.int64), K)
    pick = rng.choice(n, min(n, 2000), replace=False)
    both, counts = np.unique(np.vstack([y, y]), axis=1, return_counts=True)
    data = profile.RunData(
        history=[{"pass": 1, "objective": 2e5}, {"pass": 2, "objective": 1.9e5}],
        stats=stats,
        family=fam,
        schema=schema,
        mean=Xa.mean(axis=0),
        cov=np.cov(Xa.T),
        plot_X=Xa[pick],
        plot_labels=y[pick],
        contingency=np.vstack([both, counts]).astype(np.int64),
    )
    run = {
        "input": "synthetic.parquet",
        "n_rows": n,
        "n_train": n,
        "n_cols": df.shape[1],
        "kinds": schema.kinds,
        "parameters": {"engine": "mapdp", "alpha": "learn", "label_column": "truth"},
        "metrics": {
            "n_clusters": K,
            "passes": 2,
            "converged": True,
            "objective": 1.9e5,
            "alpha": 3.2,
            "heldout_mean_log_density": -17.18765752969187,
            "n_heldout": 1000,
            "train_mean_log_density": -17.0,
            "nmi": 0.91234,
            "ari": 0.85678,
        },
        "timing": {"total": 12.0},
        "stage2_info": {
            "cluster_order": [int(k) for k in rng.permutation(K)],
            "n_summaries": 2 * K,
            "n_clusters": K,
        },
    }
    return run, cluster_table(stats, 1.0, fam, schema), data


def test_a_hundred_clusters_of_fifty_features_fit_the_window(
    tmp_path: Path, browser: Browser
) -> None:
    run, clusters, data = synthetic_run(K=100, d=50)
    written = rep.write_report(tmp_path, run, clusters, data)
    for name in ("profile.png", "categories.png", "contingency.png", "report.html"):
        assert name in written and (tmp_path / name).stat().st_size > 1000
    check_page(tmp_path / "report.html", browser)
    text = html.unescape((tmp_path / "report.html").read_text())
    sizes = data.stats[:, 0]
    rest = np.argsort(-sizes, kind="stable")[profile.PROFILE_CLUSTERS :]
    share = sizes[rest].sum() / sizes.sum()
    assert f"The {len(rest)} smallest clusters ({share:.1%} of the records) are pooled" in text
    assert "-17.19" in text and "-17.18765752969187" not in text
    assert "NMI 0.912, ARI 0.857" in text
    assert "Warning" not in text


def test_the_profile_follows_the_tree_and_keeps_the_largest() -> None:
    sizes = np.array([5.0, 50.0, 1.0, 30.0, 20.0])
    assert profile.cluster_order(sizes, None) == [1, 3, 4, 0, 2]
    assert profile.cluster_order(sizes, [2, 4, 0, 1, 3]) == [2, 4, 0, 1, 3]
    big = np.arange(1.0, profile.PROFILE_CLUSTERS + 6)  # cluster k holds k + 1 records
    order = list(range(len(big)))[::-1]
    shown = profile.cluster_order(big, order)
    assert shown == order[: profile.PROFILE_CLUSTERS]  # the 5 smallest (ids 0..4) left out


@pytest.mark.parametrize("K", [1, 30])
def test_a_degenerate_fit_gets_a_warning_box(tmp_path: Path, K: int) -> None:
    run, clusters, data = synthetic_run(K=K, d=3, n=200)
    rep.write_report(tmp_path, run, clusters, data)
    text = (tmp_path / "report.html").read_text()
    rule = degenerate_fit(K, 200)
    assert rule is not None
    assert f'<div class="warn"><b>Warning:</b> {html.escape(rule)}</div>' in text
    assert f"> **Warning:** {rule}" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(("w", "rho"), [(0.039, 0.924), (1.0, None)])
def test_an_hmm_report_says_why_it_has_one_state(w: float, rho: float | None) -> None:
    """``dpmm hmm``'s report: one state after tempering gets ``sequence_fit``'s sentence (the
    trend, not alpha), from run.json's ``temper``; untempered, ``degenerate_fit``'s."""
    run = {
        "input": "levels.csv",
        "n_rows": 203,
        "n_train": 203,
        "parameters": {"alpha": 1.0, "gamma": 2.0},
        "metrics": {"n_sequences": 1, "n_heldout_sequences": 0, "passes": 2, "converged": True},
        "timing": {"total": 1.0},
        "temper": {"w": w, "rho": rho},
    }
    page = hmm_page(run, np.ones((1, 1)), np.array([203.0]))
    assert page.warnings == [sequence_fit(1, 203, w, rho)]
    assert ("A trend is not a state" in page.warnings[0]) == (w < 1.0)
    if w == 1.0:
        assert page.warnings == [degenerate_fit(1, 203, "time steps")]


@pytest.mark.parametrize("d", [5, rep.EIGH_MAX_COLS + 36])
def test_the_projection_axes_are_the_covariances_leading_eigenvectors(d: int) -> None:
    """``top_axes``: a full decomposition up to ``EIGH_MAX_COLS`` columns, Lanczos above; the
    same axes (up to sign) as ``np.linalg.eigh`` to 1e-8."""
    rng = np.random.default_rng(d)
    X = rng.normal(size=(300, d)) * np.linspace(3.0, 0.5, d)
    cov = np.cov(X.T)
    w, V = np.linalg.eigh(cov)
    want = V[:, np.argsort(w)[::-1][:2]]
    got = rep.top_axes(cov, 2)
    assert got.shape == (d, 2)
    np.testing.assert_allclose(np.abs(np.sum(got * want, axis=0)), 1.0, atol=1e-8)
