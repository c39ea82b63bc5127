"""Issue 36: the defaults on every real clustering table of ``DATA / "real"``, ours against
BayesianGaussianMixture(10) and KMeans told the true number of classes, NMI and seconds, in the
same run. ``make bench`` runs it; never part of ``make test``.

The peers refuse missing values and text: they get the standardised one-hot columns with each
missing cell set to its column's most frequent value (what a user of them would do); MAPDP gets
the table as read. Each MAPDP fit is timed after a short warm-up fit (two iterations, one start)
of the same table (numba's compilation is a one-off per family set, measured by
``bench_compile.py``).
"""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score as nmi
from sklearn.mixture import BayesianGaussianMixture

from pipeline.core.diagnose import RECORDS_PER_CLUSTER
from pipeline.estimators.mapdp import MAPDP
from tests.benchmarks.common import DATA, save, table, timed

pytestmark = pytest.mark.bench

REAL = DATA / "real"


def real_tables(folder: Path = REAL) -> dict[str, tuple[pd.DataFrame, np.ndarray]]:
    """Every ``clust_*.csv`` of ``folder``: features (every ``label*`` column and vowel's
    ``speaker`` dropped, as the shared folder's README says) and the class labels."""
    out = {}
    for path in sorted(folder.glob("clust_*.csv")):
        df = pd.read_csv(path)
        y = df["label"].astype(str).to_numpy()
        drop = [c for c in df.columns if c.startswith("label") or c == "speaker"]
        out[path.stem.removeprefix("clust_")] = (df.drop(columns=drop), y)
    return out


def peer_matrix(X: pd.DataFrame) -> np.ndarray:
    """Standardised one-hot columns, missing cells at the column's mode."""
    Z = pd.get_dummies(X.fillna(X.mode().iloc[0]), dtype=float).to_numpy()
    sd = Z.std(axis=0)
    return (Z - Z.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def compare(tables: dict[str, tuple[pd.DataFrame, np.ndarray]], title: str, name: str) -> None:
    """Ours and the two peers on each table, in the same run; prints and saves the table and
    the summary the issue asks for (means, wins over BGMM, degenerate K, slowest fit)."""
    rows = []
    for name_, (X, y) in tables.items():
        k = len(np.unique(y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the whole table, so that what the fit compiles is compiled here (the first 50
            # rows made no covariance choice: glass's timed fit compiled its diagonal family)
            MAPDP(random_state=0, n_restarts=1, max_iter=2).fit(X)
            m, t = timed(lambda X=X: MAPDP(random_state=0).fit(X))
        Z = peer_matrix(X)
        bgm, tb = timed(
            lambda Z=Z: BayesianGaussianMixture(
                n_components=10,
                weight_concentration_prior_type="dirichlet_process",
                random_state=0,
                max_iter=500,
            ).fit_predict(Z)
        )
        km, tk = timed(lambda Z=Z, k=k: KMeans(k, n_init=10, random_state=0).fit_predict(Z))
        rows.append(
            {
                "table": name_,
                "rows": len(X),
                "cols": X.shape[1],
                "classes": k,
                "MAPDP NMI": nmi(y, m.labels_),
                "K": m.n_clusters_,
                "MAPDP s": t,
                "BGMM NMI": nmi(y, bgm),
                "BGMM s": tb,
                "KMeans(k) NMI": nmi(y, km),
                "KMeans s": tk,
                "degenerate": m.n_clusters_ <= 1 or m.n_clusters_ * RECORDS_PER_CLUSTER > len(X),
            }
        )
    df = pd.DataFrame(rows)
    summary = {
        "mean MAPDP NMI": float(df["MAPDP NMI"].mean()),
        "mean BGMM NMI": float(df["BGMM NMI"].mean()),
        "mean KMeans(k) NMI": float(df["KMeans(k) NMI"].mean()),
        "MAPDP >= BGMM on": f"{int((df['MAPDP NMI'] >= df['BGMM NMI']).sum())} of {len(df)}",
        "slowest MAPDP s": float(df["MAPDP s"].max()),
        "degenerate K": int(df["degenerate"].sum()),
    }
    print(f"\n{title}\n" + table(rows))
    print(
        "\n".join(
            f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items()
        )
    )
    save(name, {"rows": rows, "summary": summary})


@pytest.mark.filterwarnings("ignore")
def test_real_tables() -> None:
    compare(real_tables(), "Real tables, defaults (issue 36)", "real_tables")


R_PACKAGES = "apt-get install r-cran-mlbench r-cran-mclust r-cran-mass r-cran-kernlab"


def _r_tables_missing() -> str | None:
    """Why the R packages' tables cannot be written here, or None."""
    if shutil.which("Rscript") is None:
        return "Rscript is not installed"
    libs = "library(mlbench); library(mclust); library(MASS); library(kernlab)"
    probe = subprocess.run(["Rscript", "-e", libs], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "an R package is missing (Debian: " + R_PACKAGES + ")"
    return None


@pytest.mark.filterwarnings("ignore")
def test_r_package_tables(tmp_path: Path) -> None:
    """14 more labelled real tables written by ``r_tables.R`` from mlbench, mclust, MASS and
    kernlab: ionosphere with its constant column, soybean and breast cancer with integer codes
    and holes, Pima with holes, sonar, spam and satellite wide, zoo binary, ... They found two
    causes (integer columns read as floats because of their holes; outlier singletons raising
    the learned concentration), fixed for every table, not per table."""
    why = _r_tables_missing()
    if why is not None:
        pytest.skip(why)
    script = Path(__file__).with_name("r_tables.R")
    subprocess.run(["Rscript", str(script), str(tmp_path)], check=True, capture_output=True)
    compare(real_tables(tmp_path), "R packages' real tables, defaults (issue 36)", "real_r_tables")
