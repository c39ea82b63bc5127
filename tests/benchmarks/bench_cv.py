"""Issue 14 figures: hyperparameters chosen without labels (``MAPDP(tune="cv")``) against the
defaults, Raykov et al. 2016's Table 2 and scikit-learn's BayesianGaussianMixture, in one run; the
CV grid's fan-out efficiency on 2 workers; a 5 x 4 grid with 5 folds on 1,000,000 x 10 records end
to end. ``make bench`` runs it; never part of ``make test``."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.metrics import normalized_mutual_info_score as nmi
from sklearn.mixture import BayesianGaussianMixture

from pipeline.data.synthetic import sample_mixture
from pipeline.distributed.client import dask_client
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.search import GridSearch
from tests.benchmarks.common import save, table, uci_sets

PAPER_MAPDP = {"wine": 0.86, "iris": 0.76, "breast cancer": 0.71}
GOAL = {**PAPER_MAPDP, "digits": 0.74}

pytestmark = pytest.mark.bench


def data_sets() -> dict[str, tuple[pd.DataFrame, np.ndarray]]:
    """Table 2's wine, iris, breast cancer (683 x 9, ``DATA``), scikit-learn's digits with
    its constant pixels dropped, and scikit-learn's other breast cancer set (WDBC, 569 x 30)."""
    out = {name: (X, np.asarray(y)) for name, (X, y) in uci_sets().items()}
    Xd, yd = load_digits(return_X_y=True)
    Xd = Xd[:, Xd.std(axis=0) > 0]
    out["digits"] = (pd.DataFrame(Xd, columns=[f"p{j}" for j in range(Xd.shape[1])]), yd)
    Xb, yb = load_breast_cancer(return_X_y=True)
    out["breast cancer (WDBC)"] = (pd.DataFrame(Xb), yb)
    return out


def bgm_nmi(X: pd.DataFrame, y: np.ndarray, n: int) -> float:
    Xf = np.asarray(X, dtype=np.float64)
    Xs = (Xf - Xf.mean(0)) / Xf.std(0)
    bgm = BayesianGaussianMixture(
        n_components=n,
        weight_concentration_prior_type="dirichlet_process",
        random_state=0,
        max_iter=500,
    ).fit(Xs)
    return float(nmi(y, bgm.predict(Xs)))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_nmi_table() -> None:
    """The issue's table: defaults, tune="cv" (random_state=0, no per-data-set setting), Table 2,
    BGM(10) standardised (and 20 components and KMeans(10) for digits)."""
    rows = []
    with dask_client(n_workers=2, dashboard_address=None, quiet=True):
        for name, (X, y) in data_sets().items():
            t0 = time.perf_counter()
            d = MAPDP(random_state=0).fit(X)
            t1 = time.perf_counter()
            tuned = MAPDP(tune="cv", random_state=0).fit(X)
            t2 = time.perf_counter()
            row = {
                "data": name,
                "defaults NMI": nmi(y, d.labels_),
                "K": d.n_clusters_,
                "tune=cv NMI": nmi(y, tuned.labels_),
                "K tuned": tuned.n_clusters_,
                "goal": GOAL.get(name, np.nan),
                "Table 2": PAPER_MAPDP.get(name, np.nan),
                "BGM(10) NMI": bgm_nmi(X, y, 10),
                "chosen": ", ".join(f"{k}={v}" for k, v in sorted(tuned.best_params_.items())),
                "defaults s": t1 - t0,
                "tune s": t2 - t1,
            }
            if name == "digits":
                row["BGM(20) NMI"] = bgm_nmi(X, y, 20)
                row["KMeans(10) NMI"] = float(
                    nmi(y, KMeans(10, n_init=10, random_state=0).fit_predict(X))
                )
            rows.append(row)
            print(row, flush=True)
    title = "NMI, MAPDP defaults vs tune='cv' (Raykov et al. 2016, Table 2; BGM standardised)"
    print(f"\n{title}\n" + table(rows))
    save("cv_nmi", rows)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_grid_fanout_efficiency(tmp_path: Path) -> None:
    """A 4 x 3 grid x 5 folds (60 fits) on 2 workers: wall time against the sum of the fits'
    times (the ideal ratio is 2)."""
    X, _ = sample_mixture(6000, d=5, k=6, seed=0)
    grid = {"alpha": [0.1, 1.0, 10.0, 30.0], "prior_scale": [0.3, 0.1, 0.03]}
    with dask_client(n_workers=2, dashboard_address=None, quiet=True) as client:
        # the workers load the kernels before the clock starts
        GridSearch(MAPDP(n_restarts=1), {"alpha": [1.0]}, cv=2, client=client).fit(X[:200])
        gs = GridSearch(
            MAPDP(n_restarts=1, random_state=0), grid, cv=5, client=client, refit=False
        ).fit(X)
    total = float(np.sum(gs.cv_results_["total_fit_time"] + 5 * gs.cv_results_["mean_score_time"]))
    rec = {
        "fits": 60,
        "wall_s": gs.wall_time_,
        "sum_of_fits_s": total,
        "speed-up (ideal 2)": total / gs.wall_time_,
        "efficiency": total / gs.wall_time_ / 2,
    }
    print("\nCV grid fan-out on 2 workers\n" + table([rec]))
    save("cv_fanout", rec)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.timeout(7200)  # 100 fits of 800,000 records: about 17 min on 2 workers
def test_cv_million(tmp_path: Path) -> None:
    """``dpmm cv`` end to end on 1,000,000 x 10 records: a 5 x 4 grid (alpha x prior scale,
    full covariance) with 5 folds = 100 fits and the refit; time and peak memory (this process
    and its children, ru_maxrss)."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.cv import run_cv_flow

    X, y = sample_mixture(1_000_000, d=10, k=10, seed=0)
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(10)])
    df["truth"] = y
    path = tmp_path / "million.parquet"
    df.to_parquet(path, index=False)
    del df, X
    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=600):
        run = run_cv_flow(
            input=str(path),
            out=str(tmp_path / "out"),
            alphas=[0.1, 0.3, 1.0, 3.0, 10.0],
            scales=[0.5, 0.2, 0.1, 0.03],
            families=["gaussian"],
            n_folds=5,
            label_column="truth",
            data_dir=str(tmp_path / "d"),
            n_workers=2,
            dashboard_address=None,
            progress=True,
        )
    seconds = time.perf_counter() - t0
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    rec = {
        "records": 1_000_000,
        "cells": 20,
        "folds": 5,
        "end_to_end_s": seconds,
        "fits_wall_s": run["timing"]["fits_wall"],
        "sum_of_fits_s": run["timing"]["fits_sum"],
        "peak_rss_MB": peak / 1024,
        "chosen": run["chosen"],
        "nmi": run["metrics"].get("nmi"),
        "cpus": os.cpu_count(),
    }
    print("\ndpmm cv on 1,000,000 x 10\n" + table([rec]))
    save("cv_million", rec)
