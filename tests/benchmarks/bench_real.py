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
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score as nmi
from sklearn.mixture import BayesianGaussianMixture

from pipeline.core import config
from pipeline.core.diagnose import RECORDS_PER_CLUSTER
from pipeline.estimators.mapdp import MAPDP
from tests.benchmarks.common import DATA, save, table, timed, uci_sets

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


def peers(X: pd.DataFrame, y: np.ndarray) -> dict[str, float]:
    """NMI and seconds of BayesianGaussianMixture(10) and KMeans told the number of classes
    on ``peer_matrix(X)``."""
    Z = peer_matrix(X)
    bgm, tb = timed(
        lambda: BayesianGaussianMixture(
            n_components=10,
            weight_concentration_prior_type="dirichlet_process",
            random_state=0,
            max_iter=500,
        ).fit_predict(Z)
    )
    k = len(np.unique(y))
    km, tk = timed(lambda: KMeans(k, n_init=10, random_state=0).fit_predict(Z))
    return {"BGMM NMI": nmi(y, bgm), "BGMM s": tb, "KMeans(k) NMI": nmi(y, km), "KMeans s": tk}


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
        rows.append(
            {
                "table": name_,
                "rows": len(X),
                "cols": X.shape[1],
                "classes": k,
                "MAPDP NMI": nmi(y, m.labels_),
                "K": m.n_clusters_,
                "MAPDP s": t,
                **peers(X, y),
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
    compare(r_tables(tmp_path), "R packages' real tables, defaults (issue 36)", "real_r_tables")


def r_tables(folder: Path) -> dict[str, tuple[pd.DataFrame, np.ndarray]]:
    """The tables ``r_tables.R`` writes into ``folder`` (``real_tables``)."""
    script = Path(__file__).with_name("r_tables.R")
    subprocess.run(["Rscript", str(script), str(folder)], check=True, capture_output=True)
    return real_tables(folder)


#: the prior scales ``test_prior_scale_by_objective`` fits at
SCALES = config.PRIOR_SCALES


@pytest.mark.filterwarnings("ignore")
def test_prior_scale_by_objective(tmp_path: Path) -> None:
    """Issue 57: the defaults' empirical-Bayes prior scale, chosen on the first
    ``config.SCALE_ROWS`` rows of the covariance structure's sample (``Schema.choose_scale``),
    against each fixed scale of ``config.PRIOR_SCALES`` and the same rule on the whole table
    (the scale whose fit, three restarts as by default, ends with the lowest objective; the
    default where the numeric columns have under ``config.EVIDENCE_PER_COL`` rows each). On
    every real table (the R packages' too where R has them) and Table 2's: NMI and K of each,
    the scales chosen, and each rule's summary over the real tables against BGMM(10) and KMeans
    told k. Seven fits per table."""
    tables = real_tables()
    if _r_tables_missing() is None:
        tables |= r_tables(tmp_path)
    table2 = {name: (X, np.asarray(y)) for name, (X, y) in uci_sets().items()}
    tables |= table2
    rows = []
    for name, (X, y) in tables.items():
        fits = {0.0: MAPDP(random_state=0).fit(X)}
        fits.update((s, MAPDP(random_state=0, prior_scale=s).fit(X)) for s in SCALES)
        d = len(fits[0.0].schema_.structure.get("columns", []))
        enough = d > 0 and len(X) >= config.EVIDENCE_PER_COL * d
        whole = min(SCALES, key=lambda s: fits[s].objective_) if enough else 0.0
        row: dict[str, Any] = {"table": name, "rows": len(X), "numeric": d}
        row.update({f"NMI {s or 'default'}": nmi(y, m.labels_) for s, m in fits.items()})
        row.update({f"K {s or 'default'}": m.n_clusters_ for s, m in fits.items()})
        row["default's scale"] = fits[0.0].schema_.structure.get("scale")
        row.update({"whole table's": whole, "NMI whole table's": nmi(y, fits[whole].labels_)})
        row.update(peers(X, y))
        rows.append(row)
    everything = pd.DataFrame(rows)
    # the issue's goals count the real tables; Table 2's are in the rows
    df = everything[~everything["table"].isin(table2)]
    summary = {}
    for rule in ("NMI default", "NMI 0.3", "NMI whole table's"):
        summary[rule] = {
            "mean": float(df[rule].mean()),
            ">= BGMM": int((df[rule] >= df["BGMM NMI"]).sum()),
            "below KMeans(k) by > 0.15": int((df[rule] < df["KMeans(k) NMI"] - 0.15).sum()),
            "tables": len(df),
        }
    print("\nPrior scale by the fitted objective (issue 57)\n" + table(rows))
    print("\n".join(f"{k}: {v}" for k, v in summary.items()))
    save("prior_scale_by_objective", {"rows": rows, "summary": summary})
